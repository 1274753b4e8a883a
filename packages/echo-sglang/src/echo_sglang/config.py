"""ECHO's flags resolved against SGLang's EAGLE flags: the policy, the gate, the step budget.

ECHO selects from the pool SGLang's EAGLE worker drafts: ``S = --speculative-num-steps`` depths,
``k = --speculative-eagle-topk`` children per expanded node, the ``k`` best paths expanded at
every depth, ``M = k + (S - 1) k^2`` candidates per request. Verification is padded to
``N = --speculative-num-draft-tokens`` rows per request (root included), so a request holds at
most ``N - 1`` nodes and a step at most ``B (N - 1)``.

Worked example: ``S = 3, k = 4, N = 9`` gives ``M = 36`` candidates and per-request caps of 8;
``--speculative-echo-budget auto --speculative-echo-knee-tokens 96`` at batch 32 gives
``K = min(96 - 32, 32 * 8) = 64`` draft tokens per step. K comes from echo-scheduler's budget
chain (:mod:`echo_scheduler.budget`, the engine's too): the flags choose its first link (fixed,
or the knee), the padded width ``B (N - 1)`` is the step's cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from echo_gating.policy import GatePolicy
from echo_scheduler.budget import BudgetChain, LocalBudget
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import BasePolicy, StepBatch
from echo_scheduler.policies import make_policy
from echo_sglang.args import EchoArgs, PluginConfigError


@dataclass(frozen=True, slots=True)
class EagleShape:
    """SGLang's EAGLE tree flags (None where the user left SGLang to choose)."""

    num_steps: int | None
    topk: int | None
    num_draft_tokens: int | None

    @property
    def pool_size(self) -> int:
        """Candidates EAGLE drafts per request: ``k + (S - 1) k^2``."""
        s, k = self._require()[:2]
        return k + (s - 1) * k * k

    def _require(self) -> tuple[int, int, int]:
        s, k, n = self.num_steps, self.topk, self.num_draft_tokens
        if s is None or k is None or n is None:
            raise PluginConfigError(
                "ECHO needs --speculative-num-steps, --speculative-eagle-topk and "
                "--speculative-num-draft-tokens set explicitly (it selects from the pool they "
                f"describe), got {s}, {k} and {n}"
            )
        return s, k, n


@dataclass(frozen=True, slots=True)
class EchoConfig:
    """Everything a step needs, validated once at start-up."""

    args: EchoArgs
    num_steps: int
    topk: int
    num_draft_tokens: int  # N, root included: the padded verify width
    policy_config: PolicyConfig
    gate: GatePolicy | None
    budget: BudgetChain  # echo-scheduler's one chain (:func:`budget_chain`), capped at B (N - 1)

    @property
    def max_nodes_per_request(self) -> int:
        return self.num_draft_tokens - 1

    def step_budget(self, batch_size: int) -> int:
        """K for a batch of ``batch_size`` requests (module docstring), ``0 <= K <= B (N - 1)``."""
        return self.budget.k(batch_size, cap=batch_size * self.max_nodes_per_request)

    def step_batch(self, max_nodes: Tensor) -> StepBatch:
        """The chain's :class:`StepBatch` for ``len(max_nodes)`` requests, K from
        :meth:`step_budget` (no floor: the plugin prices no rows)."""
        b = int(max_nodes.numel())
        return self.budget.step(max_nodes, cap=b * self.max_nodes_per_request)

    def make_policy(self) -> BasePolicy:
        """A fresh policy instance (one per SGLang worker: policies keep per-step state)."""
        return make_policy(self.args.policy, self.policy_config, self.gate)


def budget_chain(args: EchoArgs) -> BudgetChain:
    """``--speculative-echo-budget`` / ``--speculative-echo-knee-tokens`` as a budget chain: K
    fixed, or ``auto``: the knee's ``K_max(B)`` (no clamp beyond the step's cap), or with no knee
    no local limit (the step's cap, the tokens SGLang's EAGLE would verify)."""
    if args.budget != "auto":
        return BudgetChain(LocalBudget(fixed=args.budget))
    return BudgetChain(LocalBudget(knee_tokens=args.knee_tokens, max_budget=None))


def resolve(args: EchoArgs, eagle: EagleShape) -> EchoConfig:
    """Check ``args`` against the EAGLE flags and load the gate; raise PluginConfigError."""
    steps, topk, n = eagle._require()
    if topk < 2:
        raise PluginConfigError(
            f"ECHO needs --speculative-eagle-topk >= 2, got {topk}: with top-k 1 SGLang drafts a "
            "chain through a fast path that keeps no draft scores, so there is nothing to select"
        )
    if not 2 <= n <= 1 + eagle.pool_size:
        raise PluginConfigError(
            f"--speculative-num-draft-tokens must lie in [2, {1 + eagle.pool_size}] (root + the "
            f"{eagle.pool_size} candidates of {steps} steps at top-k {topk}), got {n}"
        )
    depth = steps if args.max_depth is None else args.max_depth
    width = topk if args.max_width is None else args.max_width
    if depth > steps:
        raise PluginConfigError(
            f"--speculative-echo-max-depth={depth} exceeds --speculative-num-steps={steps}: "
            "EAGLE drafts no deeper"
        )
    if width > topk:
        raise PluginConfigError(
            f"--speculative-echo-max-width={width} exceeds --speculative-eagle-topk={topk}: "
            "EAGLE drafts no wider"
        )
    gate = None
    if args.gate_file is not None:
        try:
            gate = GatePolicy.load(args.gate_file)
        except (OSError, ValueError) as exc:
            raise PluginConfigError(
                f"--speculative-echo-gate-file {args.gate_file!r} cannot be used: {exc}"
            ) from exc
    try:
        config = PolicyConfig(
            base_depth=depth, topk=topk, num_draft_tokens=n, max_depth=depth, max_width=width
        )
        make_policy(args.policy, config, gate)  # fail now, not in the first decode step
    except ValueError as exc:
        raise PluginConfigError(f"--speculative-echo-policy {args.policy}: {exc}") from exc
    return EchoConfig(args, steps, topk, n, config, gate, budget_chain(args))
