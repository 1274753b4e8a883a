"""Test and benchmark fixtures; production code never imports this module.

Synthetic warm-up data with known answers, shaped like the paper's observation.

Generative model per (request, step), depths ``d = 1..D``:

- accepted length: ``y_d = prod_{j <= d} Bernoulli(alpha_j)`` (a depth is accepted only if every
  shallower one was), so the prior is ``pi_d = P(y_d = 1) = prod_{j <= d} alpha_j``;
- layer confidence ``c_d = sigmoid(z_d)`` with ``z_d | y_d = 1 ~ N(+mu_d, sigma_1^2)`` and
  ``z_d | y_d = 0 ~ N(-mu_d, sigma_0^2)``, ``mu_d = spread * s_d``. With the defaults
  (``spread = logit 0.9``) accepted confidences cluster near 0.9 and rejected near 0.1 where the
  separation ``s_d = 1``, and the clusters merge (``s_d -> 0``) with depth;
- ``width`` nodes per depth: the top node has path score ``c_d``, siblings ``c_d * U(0.05,
  0.95)``; when ``y_d = 1`` the top node is the accepted one with probability ``top_share``.

Known answers (``z = logit c``, ``phi`` / ``Phi`` the normal density / CDF):

- ``P(y_d = 1 | c) = pi phi1(z) / (pi phi1(z) + (1 - pi) phi0(z))``
  (:meth:`SyntheticSpec.true_accept_probability`);
- ``AUC_d = Phi(2 mu_d / sqrt(sigma_1^2 + sigma_0^2))`` (:meth:`true_auc`);
- expected net gain of threshold tau at cost ratio r:
  ``U(tau) = (1 - r) pi (1 - Phi1(logit tau)) - r (1 - pi) (1 - Phi0(logit tau))``.

Depths are drawn independently given the accepted length (confidences are not forced to decrease
with depth); calibration only consumes per-depth marginals, which this model gets exactly.

Worked example: defaults at depth 1: ``mu = 2.197``, ``sigma = 1.5`` -> AUC = Phi(2.07) = 0.981.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_gating.errors import GatingError
from echo_gating.maps import AcceptanceMaps, DepthMap
from echo_gating.policy import GateMode, GatePolicy
from echo_gating.records import GateSamples, RecordSet

LOGIT_0_9 = math.log(9.0)


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """Parameters of the synthetic warm-up model (see the module docstring)."""

    separation: tuple[float, ...] = (1.0, 0.9, 0.75, 0.3, 0.1, 0.0, 0.0, 0.0)  # s_d per depth
    continue_prob: tuple[float, ...] = (0.9, 0.85, 0.8, 0.75, 0.7, 0.7, 0.7, 0.7)  # alpha_d
    spread: float = LOGIT_0_9
    sigma_accepted: float = 1.5
    sigma_rejected: float = 1.5
    width: int = 1
    top_share: float = 0.85

    def __post_init__(self) -> None:
        if not self.separation or len(self.continue_prob) != len(self.separation):
            raise GatingError(
                f"need one separation and one continue_prob per depth, got "
                f"{len(self.separation)} and {len(self.continue_prob)}"
            )
        if not all(0.0 < a <= 1.0 for a in self.continue_prob):
            raise GatingError(f"continue_prob must lie in (0, 1], got {self.continue_prob}")
        if min(self.sigma_accepted, self.sigma_rejected) <= 0 or self.width < 1:
            raise GatingError("sigmas must be > 0 and width >= 1")

    @property
    def max_depth(self) -> int:
        return len(self.separation)

    def prior(self, depth: int) -> float:
        """``pi_d = P(request accepts a token at depth d)``."""
        return math.prod(self.continue_prob[:depth])

    def mu(self, depth: int) -> float:
        return self.spread * self.separation[depth - 1]

    def true_auc(self, depth: int) -> float:
        s = math.hypot(self.sigma_accepted, self.sigma_rejected)
        return 0.5 * math.erfc(-2.0 * self.mu(depth) / s / math.sqrt(2.0))

    def true_accept_probability(self, depth: int, confidence: Tensor) -> Tensor:
        """``P(y_d = 1 | c)``: [n] float -> [n] float64."""
        z = torch.logit(confidence.to(torch.float64).clamp(1e-12, 1 - 1e-12))
        pi, mu = self.prior(depth), self.mu(depth)
        if pi >= 1.0:
            return torch.ones_like(z)
        log1 = _normal_logpdf(z, mu, self.sigma_accepted) + math.log(pi)
        log0 = _normal_logpdf(z, -mu, self.sigma_rejected) + math.log1p(-pi)
        return torch.sigmoid(log1 - log0)

    def expected_utility(self, depth: int, tau: Tensor, cost_ratio: float) -> Tensor:
        """``U(tau)`` per gate sample (module docstring): [k] float -> [k] float64."""
        z = torch.logit(tau.to(torch.float64).clamp(1e-12, 1 - 1e-12))
        pi, mu = self.prior(depth), self.mu(depth)
        pass1: Tensor = torch.special.ndtr(-(z - mu) / self.sigma_accepted)
        pass0: Tensor = torch.special.ndtr(-(z + mu) / self.sigma_rejected)
        return pass1 * ((1 - cost_ratio) * pi) - pass0 * (cost_ratio * (1 - pi))

    def optimal_threshold(self, depth: int, cost_ratio: float) -> float:
        """``argmax_tau U(tau)`` on a fine grid of logits in [-12, 12]."""
        tau = torch.sigmoid(torch.linspace(-12, 12, 24001, dtype=torch.float64))
        return float(tau[torch.argmax(self.expected_utility(depth, tau, cost_ratio))])

    def youden_optimum(self, depth: int) -> float:
        """``argmax_tau TPR - FPR`` on the same grid."""
        z = torch.linspace(-12, 12, 24001, dtype=torch.float64)
        mu = self.mu(depth)
        j: Tensor = torch.special.ndtr(-(z - mu) / self.sigma_accepted) - torch.special.ndtr(
            -(z + mu) / self.sigma_rejected
        )
        return float(torch.sigmoid(z[torch.argmax(j)]))


def synthetic_records(
    spec: SyntheticSpec,
    generator: torch.Generator,
    num_requests: int,
    steps: int,
    meta: Mapping[str, str] | None = None,
) -> RecordSet:
    """Warm-up records of ``num_requests * steps`` fully drafted steps under ``spec``."""
    if num_requests < 1 or steps < 1:
        raise GatingError(f"need num_requests >= 1 and steps >= 1, got {num_requests}, {steps}")
    m, d, w = num_requests * steps, spec.max_depth, spec.width
    alpha = torch.tensor(spec.continue_prob, dtype=torch.float64)
    y = torch.cumprod(
        (torch.rand(m, d, generator=generator, dtype=torch.float64) < alpha).long(), 1
    )
    y = y.bool()  # [m, d]
    mu = spec.spread * torch.tensor(spec.separation, dtype=torch.float64)
    noise = torch.randn(m, d, generator=generator, dtype=torch.float64)
    z = torch.where(y, mu + spec.sigma_accepted * noise, -mu + spec.sigma_rejected * noise)
    top = torch.nn.functional.logsigmoid(z).clamp(min=-30.0)  # [m, d] log c_d
    scale = 0.05 + 0.9 * torch.rand(m, d, w, generator=generator, dtype=torch.float64)
    scale[:, :, 0] = 1.0
    path = top.unsqueeze(2) + scale.log()  # [m, d, w]
    prev_top = torch.cat([torch.zeros(m, 1, dtype=torch.float64), top[:, :-1]], dim=1)
    draft = (path - prev_top.unsqueeze(2)).clamp(max=0.0)
    pick_top = torch.rand(m, d, generator=generator) < spec.top_share
    other = 1 + torch.randint(0, max(w - 1, 1), (m, d), generator=generator)
    winner = torch.where(pick_top, torch.zeros_like(other), other) if w > 1 else other * 0
    accepted = y.unsqueeze(2) & (torch.arange(w) == winner.unsqueeze(2))  # [m, d, w]
    sample = torch.arange(m).view(m, 1, 1).expand(m, d, w)
    depth = torch.arange(1, d + 1).view(1, d, 1).expand(m, d, w)
    return RecordSet(
        request_id=(sample // steps).reshape(-1),
        step=(sample % steps).reshape(-1),
        depth=depth.reshape(-1).contiguous(),
        path_logprob=path.reshape(-1).to(torch.float32),
        draft_logprob=draft.reshape(-1).to(torch.float32),
        layer_confidence=top.exp().unsqueeze(2).expand(m, d, w).reshape(-1).to(torch.float32),
        accepted=accepted.reshape(-1),
        meta=dict(meta) if meta is not None else {"target": "synthetic", "drafter": "synthetic"},
    )


def _normal_logpdf(x: Tensor, mean: float, sigma: float) -> Tensor:
    return -0.5 * ((x - mean) / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)


def simulated_chain_samples(
    generator: torch.Generator,
    num_steps: int,
    max_depth: int = 4,
    vocab: int = 64,
    alignment: float = 0.8,
    logit_scale: float = 3.0,
) -> GateSamples:
    """Gate samples from a mechanistic draft/target pair (no assumed class densities).

    Per step and depth, target logits ``t ~ N(0, s^2)`` over ``vocab`` tokens and draft logits
    ``a t + sqrt(1 - a^2) e`` with ``e ~ N(0, s^2)`` (``a = alignment``). The draft proposes its
    argmax; greedy verification accepts it iff it is the target argmax; depth d is accepted iff
    depths 1..d all are; the layer confidence is the chain's path score ``prod_j max q_j``.
    A "real-ish" benchmark for thresholds: the answer is only known empirically.
    """
    if not 0.0 <= alignment <= 1.0 or num_steps < 1 or max_depth < 1 or vocab < 2:
        raise GatingError(
            f"need alignment in [0, 1], num_steps, max_depth >= 1, vocab >= 2; got "
            f"{alignment}, {num_steps}, {max_depth}, {vocab}"
        )
    shape = (num_steps, max_depth, vocab)
    target = logit_scale * torch.randn(shape, generator=generator)
    noise = logit_scale * torch.randn(shape, generator=generator)
    draft = alignment * target + math.sqrt(1.0 - alignment**2) * noise
    q_max, proposal = torch.log_softmax(draft, dim=-1).max(dim=-1)  # [n, D]
    hit = torch.cumprod((proposal == target.argmax(dim=-1)).long(), dim=1).bool()
    conf = torch.cumsum(q_max, dim=1).exp()
    depth = torch.arange(1, max_depth + 1).expand(num_steps, max_depth)
    return GateSamples(
        depth=depth.reshape(-1).contiguous(), confidence=conf.reshape(-1), accepted=hit.reshape(-1)
    )


def stepped_gate() -> GatePolicy:
    """A GatePolicy with hand-set acceptance maps and no checkpoint: a depth-1 node is worth 0.2
    below a log path score of -1 and 0.9 from it, a depth-2 node 0.3 / 0.6 around -2, deeper
    nodes 0.05 whatever their score."""
    maps = AcceptanceMaps(
        (
            DepthMap(edges=(-1.0,), values=(0.2, 0.9), counts=(10, 10)),
            DepthMap(edges=(-2.0,), values=(0.3, 0.6), counts=(10, 10)),
            DepthMap(edges=(), values=(0.05,), counts=(20,)),
        )
    )
    return GatePolicy(
        version="t", mode=GateMode.NONE, thresholds={}, acceptance_maps=maps, max_depth=3
    )
