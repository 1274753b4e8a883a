"""The EAGLE drafter's bookkeeping: tree attention, batching, and agreement with training."""

from __future__ import annotations

import pytest
import torch

from echo_core.tolerance import float_tolerance
from echo_server.drafting.base import ExpandRequest
from echo_server.drafting.eagle_drafter import EagleDrafter, default_draft_dtype, tree_mask
from echo_server.drafting.testing import HIDDEN, VOCAB, feedback, tiny_config, tiny_head
from echo_server.drafting.unroll import unrolled_features
from echo_server.model.linear import packing_available

REDUCTION = max(2 * HIDDEN, tiny_config().intermediate_size)
"""The tiny head's longest dot product (the fuse projection, 2H -> H): 64."""


def _expand(
    drafter: EagleDrafter, paths: list[list[int]], topk: int = 3, requests: list[int] | None = None
) -> list[dict[int, float]]:
    m = len(paths)
    req = requests or [0] * m
    out = drafter.expand(
        ExpandRequest(
            request=torch.tensor(req, dtype=torch.int64),
            node=torch.arange(m, dtype=torch.int64) - 1,
            path=paths,
            topk=torch.full((m,), topk, dtype=torch.int64),
        )
    )
    per_node: list[dict[int, float]] = [{} for _ in range(m)]
    for s, t, lp in zip(out.source.tolist(), out.token.tolist(), out.logprob.tolist(), strict=True):
        per_node[s][t] = lp
    return per_node


def _assert_logprobs_close(
    got: dict[int, float], want: torch.Tensor, dtype: torch.dtype, depth: int
) -> None:
    """Drafted log-probs vs ``want`` (best first) up to rounding through ``depth`` head passes
    in ``dtype`` (:mod:`echo_core.tolerance`)."""
    atol = float_tolerance(dtype, REDUCTION, depth, scale=float(want.abs().max()))
    torch.testing.assert_close(torch.tensor(list(got.values())), want, atol=atol, rtol=0)


def _assert_same(got: dict[int, float], want: dict[int, float]) -> None:
    assert got.keys() == want.keys()
    torch.testing.assert_close(torch.tensor(list(got.values())), torch.tensor(list(want.values())))


def _prefilled(seed: int = 1, n: int = 7) -> tuple[EagleDrafter, list[int], torch.Tensor]:
    torch.manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n + 1,)).tolist()
    feats = torch.randn(n, HIDDEN)
    drafter = EagleDrafter(tiny_head())
    drafter.observe(feedback([("r", tokens[:n], feats, 0, tokens[n])]))
    drafter.begin_step([tokens], ["r"])
    return drafter, tokens, feats


def test_tree_mask_sees_context_ancestors_and_self() -> None:
    mask = tree_mask(2, 3, [(0,), (0, 2), ()])
    assert mask.int().tolist() == [
        [1, 1, 1, 0, 0, 1, 0, 0],
        [1, 1, 1, 0, 1, 0, 1, 0],
        [1, 1, 0, 0, 0, 0, 0, 1],
    ]


def test_root_children_are_best_first_and_normalised_over_the_draft_vocab() -> None:
    drafter, _, _ = _prefilled()
    (children,) = _expand(drafter, [[]], topk=20)
    probs = list(children.values())
    assert probs == sorted(probs, reverse=True)
    # a float32 sum of 20 probabilities
    total = float(torch.tensor(probs).exp().sum())
    assert total == pytest.approx(1.0, abs=float_tolerance(torch.float32, len(probs)))
    assert all(t % 2 == 1 for t in children)  # draft ids map back to target ids


def test_node_in_a_tree_predicts_what_its_path_predicts_as_a_chain() -> None:
    tree, _, _ = _prefilled()
    (root,) = _expand(tree, [[]])
    a, b, c = list(root)
    depth1 = _expand(tree, [[a], [b], [c]], topk=2)
    a1, a2 = list(depth1[0])
    b1 = next(iter(depth1[1]))
    depth2 = _expand(tree, [[b, b1], [a, a2], [a, a1]], topk=2)
    x = next(iter(depth2[1]))
    (deep,) = _expand(tree, [[a, a2, x]], topk=4)

    chain, _, _ = _prefilled()
    _expand(chain, [[]])
    _expand(chain, [[a]])
    (alone,) = _expand(chain, [[a, a2]], topk=2)
    (deep_alone,) = _expand(chain, [[a, a2, x]], topk=4)
    _assert_same(depth2[1], alone)
    _assert_same(deep, deep_alone)


def test_batched_requests_match_separate_runs() -> None:
    torch.manual_seed(3)
    toks = [torch.randint(0, VOCAB, (n + 1,)).tolist() for n in (4, 9)]
    feats = [torch.randn(n, HIDDEN) for n in (4, 9)]
    both = EagleDrafter(tiny_head())
    both.observe(feedback([(f"r{i}", toks[i][:-1], feats[i], 0, toks[i][-1]) for i in range(2)]))
    both.begin_step(toks, ["r0", "r1"])
    roots = _expand(both, [[], []], requests=[0, 1])
    paths = [[next(iter(roots[0]))], [next(iter(roots[1]))]]
    batched = _expand(both, paths, requests=[0, 1])
    for i in range(2):
        one = EagleDrafter(tiny_head())
        one.observe(feedback([(f"r{i}", toks[i][:-1], feats[i], 0, toks[i][-1])]))
        one.begin_step([toks[i]], [f"r{i}"])
        _assert_same(_expand(one, [[]])[0], roots[i])
        _assert_same(_expand(one, [paths[i]])[0], batched[i])


def test_incremental_observe_equals_one_prefill() -> None:
    torch.manual_seed(4)
    toks = torch.randint(0, VOCAB, (9,)).tolist()
    feats = torch.randn(8, HIDDEN)
    once = EagleDrafter(tiny_head())
    once.observe(feedback([("r", toks[:8], feats, 0, toks[8])]))
    steps = EagleDrafter(tiny_head())
    steps.observe(feedback([("r", toks[:5], feats[:5], 0, toks[5])]))
    steps.observe(feedback([("r", toks[5:8], feats[5:8], 5, toks[8])]))
    for d in (once, steps):
        d.begin_step([toks], ["r"])
    _assert_same(_expand(once, [[]], topk=5)[0], _expand(steps, [[]], topk=5)[0])


def test_drafting_reproduces_the_training_unroll() -> None:
    """Row t of training pass k is the depth-(k-1) node after committing x_0..x_{t+1}."""
    head = tiny_head()
    torch.manual_seed(5)
    n = 10
    tokens = torch.randint(0, VOCAB, (n + 1,))
    feats = torch.randn(n, HIDDEN)
    with torch.no_grad():
        passes = unrolled_features(head, feats[None], tokens[None], depths=3)
    t = 5
    drafter = EagleDrafter(head)
    drafter.observe(
        feedback([("r", tokens[: t + 1].tolist(), feats[: t + 1], 0, int(tokens[t + 1]))])
    )
    drafter.begin_step([tokens[: t + 2].tolist()], ["r"])
    path = tokens[t + 2 : t + 4].tolist()
    for k in range(3):
        (got,) = _expand(drafter, [path[:k]], topk=20)
        want = torch.log_softmax(head.logits(passes[k][0, t]), dim=-1)
        ids = head.target_ids(torch.argsort(want, descending=True)).tolist()
        assert list(got) == ids
        _assert_logprobs_close(got, want.sort(descending=True).values, torch.float32, k + 1)


def test_unknown_and_released_requests_get_no_proposals() -> None:
    drafter, tokens, _ = _prefilled()
    drafter.release("r")
    drafter.begin_step([tokens], ["r"])
    assert _expand(drafter, [[]]) == [{}]


def test_bfloat16_drafting_stays_close_to_float32() -> None:
    torch.manual_seed(6)
    toks = torch.randint(0, VOCAB, (9,)).tolist()
    feats = torch.randn(8, HIDDEN)
    got = []
    for dtype in (torch.float32, torch.bfloat16):
        drafter = EagleDrafter(tiny_head(), dtype)
        drafter.observe(feedback([("r", toks[:8], feats, 0, toks[8])]))
        drafter.begin_step([toks], ["r"])
        (root,) = _expand(drafter, [[]], topk=20)
        (child,) = _expand(drafter, [[next(iter(root))]], topk=20)
        got.append((root, child))
    for depth, (exact, approx) in enumerate(zip(got[0], got[1], strict=True), start=1):
        # bf16 rounding through the head: 0.65-0.70 for |logprob| up to ~22, observed ~0.09
        scale = max(abs(lp) for lp in exact.values())
        atol = float_tolerance(torch.bfloat16, REDUCTION, depth, scale=scale)
        for token, lp in exact.items():
            assert approx[token] == pytest.approx(lp, abs=atol)


def test_draft_dtype_follows_the_machine_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 where the CPU computes it natively (AMX or AVX512-BF16) and it packs, else
    packed float32, else bfloat16; ``ECHO_DRAFT_DTYPE`` overrides."""
    monkeypatch.delenv("ECHO_DRAFT_DTYPE", raising=False)
    f32 = packing_available(torch.zeros(1, 1))
    bf16 = packing_available(torch.zeros(1, 1, dtype=torch.bfloat16), allow_bf16=True)
    fallback = torch.float32 if f32 else torch.bfloat16
    for amx, avx512_bf16 in ((False, False), (True, False), (False, True)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        native = amx or avx512_bf16
        assert default_draft_dtype() == (torch.bfloat16 if native and bf16 else fallback)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        monkeypatch.setenv("ECHO_DRAFT_DTYPE", name)
        assert default_draft_dtype() == dtype
    monkeypatch.setenv("ECHO_DRAFT_DTYPE", "fp8")
    with pytest.raises(ValueError, match="ECHO_DRAFT_DTYPE"):
        default_draft_dtype()


def test_aux_head_drafting_reproduces_the_training_unroll() -> None:
    """With aux layers the committed rows (and so depth 1) read the target's residual streams;
    the drafter must feed them exactly as training's pass 1 does."""
    head = tiny_head(aux_layers=(1, 3))
    torch.manual_seed(7)
    n, t = 10, 5
    tokens = torch.randint(0, VOCAB, (n + 1,))
    feats = torch.randn(n, HIDDEN)
    aux = torch.randn(n, 2 * HIDDEN)
    with torch.no_grad():
        passes = unrolled_features(head, feats[None], tokens[None], 3, aux[None])
        plain = unrolled_features(head, feats[None], tokens[None], 1)
    assert not torch.allclose(passes[0], plain[0])  # the aux term matters
    drafter = EagleDrafter(head)
    assert drafter.aux_layers == (1, 3)
    rows = (aux[: t + 1, :HIDDEN], aux[: t + 1, HIDDEN:])
    drafter.observe(
        feedback([("r", tokens[: t + 1].tolist(), feats[: t + 1], 0, int(tokens[t + 1]))], rows)
    )
    drafter.begin_step([tokens[: t + 2].tolist()], ["r"])
    path = tokens[t + 2 : t + 4].tolist()
    for k in range(3):
        (got,) = _expand(drafter, [path[:k]], topk=20)
        want = torch.log_softmax(head.logits(passes[k][0, t]), dim=-1)
        _assert_logprobs_close(got, want.sort(descending=True).values, torch.float32, k + 1)


def test_aux_head_refuses_feedback_without_its_layers() -> None:
    drafter = EagleDrafter(tiny_head(aux_layers=(2,)))
    with pytest.raises(ValueError, match="aux features"):
        drafter.observe(feedback([("r", [1, 2], torch.randn(2, HIDDEN), 0, 3)]))


def test_zero_initialised_aux_projection_starts_as_the_single_feature_head() -> None:
    from echo_server.drafting.eagle_head import EagleHead
    from echo_server.drafting.testing import tiny_config

    torch.manual_seed(8)
    single = tiny_head()
    multi = EagleHead(tiny_config((0,)))
    multi.load_state_dict({**single.state_dict(), "aux_fc.weight": torch.zeros(HIDDEN, HIDDEN)})
    multi.attach_target(single.embed, single.embed)
    feats, toks = torch.randn(6, HIDDEN), torch.randint(0, VOCAB, (6,))
    with torch.no_grad():
        torch.testing.assert_close(
            multi.fuse(feats, toks, torch.randn(6, HIDDEN)), single.fuse(feats, toks)
        )


def _decode_chunks(seed: int) -> tuple[list[int], torch.Tensor]:
    torch.manual_seed(seed)
    return torch.randint(0, VOCAB, (13,)).tolist(), torch.randn(12, HIDDEN)


def _count_fuse(drafter: EagleDrafter) -> list[int]:
    calls = [0]
    fuse = drafter.head.fuse

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls[0] += 1
        return fuse(*args, **kwargs)  # type: ignore[arg-type]

    drafter.head.fuse = counted  # type: ignore[method-assign]
    return calls


def test_queued_rows_draft_what_rows_run_every_step_draft() -> None:
    """Deferred catch-up is the same causal computation: a request drafted after three
    undrafted steps proposes what it would had every step run the head."""
    toks, feats = _decode_chunks(6)
    eager, lazy = EagleDrafter(tiny_head()), EagleDrafter(tiny_head())
    for d in (eager, lazy):
        d.observe(feedback([("r", toks[:6], feats[:6], 0, toks[6])]))
    for lo, hi in ((6, 8), (8, 9), (9, 12)):
        for d in (eager, lazy):
            d.observe(feedback([("r", toks[lo:hi], feats[lo:hi], lo, toks[hi])]))
        eager.begin_step([toks[: hi + 1]], ["r"])
        _expand(eager, [[]], topk=5)  # eager drafts every step, lazy never
    for d in (eager, lazy):
        d.begin_step([toks], ["r"])
    got, want = _expand(lazy, [[]], topk=5)[0], _expand(eager, [[]], topk=5)[0]
    assert got.keys() == want.keys()
    atol = float_tolerance(torch.float32, REDUCTION, 2, scale=max(abs(v) for v in want.values()))
    torch.testing.assert_close(
        torch.tensor(list(got.values())), torch.tensor(list(want.values())), atol=atol, rtol=0
    )
    child = next(iter(want))
    assert _expand(lazy, [[child]], topk=3)[0].keys() == _expand(eager, [[child]], topk=3)[0].keys()


def test_a_step_that_drafts_nothing_costs_the_head_nothing() -> None:
    toks, feats = _decode_chunks(7)
    drafter = EagleDrafter(tiny_head())
    calls = _count_fuse(drafter)
    drafter.observe(feedback([("r", toks[:6], feats[:6], 0, toks[6])]))
    assert calls[0] == 0  # the prompt is queued too: a request never drafted never runs it
    for lo in range(6, 11):
        drafter.observe(feedback([("r", toks[lo : lo + 1], feats[lo : lo + 1], lo, toks[lo + 1])]))
        drafter.begin_step([toks[: lo + 2]], ["r"])
    assert calls[0] == 0  # five plain steps: queued, never run
    assert drafter._ctx["r"].pending_rows == 11
    _expand(drafter, [[]])
    assert calls[0] == 1  # one batched pass over the prompt and the five queued rows
    drafter.release("r")
    assert not drafter._ctx


def test_a_long_queue_runs_without_waiting_for_a_draft() -> None:
    toks, feats = _decode_chunks(8)
    drafter = EagleDrafter(tiny_head(), max_pending=4)
    calls = _count_fuse(drafter)
    drafter.observe(feedback([("r", toks[:3], feats[:3], 0, toks[3])]))
    assert calls[0] == 0  # the prompt waits too
    assert drafter._ctx["r"].pending_rows == 3
    want = {3: (1, 0), 5: (1, 2), 7: (2, 0)}  # step at lo -> (head passes, rows still queued)
    for lo in (3, 5, 7):
        drafter.observe(feedback([("r", toks[lo : lo + 2], feats[lo : lo + 2], lo, toks[lo + 2])]))
        assert (calls[0], drafter._ctx["r"].pending_rows) == want[lo]  # 5 then 4 rows: run
    with pytest.raises(ValueError, match="max_pending"):
        EagleDrafter(tiny_head(), max_pending=0)


def test_a_prompt_window_keeps_the_last_rows_of_a_prompt_the_head_has_not_run() -> None:
    """With ``prompt_window=4`` a 10-row prompt queued in two chunks keeps rows 6-9: the head
    then drafts exactly what a drafter that only ever saw rows 6-9 drafts. Once the head has
    run, later rows are queued whole (the window is for prompts only)."""
    toks, feats = _decode_chunks(9)
    windowed, tail = EagleDrafter(tiny_head(), prompt_window=4), EagleDrafter(tiny_head())
    windowed.observe(feedback([("r", toks[:3], feats[:3], 0, toks[3])]))
    windowed.observe(feedback([("r", toks[3:10], feats[3:10], 3, toks[10])]))
    assert windowed._ctx["r"].pending_rows == 4
    tail.observe(feedback([("r", toks[6:10], feats[6:10], 6, toks[10])]))
    for d in (windowed, tail):
        d.begin_step([toks[:11]], ["r"])
    _assert_same(_expand(windowed, [[]], topk=5)[0], _expand(tail, [[]], topk=5)[0])
    windowed.observe(feedback([("r", toks[10:12], feats[10:12], 10, toks[12])]))
    assert windowed._ctx["r"].pending_rows == 2
    with pytest.raises(ValueError, match="prompt_window"):
        EagleDrafter(tiny_head(), prompt_window=0)
