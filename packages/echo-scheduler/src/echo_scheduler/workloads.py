"""A seeded synthetic workload: per step a hidden target continuation and a simulated drafter.

Shaped like echo-gating's synthetic warm-up model (accepted confidences cluster near 0.9 and
rejected near 0.1 at shallow depths; the clusters merge with depth), but as real trees. Per step,
request b, depth d = 1..D (``z`` ~ N(0, 1), ``sigma`` the logistic function):

- coverage: the target's depth-d token is among the drafter's children of the on-path depth-(d-1)
  node with probability ``alpha_{b,d} = sigma(logit alpha_d + h z_b)`` (``h``: how much requests
  differ); given coverage it is the top child with probability ``top_share``, else rank
  ``1 + Geometric(1/2)``;
- the drafter's children of any node are geometric, ``q_i = p (1 - p)^i`` for rank i, with top-1
  probability ``p = sigma(+mu_d + s z)`` on the target's branch when the target is its top child,
  and ``p = sigma(-mu_d + s z)`` otherwise (also everywhere off the target's branch, where nothing
  is ever accepted); ``mu_d = logit(0.9) * separation_d``. So separation 1 puts the two clusters
  near 0.9 / 0.1, separation 0 makes confidence uninformative (drift), and the raw path score
  ``prod q`` is miscalibrated by depth, which calibrated acceptance maps correct.

Everything a drafter returns is a deterministic function of the node's token path (hashed), so
every policy sees the same tree for the same expansions. A node is accepted iff its tokens equal
the target continuation's prefix (greedy verification), see :mod:`echo_scheduler.outcome`.
:meth:`SyntheticWorkload.from_reference` derives ``alpha_d`` and ``separation_d`` from a calibrated
GatePolicy's per-depth statistics (accept rates and AUC), so measured profiles drive the simulator.

A production module, not a test fixture: :mod:`echo_lab.sim.compare` (the simulator's entry
point) and :mod:`echo_lab.sim.trace` (recording steps) import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from echo_core.tree import ROOT, TreeBatch
from echo_gating.policy import DepthStats
from echo_scheduler.errors import TraceError
from echo_scheduler.interface import DraftPlan
from echo_scheduler.outcome import accepted_mask
from echo_scheduler.pool import Children
from echo_scheduler.ranking import depth_groups

MODULUS = 2_147_483_647  # 2^31 - 1: hash arithmetic stays inside int64
UNCOVERED = 1 << 20
"""Target rank meaning "not among the drafter's candidates"."""
P_MIN, P_MAX = 0.01, 0.99


def mix(x: Tensor) -> Tensor:
    """A cheap integer hash on ``[0, 2^31 - 1)``: int64 -> int64."""
    x = (x % MODULUS * 48_271) % MODULUS
    x = x ^ (x >> 13)
    x = (x * 69_621) % MODULUS
    return x ^ (x >> 11)


def path_hash(pool: TreeBatch, seed: Tensor) -> Tensor:
    """Hash of every node's token path, seeded per request: [N] int64 (one pass per depth)."""
    h = torch.zeros(pool.num_nodes, dtype=torch.int64, device=pool.device)
    gp = pool.global_parent()
    req = pool.request_index()
    for d, idx in enumerate(depth_groups(pool), start=1):
        prev = seed[req[idx]] if d == 1 else h[gp[idx]]
        h[idx] = mix(prev % MODULUS * 1_000_003 + pool.token[idx])
    return h


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    """Parameters of the model in the module docstring; presets :meth:`llama`, :meth:`qwen`."""

    continue_prob: tuple[float, ...] = (0.92, 0.9, 0.88, 0.86, 0.84, 0.82, 0.8, 0.8, 0.8, 0.8)
    separation: tuple[float, ...] = (1.0, 0.95, 0.85, 0.7, 0.5, 0.35, 0.2, 0.1, 0.0, 0.0)
    heterogeneity: float = 1.0  # h
    top_share: float = 0.85
    noise: float = 1.5  # s
    vocab: int = 32_000
    capped_fraction: float = 0.05  # requests near max_tokens: cap ~ U{0..3}

    def __post_init__(self) -> None:
        if not self.continue_prob or len(self.separation) != len(self.continue_prob):
            raise TraceError("need one continue_prob and one separation per depth")
        if not all(0.0 < a < 1.0 for a in self.continue_prob):
            raise TraceError(f"continue_prob must lie in (0, 1), got {self.continue_prob}")

    @property
    def depth(self) -> int:
        return len(self.continue_prob)

    def mu(self) -> Tensor:
        """``mu_d`` for d = 1..D: [D] float64."""
        return math.log(9.0) * torch.tensor(self.separation, dtype=torch.float64)

    @staticmethod
    def separation_for_auc(auc: Tensor, noise: float) -> Tensor:
        """``separation_d = Phi^-1(AUC_d) sqrt(2) s / (2 logit 0.9)`` (the AUC of two normals
        ``N(+-mu, s^2)`` is ``Phi(2 mu / (s sqrt 2))``); AUC clamped to [0.5, 0.999]: [D]."""
        scale = math.sqrt(2) * noise / 2 / math.log(9)
        out: Tensor = torch.special.ndtri(auc.to(torch.float64).clamp(0.5, 0.999)) * scale
        return out

    @staticmethod
    def llama() -> SyntheticWorkload:
        """Well aligned, separable to about depth 8 (the paper's LLaMA profiles)."""
        return SyntheticWorkload()

    @staticmethod
    def qwen() -> SyntheticWorkload:
        """Weaker alignment, separable to about depth 5 (the paper's Qwen profiles)."""
        return SyntheticWorkload(
            continue_prob=(0.88, 0.84, 0.8, 0.76, 0.72, 0.7, 0.7, 0.7, 0.7, 0.7),
            separation=(1.0, 0.85, 0.6, 0.35, 0.15, 0.0, 0.0, 0.0, 0.0, 0.0),
        )

    @staticmethod
    def from_reference(
        reference: Mapping[int, DepthStats], noise: float = 1.5
    ) -> SyntheticWorkload:
        """Fit per-depth parameters to calibration statistics (depths 1..D, all present).

        ``alpha_d = rate_d / rate_{d-1}`` from ``rate_d = accepted_d / count_d`` (the share of
        requests accepting a depth-d token), and ``separation_d`` from ``AUC_d`` by
        :meth:`separation_for_auc`.
        """
        depths = sorted(reference)
        if not depths or depths != list(range(1, len(depths) + 1)):
            raise TraceError(f"reference must cover depths 1..D, got {depths}")
        rates = [max(reference[d].accept_rate, 1e-3) for d in depths]
        prev = [1.0, *rates[:-1]]
        alpha = [min(max(r / p, 0.01), 0.99) for r, p in zip(rates, prev, strict=True)]
        aucs = [0.5 if reference[d].auc is None else reference[d].auc for d in depths]
        sep = SyntheticWorkload.separation_for_auc(
            torch.tensor(aucs, dtype=torch.float64), noise
        ).tolist()
        return SyntheticWorkload(continue_prob=tuple(alpha), separation=tuple(sep), noise=noise)

    def sample(
        self, batch_size: int, steps: int, generator: torch.Generator
    ) -> list[SyntheticStep]:
        """``steps`` independent steps of ``batch_size`` requests, seeded by ``generator``."""
        return [self._step(batch_size, generator) for _ in range(steps)]

    def _step(self, b: int, g: torch.Generator) -> SyntheticStep:
        d = self.depth
        f64 = torch.float64
        alpha = torch.logit(torch.tensor(self.continue_prob, dtype=f64))
        hard = torch.randn(b, 1, generator=g, dtype=f64) * self.heterogeneity
        covered = torch.rand(b, d, generator=g, dtype=f64) < torch.sigmoid(alpha + hard)
        top = torch.rand(b, d, generator=g, dtype=f64) < self.top_share
        u = torch.rand(b, d, generator=g, dtype=f64).clamp(min=1e-12)
        other = 1 + torch.floor(torch.log(u) / math.log(0.5)).to(torch.int64)
        rank = torch.where(covered, torch.where(top, 0, other.clamp(max=UNCOVERED - 1)), UNCOVERED)
        z = torch.randn(b, d, generator=g, dtype=f64) * self.noise
        sign = torch.where(rank == 0, 1.0, -1.0)
        p_top = torch.sigmoid(sign * self.mu() + z).clamp(P_MIN, P_MAX)
        capped = torch.rand(b, generator=g) < self.capped_fraction
        caps = torch.where(capped, torch.randint(0, 4, (b,), generator=g), 1 << 30)
        return SyntheticStep(
            target=torch.randint(0, self.vocab, (b, d), generator=g),
            target_rank=rank,
            onpath_top=p_top.float(),
            seed=torch.randint(0, MODULUS, (b,), generator=g),
            max_nodes=caps.to(torch.int64),
            workload=self,
        )


@dataclass(frozen=True, slots=True)
class SyntheticStep:
    """One decode step of B requests; D = ``target.shape[1]`` depths are modelled."""

    target: Tensor  # [B, D] int64, the target's greedy tokens at depths 1..D
    target_rank: Tensor  # [B, D] int64, rank among the on-path drafter's children, or UNCOVERED
    onpath_top: Tensor  # [B, D] float32, drafter's top-1 prob on the on-path branch at depth d
    seed: Tensor  # [B] int64, off-path hash seed
    max_nodes: Tensor  # [B] int64, per-request draft-node cap this step
    workload: SyntheticWorkload

    @property
    def batch_size(self) -> int:
        return int(self.seed.numel())

    def with_max_nodes(self, max_nodes: Tensor) -> SyntheticStep:
        """The same step with other per-request caps ([B] int64)."""
        return replace(self, max_nodes=max_nodes.to(torch.int64))

    def reachable(self, width: int) -> Tensor:
        """Longest accepted draft a drafter of ``width`` children per node can produce, per
        request: ``max{L: target_rank[b, :L] < width}``, [B] int64."""
        covered = (self.target_rank < width).to(torch.int64)
        return torch.cumprod(covered, dim=1).sum(dim=1)

    def draft(self, pool: TreeBatch, plan: DraftPlan) -> Children:
        """The drafter's top-``k`` children (rank order) of every node (or root) in ``plan``."""
        dev = pool.device
        if plan.root_topk is not None:
            counts = plan.root_topk
            req = torch.repeat_interleave(torch.arange(self.batch_size, device=dev), counts)
            parent = torch.full_like(req, ROOT)
            on_path = torch.ones_like(req, dtype=torch.bool)
            h = self.seed[req] % MODULUS
            depth = torch.ones_like(req)
        else:
            counts = plan.topk
            parent = torch.repeat_interleave(plan.expand, counts)
            req = pool.request_index()[parent]
            on_path = accepted_mask(pool, self.target)[parent]
            h = path_hash(pool, self.seed)[parent]
            depth = pool.depth[parent] + 1
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(req.numel(), device=dev) - torch.repeat_interleave(starts, counts)
        d_max = self.target.shape[1]
        on_path &= depth <= d_max
        col = (depth - 1).clamp(max=d_max - 1)
        vocab = self.workload.vocab
        u = (mix(h * 7 + 3).to(torch.float64) + 0.5) / MODULUS
        z = math.sqrt(2.0) * torch.erfinv(2.0 * u - 1.0) * self.workload.noise
        off = torch.sigmoid(z - self.workload.mu()[col.clamp(max=self.workload.depth - 1)])
        top = torch.where(on_path, self.onpath_top[req, col].double(), off).clamp(P_MIN, P_MAX)
        shift = self.target_rank[req, col].clamp(max=vocab // 2)
        on_tok = (self.target[req, col] + rank - shift) % vocab
        off_tok = mix(h * 131 + rank + 1) % vocab
        logq = torch.log(top) + rank.double() * torch.log1p(-top)
        return Children(
            request=req,
            parent=parent,
            token=torch.where(on_path, on_tok, off_tok),
            draft_logprob=logq.float(),
        )
