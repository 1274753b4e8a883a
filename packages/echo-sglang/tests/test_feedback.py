"""SGLang's accept counts fed back into the policy and the drift monitor (on_verify_complete_cpu).

The counts come from SGLang's own greedy tree-verify kernel over ECHO's layout, as
``batch_result_processor`` would pass them (accepted draft tokens, bonus excluded). The gate
observations must equal echo-gating's ``gate_observations`` on the verified tree with the true
accepted-node mask, with the confidences the gates saw on the drafted view.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from echo_core.acceptance import greedy_accept
from echo_core.tree import select_nodes
from echo_gating.drift import gate_observations
from echo_gating.policy import GatePolicy
from echo_gating.signals import depth_confidences
from echo_sglang.args import EchoArgs
from echo_sglang.config import EagleShape, resolve
from echo_sglang.eagle_pool import concat_draft_lists, pool_from_eagle
from echo_sglang.step import EchoStep
from echo_sglang.synthetic import eagle_draft, following_targets, padded_targets

from .conftest import SGLang
from .source_ast import WORKER, function_def

STEPS, TOPK, N, B = 3, 3, 8, 4


def _step(tmp_path: Path) -> EchoStep:
    gate_file = tmp_path / "gate.json"
    GatePolicy.fixed(0.05, max_depth=STEPS).save(gate_file)
    args = EchoArgs(budget=14, gate_file=str(gate_file), policy="echo_fixed")
    return EchoStep(resolve(args, EagleShape(STEPS, TOPK, N)))


def test_sglang_accept_counts_reach_the_policy_and_the_monitor(sgl: SGLang, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(11)
    lists = eagle_draft(gen, B, STEPS, TOPK, vocab=8)
    root, seq_lens = torch.arange(B) + 3, torch.tensor([4, 1, 7, 2])
    step = _step(tmp_path)
    seen: list[torch.Tensor] = []
    step.replay.policy.observe = lambda outcome: seen.append(outcome.accepted_lengths)  # type: ignore[method-assign]
    selection, layout = step.plan(*lists, root, seq_lens)

    tree = selection.tree
    target = following_targets(tree, gen, vocab=8)
    padded_target = padded_targets(tree, target, N)
    counts = sgl.greedy(layout, padded_target).num_accepted.tolist()  # SGLang's kernel
    assert sum(counts) > 0

    fed = step.observe(counts)
    assert fed is not None
    assert fed.outcome.accepted_lengths.tolist() == counts
    assert fed.outcome.verified.tolist() == tree.nodes_per_request().tolist()
    assert [t.tolist() for t in seen] == [counts]
    assert (step.observed_steps, step.accepted_tokens) == (1, sum(counts))

    ref = greedy_accept(tree, target)  # echo-core's reference accepted path
    on_path = torch.zeros(tree.num_nodes, dtype=torch.bool)
    for b in range(B):
        k = int(ref.num_accepted[b])
        on_path[int(tree.cu_nodes[b]) + ref.accepted_nodes[b, :k].long()] = True
    expected = gate_observations(tree, on_path)
    obs = fed.observations
    assert obs.depth.tolist() == expected.depth.tolist()
    assert obs.accepted.tolist() == expected.accepted.tolist()
    pool = pool_from_eagle(*concat_draft_lists(*lists), TOPK).tree
    seen_conf = depth_confidences(select_nodes(pool, selection.drafted))
    cells = [(b, d) for b in range(B) for d in range(1, STEPS + 1)
             if bool(((tree.request_index() == b) & (tree.depth == d)).any())]  # fmt: skip
    assert obs.confidence.tolist() == [float(seen_conf[b, d - 1]) for b, d in cells]

    assert step.monitor is not None
    assert len(step.monitor.window()) == len(obs)
    assert step.observe(counts) is None  # no step planned since: nothing is fed twice


def test_counts_of_another_step_are_refused_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gen = torch.Generator().manual_seed(5)
    lists = eagle_draft(gen, B, STEPS, TOPK, vocab=8)
    step = _step(tmp_path)
    root, seq_lens = torch.arange(B), torch.full((B,), 3)
    step.plan(*lists, root, seq_lens)
    with caplog.at_level("WARNING"):
        assert step.observe([0] * (B + 1)) is None
    assert "planned this step for 4" in caplog.text
    selection, _ = step.plan(*lists, root, seq_lens)
    too_deep = [STEPS + 1] + [0] * (B - 1)
    assert step.observe(too_deep) is None
    assert step.refused_feedback == 2
    assert step.observed_steps == 0
    step.plan(*lists, root, seq_lens)
    assert step.observe([0] * B) is not None  # the next good report is taken
    assert selection.tree.num_nodes > 0


def _args(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.args] + [a.arg for a in fn.args.kwonlyargs]


def test_worker_hook_matches_sglang_signature_and_call(sglang_site: Path) -> None:
    """EchoWorker imports SGLang's CUDA worker, so the contract is checked on the source:
    the override has BaseSpecWorker's parameters, and SGLang's result processor calls it."""
    base = sglang_site / "sglang" / "srt" / "speculative" / "base_spec_worker.py"
    theirs = function_def(base, "on_verify_complete_cpu")
    ours = function_def(WORKER, "on_verify_complete_cpu")
    assert _args(ours) == _args(theirs) == ["self", "num_correct_drafts_per_req", "batch_size"]
    processor = (
        sglang_site / "sglang" / "srt" / "managers" / "scheduler_components"
        / "batch_result_processor.py"
    )  # fmt: skip
    source = processor.read_text(encoding="utf-8")
    assert "self.model_worker.on_verify_complete_cpu(" in source
    assert "length - num_non_draft for length in accept_lens" in source  # bonus excluded
