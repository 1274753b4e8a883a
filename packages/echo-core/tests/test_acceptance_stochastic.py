"""Stochastic acceptance: exact worked examples, validation, and the lossless guarantee.

The distribution tests use a toy "model": a target and a draft distribution for every context
(token path from the root) over a small vocab, so the target's joint law of the next tokens is
known exactly. Each trial is one copy of the request in a big batch; a trial's first ``k``
emitted tokens are its accepted tokens, then its bonus, then (when the step emitted fewer than
``k``) plain sampling from the target, which is what the next decode steps would do. Their
empirical joint law must match ``prod_j P(t_j | t_<j)`` (chi-square, p > 0.01).

Seeds are fixed, so the tests are deterministic. Checked offline: over 20 other seeds for each
non-degenerate scenario, 6 of 260 p-values fell below 0.01 and all 260 are consistent with
uniform (KS p = 0.27), as for a correct sampler; at 10x the trials, KS p = 0.52.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from echo_core.acceptance import AcceptResult, greedy_accept
from echo_core.acceptance_stochastic import AcceptUniforms, draw_uniforms, stochastic_accept
from echo_core.errors import AcceptanceError
from echo_core.sampling import target_probs
from echo_core.tree import ROOT, TreeBatch, empty_tree, make_tree
from echo_core.verify_rows import node_rows

V = 6
TRIALS = 40_000
ALPHA = 0.01
SEED = 1
SAMPLED = -1
"""Template token meaning "drawn from the draft distribution at the parent"."""

Template = list[tuple[int, int]]  # (parent, token or SAMPLED) per node, in node order


def child_ctx(ctx: Tensor, token: Tensor) -> Tensor:
    """Context id of ``ctx`` extended by ``token`` (root context 0, V-ary heap numbering)."""
    return ctx * V + token + 1


@dataclass(frozen=True)
class ToyModel:
    target: Tensor  # [C, V] float32, target distribution per context
    draft: Tensor  # [C, V] float32, draft distribution per context


def toy_model(
    seed: int,
    depth: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    draft: str = "independent",
) -> ToyModel:
    """Distributions for every context of length <= ``depth``.

    ``draft``: "independent" (random, unrelated to p), "opposite" (softmax of minus the target
    logits: far from p), "equal" (q = p), "outside" (uniform on the tokens where p = 0).
    """
    g = torch.Generator().manual_seed(seed)
    contexts = (V ** (depth + 1) - 1) // (V - 1)
    logits = torch.randn(contexts, V, generator=g) * 1.5
    target = target_probs(
        logits,
        torch.full((contexts,), temperature),
        torch.full((contexts,), top_k, dtype=torch.int64),
        torch.full((contexts,), top_p),
    )
    if draft == "independent":
        q = torch.softmax(torch.randn(contexts, V, generator=g) * 1.5, dim=-1)
    elif draft == "opposite":
        q = torch.softmax(-logits, dim=-1)
    elif draft == "equal":
        q = target.clone()
    else:
        outside = (target == 0).to(torch.float32)
        q = outside / outside.sum(dim=-1, keepdim=True)
    return ToyModel(target=target, draft=q)


@dataclass(frozen=True)
class Trials:
    tree: TreeBatch
    target: Tensor  # [B+N, V] float32
    sampled: Tensor  # [N] bool
    draft: Tensor | None  # [B+N, V] float32


def build_trials(model: ToyModel, template: Template, trials: int, g: torch.Generator) -> Trials:
    """``trials`` copies of the template request, sampled tokens drawn from the draft."""
    n = len(template)
    tokens = torch.zeros(trials, n, dtype=torch.int64)
    ctx = torch.zeros(trials, n, dtype=torch.int64)
    for i, (par, tok) in enumerate(template):
        pctx = torch.zeros(trials, dtype=torch.int64) if par == ROOT else ctx[:, par]
        if tok == SAMPLED:
            tokens[:, i] = torch.multinomial(model.draft[pctx], 1, generator=g).squeeze(1)
        else:
            tokens[:, i] = tok
        ctx[:, i] = child_ctx(pctx, tokens[:, i])
    shape = make_tree([[(max(tok, 0), par, 0.0) for par, tok in template]])
    assert shape.max_depth() < len(model.target), "the toy model is too shallow for the tree"
    tree = TreeBatch(
        cu_nodes=torch.arange(trials + 1, dtype=torch.int64) * n,
        token=tokens.flatten(),
        parent=shape.parent.repeat(trials),
        depth=shape.depth.repeat(trials),
        draft_logprob=torch.zeros(trials * n),
        path_logprob=torch.zeros(trials * n),
    )
    tree.validate()
    rows = torch.cat([torch.zeros(trials, 1, dtype=torch.int64), ctx], dim=1).flatten()
    sampled = torch.tensor([tok == SAMPLED for _, tok in template], dtype=torch.bool)
    sampled = sampled.repeat(trials)
    draft = model.draft[rows] if bool(sampled.any()) else None
    return Trials(tree, model.target[rows], sampled, draft)


def first_tokens(
    model: ToyModel, trials: Trials, result: AcceptResult, k: int, g: torch.Generator
) -> Tensor:
    """[trials, k] int64: accepted tokens, then the bonus, then plain target sampling."""
    accepted = result.accepted_tokens(trials.tree)
    num = result.num_accepted
    seq = torch.zeros(num.numel(), k, dtype=torch.int64)
    ctx = torch.zeros(num.numel(), dtype=torch.int64)
    for j in range(k):
        later = torch.multinomial(model.target[ctx], 1, generator=g).squeeze(1)
        tok = torch.where(num == j, result.bonus_token, later)
        if j < accepted.shape[1]:
            tok = torch.where(num > j, accepted[:, j], tok)
        seq[:, j] = tok
        ctx = child_ctx(ctx, tok)
    return seq


def joint_law(model: ToyModel, k: int) -> np.ndarray:
    """Target probability of every k-token continuation, indexed in base V: [V**k] float64."""
    target = model.target.double().numpy()
    law = np.zeros(V**k)
    for cell, seq in enumerate(itertools.product(range(V), repeat=k)):
        prob, ctx = 1.0, 0
        for tok in seq:
            prob *= target[ctx, tok]
            ctx = ctx * V + tok + 1
        law[cell] = prob
    return law


def chi2_pvalue(seq: Tensor, law: np.ndarray) -> float:
    """Chi-square p-value of the samples against ``law``; cells with expected count < 5 are
    pooled. Asserts first that no sample falls where ``law`` is 0."""
    k = seq.shape[1]
    cells = (seq * torch.tensor([V ** (k - 1 - j) for j in range(k)])).sum(dim=1)
    observed = torch.bincount(cells, minlength=V**k).double().numpy()
    impossible = law == 0
    assert observed[impossible].sum() == 0, "a token with zero target probability was emitted"
    expected = law[~impossible] / law[~impossible].sum() * observed.sum()
    obs = observed[~impossible]
    small = expected < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    if obs.size < 2:
        return 1.0
    return float(scipy.stats.chisquare(obs, expected).pvalue)


@dataclass(frozen=True)
class Scenario:
    template: Callable[[ToyModel], Template]
    depth: int  # deepest context the model needs
    k: int = 2  # emitted tokens whose joint law is tested
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    draft: str = "independent"


def fixed(template: Template) -> Callable[[ToyModel], Template]:
    return lambda _model: template


def argmax_chain(length: int) -> Callable[[ToyModel], Template]:
    """A deterministic chain following the target's most likely token at every step."""

    def build(model: ToyModel) -> Template:
        template: Template = []
        ctx = 0
        for i in range(length):
            tok = int(model.target[ctx].argmax())
            template.append((i - 1, tok))
            ctx = ctx * V + tok + 1
        return template

    return build


def outside_support(model: ToyModel) -> Template:
    """Root children whose tokens have zero target probability at the root."""
    return [(ROOT, int(t)) for t in (model.target[0] == 0).nonzero().flatten()]


S = SAMPLED
SCENARIOS = {
    "zero_draft_is_plain_sampling": Scenario(fixed([]), depth=1),
    "chain_deterministic": Scenario(fixed([(ROOT, 1), (0, 2), (1, 3)]), depth=3),
    "wide_deterministic": Scenario(fixed([(ROOT, 0), (ROOT, 1), (ROOT, 2), (ROOT, 3)]), depth=1),
    "deep_deterministic": Scenario(
        fixed([(ROOT, 0), (ROOT, 1), (0, 2), (0, 3), (2, 4), (4, 5), (5, 0), (1, 1)]),
        depth=5,
        k=3,
    ),
    "chain_sampled_q_far_from_p": Scenario(
        fixed([(ROOT, S), (0, S), (1, S)]), depth=3, draft="opposite"
    ),
    "wide_sampled": Scenario(
        fixed([(ROOT, S)] * 4 + [(0, S), (0, S), (1, S), (3, S)]), depth=2, k=3
    ),
    "deep_sampled": Scenario(fixed([(ROOT, S), (0, S), (0, S), (1, S), (3, S)]), depth=4, k=3),
    "mixed_kinds_per_parent": Scenario(
        fixed([(ROOT, S), (ROOT, S), (0, 2), (0, 5), (1, S), (1, S), (4, 1)]), depth=3, k=3
    ),
    "top_k_top_p_deterministic": Scenario(
        fixed([(ROOT, 0), (ROOT, 1), (ROOT, 2), (0, 3), (0, 4), (3, 5)]),
        depth=3,
        temperature=0.7,
        top_k=3,
        top_p=0.8,
    ),
    "top_k_top_p_sampled": Scenario(
        fixed([(ROOT, S), (ROOT, S), (0, S), (0, S), (2, S)]),
        depth=3,
        temperature=1.3,
        top_k=4,
        top_p=0.7,
    ),
    "all_rejected_deterministic": Scenario(outside_support, depth=1, top_k=2),
    "all_rejected_sampled": Scenario(
        fixed([(ROOT, S), (ROOT, S), (ROOT, S)]), depth=1, top_k=3, draft="outside"
    ),
    "all_accepted_sampled_q_equals_p": Scenario(
        fixed([(ROOT, S), (0, S), (1, S)]), depth=3, k=3, draft="equal"
    ),
    "all_accepted_one_hot_target": Scenario(argmax_chain(3), depth=3, top_k=1),
}


def run_scenario(
    scenario: Scenario, seed: int, *, uniform_q_claimed: bool = False
) -> tuple[Trials, AcceptResult, float]:
    model = toy_model(
        seed,
        max(scenario.depth, scenario.k),
        temperature=scenario.temperature,
        top_k=scenario.top_k,
        top_p=scenario.top_p,
        draft=scenario.draft,
    )
    g = torch.Generator().manual_seed(seed + 1)
    trials = build_trials(model, scenario.template(model), TRIALS, g)
    sampled, draft = trials.sampled, trials.draft
    if uniform_q_claimed:  # wrong on purpose: the candidates were not drawn from this q
        sampled, draft = torch.ones_like(sampled), torch.full_like(trials.target, 1.0 / V)
    result = stochastic_accept(trials.tree, trials.target, sampled, draft, generator=g)
    seq = first_tokens(model, trials, result, scenario.k, g)
    return trials, result, chi2_pvalue(seq, joint_law(model, scenario.k))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_emitted_tokens_follow_the_target_distribution(name: str) -> None:
    scenario = SCENARIOS[name]
    trials, result, pvalue = run_scenario(scenario, seed=SEED + list(SCENARIOS).index(name))
    assert pvalue > ALPHA, f"{name}: chi-square p = {pvalue:.2e}"
    n = trials.tree.nodes_per_request()
    if name.startswith("all_rejected"):
        assert int(n[0]) > 0
        assert bool((result.num_accepted == 0).all())
    if name.startswith("all_accepted"):
        assert bool((result.num_accepted == n).all())


def test_chi_square_harness_detects_a_wrong_rule() -> None:
    """The sampled rule applied to fixed candidates, with a q they were not drawn from, is
    biased (min(1, p/q) over-accepts them); the harness must see it. (The reverse mistake,
    the deterministic rule on sampled nodes, is lossless, only less efficient.)"""
    scenario = SCENARIOS["wide_deterministic"]
    _, _, pvalue = run_scenario(scenario, seed=3, uniform_q_claimed=True)
    assert pvalue < 1e-6


def test_zero_draft_bonus_is_inverse_cdf_of_the_uniform() -> None:
    g = torch.Generator().manual_seed(11)
    tree = empty_tree(500)
    probs = torch.softmax(torch.randn(500, 7, generator=g), dim=-1)
    probs[:, 3] = 0.0
    probs = probs / probs.sum(dim=-1, keepdim=True)
    u = AcceptUniforms(node=torch.zeros(0), bonus=torch.rand(500, generator=g))
    result = stochastic_accept(tree, probs, torch.zeros(0, dtype=torch.bool), None, u)
    cdf = torch.cumsum(probs, dim=-1)
    expected = torch.searchsorted(cdf, (u.bonus * cdf[:, -1])[:, None], right=True).squeeze(1)
    assert torch.equal(result.bonus_token, expected)
    assert result.accepted_nodes.shape == (500, 0)


def test_deterministic_rejection_renormalises_then_accepts_sibling() -> None:
    # p_root = [0.5, 0.3, 0.2]; node 0 (token 0): u = 0.6 >= 0.5 rejects, p = [0, 0.6, 0.4];
    # node 1 (token 1): u = 0.5 < 0.6 accepts; node 1 is a leaf: bonus from its row with
    # u_b = 0.3: cumsum [0.1, 0.3, 1.0] > 0.3 first at index 2.
    tree = make_tree([[(0, ROOT, -0.1), (1, ROOT, -0.2)]])
    target = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [0.1, 0.2, 0.7]])
    u = AcceptUniforms(node=torch.tensor([0.6, 0.5]), bonus=torch.tensor([0.3]))
    result = stochastic_accept(tree, target, torch.zeros(2, dtype=torch.bool), None, u)
    assert result.emitted_tokens(tree) == [[1, 2]]
    assert result.accepted_nodes.tolist() == [[1]]


def test_sampled_rejection_samples_bonus_from_residual() -> None:
    # p = [0.5, 0.3, 0.2], q = [0.2, 0.2, 0.6]; token 2: ratio 0.2 / 0.6 = 1/3 < u = 0.5 rejects;
    # residual max(p - q, 0) = [0.3, 0.1, 0] -> [0.75, 0.25, 0]; u_b = 0.8 -> token 1.
    tree = make_tree([[(2, ROOT, -0.5)]])
    target = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    draft = torch.tensor([[0.2, 0.2, 0.6], [1.0, 0.0, 0.0]])
    u = AcceptUniforms(node=torch.tensor([0.5]), bonus=torch.tensor([0.8]))
    result = stochastic_accept(tree, target, torch.ones(1, dtype=torch.bool), draft, u)
    assert result.emitted_tokens(tree) == [[1]]
    assert result.num_accepted.tolist() == [0]


def test_residual_without_mass_keeps_p() -> None:
    # An unnormalised q >= p everywhere leaves no residual mass: p stays [0.5, 0.5].
    tree = make_tree([[(0, ROOT, -0.7)]])
    target = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    draft = torch.tensor([[0.9, 0.9], [1.0, 0.0]])
    u = AcceptUniforms(node=torch.tensor([0.99]), bonus=torch.tensor([0.7]))
    result = stochastic_accept(tree, target, torch.ones(1, dtype=torch.bool), draft, u)
    assert result.emitted_tokens(tree) == [[1]]


def test_duplicate_deterministic_sibling_is_never_accepted() -> None:
    tree = make_tree([[(1, ROOT, -0.1), (1, ROOT, -0.1)]])
    target = torch.tensor([[0.0, 0.4, 0.6], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    u = AcceptUniforms(node=torch.tensor([0.9, 0.0]), bonus=torch.tensor([0.5]))
    result = stochastic_accept(tree, target, torch.zeros(2, dtype=torch.bool), None, u)
    assert result.emitted_tokens(tree) == [[2]]


def test_same_uniforms_give_identical_results() -> None:
    g = torch.Generator().manual_seed(5)
    model = toy_model(5, 3)
    trials = build_trials(model, [(ROOT, S), (ROOT, S), (0, 2), (1, S)], 300, g)
    u = draw_uniforms(trials.tree, g)
    args = (trials.tree, trials.target, trials.sampled, trials.draft)
    first, second = stochastic_accept(*args, u), stochastic_accept(*args, u)
    for a, b in zip(
        (first.accepted_nodes, first.num_accepted, first.bonus_token),
        (second.accepted_nodes, second.num_accepted, second.bonus_token),
        strict=True,
    ):
        assert torch.equal(a, b)
    seeded = [
        stochastic_accept(*args, generator=torch.Generator().manual_seed(9)).bonus_token
        for _ in range(2)
    ]
    assert torch.equal(seeded[0], seeded[1])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_one_hot_target_with_distinct_siblings_matches_greedy(data: st.DataObject) -> None:
    requests = []
    for _ in range(data.draw(st.integers(1, 4))):
        nodes: list[tuple[int, int, float]] = []
        used: dict[int, set[int]] = {}
        for _ in range(data.draw(st.integers(0, 8))):
            parent = data.draw(st.integers(ROOT, len(nodes) - 1))
            free = sorted(set(range(4)) - used.setdefault(parent, set()))
            if not free:
                continue
            token = data.draw(st.sampled_from(free))
            used[parent].add(token)
            nodes.append((token, parent, -0.1))
        requests.append(nodes)
    tree = make_tree(requests)
    rows = tree.batch_size + tree.num_nodes
    argmax = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows)))
    one_hot = torch.nn.functional.one_hot(argmax, 4).to(torch.float32)
    u = draw_uniforms(tree, torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    got = stochastic_accept(tree, one_hot, torch.zeros(tree.num_nodes, dtype=torch.bool), None, u)
    want = greedy_accept(tree, argmax)
    assert torch.equal(got.accepted_nodes, want.accepted_nodes)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.bonus_token, want.bonus_token)


def _inputs() -> tuple[TreeBatch, Tensor, Tensor, Tensor]:
    tree = make_tree([[(0, ROOT, -0.1), (1, ROOT, -0.1), (2, 0, -0.1)], [(3, ROOT, -0.1)]])
    target = torch.full((6, 4), 0.25)
    return tree, target, torch.zeros(4, dtype=torch.bool), target.clone()


def test_siblings_of_mixed_kind_raise() -> None:
    tree, target, _, draft = _inputs()
    with pytest.raises(AcceptanceError, match="mix sampled and deterministic"):
        stochastic_accept(tree, target, torch.tensor([True, False, False, False]), draft)


def test_sampled_nodes_need_draft_probs() -> None:
    tree, target, _, _ = _inputs()
    with pytest.raises(AcceptanceError, match="draft_probs is required"):
        stochastic_accept(tree, target, torch.tensor([False, False, True, False]), None)


@pytest.mark.parametrize(
    ("field", "bad", "match"),
    [
        ("target", torch.full((5, 4), 0.25), r"target_probs must be \[B\+N, V\] = \[6, V\]"),
        ("target", torch.full((6, 4), 0.25, dtype=torch.float64), "float64"),
        ("sampled", torch.zeros(4, dtype=torch.int64), "sampled must be"),
        ("sampled", torch.zeros(3, dtype=torch.bool), r"sampled must be \[4\]"),
        ("draft", torch.full((6, 3), 0.25), r"draft_probs must be \[6, 4\]"),
    ],
)
def test_bad_shapes_raise_naming_the_argument(field: str, bad: Tensor, match: str) -> None:
    tree, target, sampled, draft = _inputs()
    args = {"target": target, "sampled": sampled, "draft": draft} | {field: bad}
    with pytest.raises(AcceptanceError, match=match):
        stochastic_accept(tree, args["target"], args["sampled"], args["draft"])


def test_uniforms_out_of_range_raise() -> None:
    tree, target, sampled, _ = _inputs()
    u = AcceptUniforms(node=torch.tensor([0.1, 1.0, 0.2, 0.3]), bonus=torch.zeros(2))
    with pytest.raises(
        AcceptanceError, match=r"uniforms.node must lie in \[0, 1\), got uniforms.node\[1\] = 1.0"
    ):
        stochastic_accept(tree, target, sampled, None, u)
    u = AcceptUniforms(node=torch.zeros(4), bonus=torch.zeros(3))
    with pytest.raises(AcceptanceError, match=r"uniforms.bonus must be \[2\]"):
        stochastic_accept(tree, target, sampled, None, u)


def test_token_outside_vocab_raises() -> None:
    tree, target, sampled, _ = _inputs()
    with pytest.raises(AcceptanceError, match="token id 3 is outside the vocab of 3"):
        stochastic_accept(tree, target[:, :3].contiguous(), sampled, None)


def test_accepted_rows_are_node_rows() -> None:
    # With every draft token certain, the bonus comes from the deepest node's row.
    tree = make_tree([[(1, ROOT, -0.1), (2, 0, -0.1)], [(0, ROOT, -0.1)]])
    target = torch.zeros(5, 3)
    target[0, 1] = target[1, 2] = target[3, 0] = 1.0
    target[2, 0] = target[4, 1] = 1.0
    assert node_rows(tree).tolist() == [1, 2, 4]
    result = stochastic_accept(tree, target, torch.zeros(3, dtype=torch.bool), None)
    assert result.emitted_tokens(tree) == [[1, 2, 0], [0, 1]]
