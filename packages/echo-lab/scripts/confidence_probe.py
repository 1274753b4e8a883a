"""How much separation a learned confidence adds over the head's own probabilities (issue #45).

ECHO allocates by calibrated confidence, so it gains what that confidence tells apart
(docs/MECHANISM.md, "What a head needs"). This probe asks, on the self-distilled data, whether
a small predictor reading what the drafter already has at draft time separates accepted from
rejected drafts better than the head's top-1 probability does. It is a measurement, not a
shipped component.

Rows: every generated position t and depth k = 1..``--depths`` of the head unrolled as
in training (:mod:`echo_server.drafting.unroll`); the depth-k draft is the head's argmax
reading its own depth k-1 prediction and the true path (teacher forcing, as the tree's top-1
chain is when every ancestor was accepted). Labels:

- ``ok_k``  = draft_k == the target's greedy token;
- conditional: ``ok_k`` on the rows where depths 1..k-1 all agreed (what a gate at depth k
  decides on);
- path: ``ok_1 and ... and ok_k`` on every row (what the ranking key compares across requests).

Scores, each evaluated on rows no predictor was fitted on (the module's last paragraph):

- ``head q1``: the head's top-1 probability ``q_(1)`` at depth k (conditional) and the path
  product ``prod_{j<=k} q_(1),j`` (path), what ECHO's key is calibrated from today;
- ``scalars``: logistic regression per depth on ``[log q_(1), log q_(2), q_(1) - q_(2), H(q),
  log p_(1), H(p)]``, with ``p`` the target's own next-token distribution at the root over its
  full vocabulary (free: the target just computed it), ``H`` the entropy in nats;
- ``mlp``: that regression plus a 2-layer MLP (``--hidden`` units) on the head's predicted
  feature ``f^k_t``, those scalars and a one-hot depth, as a residual starting at zero (so it
  starts where the regression ends), trained with binary cross-entropy on the conditional label.

The path score of a learned predictor is the product of its conditional probabilities, the
same product form the key uses. Scored by AUC (:func:`echo_gating.separation.auc`, with its
Hanley-McNeil standard error, which treats positions as independent: positions of one sequence
are not, so the intervals are too narrow) and Brier score.

Where the predictors are fitted (``--fit-on``): the head was trained on the training split, so
there its ``q_(1)`` and features are in-sample. ``heldout-half`` (the default) fits them on the
held-out prompts whose id hashes even (a second hash; see the code) and scores them on the odd
half and on the benchmark answers, none of which the head or the predictors saw; ``train``
fits them on ``--train-seqs`` greedy sequences of the training split and scores them on the
whole held-out split. Both print ``q_(1)``'s AUC on the fitting rows too, to show how far
in-sample rows differ.

    .venv/bin/python packages/echo-lab/scripts/confidence_probe.py \\
        --work-dir ~/.cache/echo-sd/train-mix --head \\
        packages/echo-server/src/echo_server/assets/smollm2-135m-eagle.safetensors
"""

from __future__ import annotations

import argparse
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from echo_gating.separation import auc, auc_standard_error
from echo_lab.training.dataset import batches, load_sequences, make_batch, split
from echo_lab.training.selfdistill import DistilledSequence, is_sampled
from echo_server.drafting.eagle_checkpoint import load_head
from echo_server.drafting.eagle_head import EagleHead
from echo_server.drafting.unroll import pass_mask, unrolled_features
from echo_server.model.loader import load_model

SCALARS = ("log q1", "log q2", "q1 - q2", "H(q)", "log p1", "H(p)")


@dataclass(frozen=True, slots=True)
class Rows:
    """One row per (generated position, depth): features and labels."""

    feature: Tensor  # [N, H] the head's predicted feature f^k_t
    scalars: Tensor  # [N, S] SCALARS
    depth: Tensor  # [N] int64, 1..K
    ok: Tensor  # [N] bool, draft_k == target token
    reached: Tensor  # [N] bool, depths 1..k-1 all agreed
    position: Tensor  # [N] int64, a row id shared by the depths of one (sequence, t)


def _entropy(logits: Tensor) -> Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _root_scalars(features: Tensor, lm_head: Tensor) -> tuple[Tensor, Tensor]:
    """``(log p_(1), H(p))`` of the target's next-token distribution ``p = softmax(f W^T)`` over
    its full vocabulary, for every row of ``features`` ([N, H]), in chunks of 1,024 rows."""
    top, ent = [], []
    for chunk in torch.split(features, 1024):
        logits = chunk.float() @ lm_head.float().T
        top.append(torch.log_softmax(logits, -1).max(-1).values)
        ent.append(_entropy(logits))
    return torch.cat(top), torch.cat(ent)


@torch.no_grad()
def collect(head: EagleHead, seqs: list[DistilledSequence], depths: int, lm_head: Tensor) -> Rows:
    """Unroll ``head`` over ``seqs`` and gather every row whose depths 1..K have labels;
    ``lm_head``: the target's [V, H] output rows (its root distribution)."""
    parts: dict[str, list[Tensor]] = {k: [] for k in Rows.__slots__}
    base = 0
    with_aux = bool(head.config.aux_layers)
    for group in batches(seqs, 4096):
        batch = make_batch(group, with_aux)
        preds = unrolled_features(head, batch.features, batch.tokens, depths, batch.aux)
        t = batch.features.shape[1]
        mask = pass_mask(batch.answer_from, batch.lengths, t, depths)
        mask &= pass_mask(batch.answer_from, batch.lengths, t, 1)
        n = int(mask.sum())
        log_p1, h_p = _root_scalars(batch.features[mask], lm_head)
        chain = torch.ones(n, dtype=torch.bool)
        for k, pred in enumerate(preds, start=1):
            feat = pred[mask]
            logits = head.logits(feat)
            logq = torch.log_softmax(logits.float(), dim=-1)
            top = logq.topk(2, dim=-1)
            draft = head.target_ids(top.indices[:, 0])
            label = F.pad(batch.tokens[:, k + 1 :], (0, k))[:, :t][mask]
            ok = draft == label
            q1, q2 = top.values[:, 0].exp(), top.values[:, 1].exp()
            sc = torch.stack(
                [top.values[:, 0], top.values[:, 1], q1 - q2, _entropy(logits), log_p1, h_p], dim=-1
            )
            parts["feature"].append(feat.float())
            parts["scalars"].append(sc)
            parts["depth"].append(torch.full((n,), k, dtype=torch.int64))
            parts["ok"].append(ok)
            parts["reached"].append(chain.clone())
            parts["position"].append(torch.arange(base, base + n))
            chain &= ok
        base += n
    return Rows(**{k: torch.cat(v) for k, v in parts.items()})


class PerDepthLogistic(nn.Module):
    """Logistic regression on the scalars, one weight vector per depth."""

    def __init__(self, scalars: int, depths: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(depths, scalars))
        self.b = nn.Parameter(torch.zeros(depths))

    def forward(self, scalars: Tensor, depth: Tensor) -> Tensor:
        return (self.w[depth - 1] * scalars).sum(-1) + self.b[depth - 1]


class ConfidenceMLP(nn.Module):
    """``sigmoid(a_k . s + b_k + w2 . silu(W1 [f; s; onehot(k)] + b1) + b2)``: P(accepted |
    reached). The first part is the per-depth logistic regression on the scalars; the MLP on the
    predicted feature is a residual on it, starting at zero, so what it adds is what the
    feature says beyond the scalars."""

    def __init__(self, hidden_size: int, scalars: int, depths: int, width: int) -> None:
        super().__init__()
        self.depths = depths
        self.linear = PerDepthLogistic(scalars, depths)
        self.net = nn.Sequential(
            nn.Linear(hidden_size + scalars + depths, width), nn.SiLU(), nn.Linear(width, 1)
        )
        last = self.net[2]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, feature: Tensor, scalars: Tensor, depth: Tensor) -> Tensor:
        onehot = F.one_hot(depth - 1, self.depths).float()
        residual = self.net(torch.cat([feature, scalars, onehot], dim=-1)).squeeze(-1)
        out: Tensor = self.linear(scalars, depth) + residual
        return out


def _standardize(train: Tensor, *others: Tensor) -> list[Tensor]:
    mu, sd = train.mean(0), train.std(0).clamp_min(1e-6)
    return [(x - mu) / sd for x in (train, *others)]


def fit(model: nn.Module, inputs: list[Tensor], label: Tensor, epochs: int, seed: int) -> None:
    """AdamW (lr 2e-3, weight decay 0.01) + binary cross-entropy on logits, minibatches of
    1,024, ``epochs`` passes."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2)
    n = label.numel()
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, 1024):
            idx = order[start : start + 1024]
            loss = F.binary_cross_entropy_with_logits(
                model(*(x[idx] for x in inputs)), label[idx].float()
            )
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch stub lacks annotations
            opt.step()


def fit_lbfgs(model: nn.Module, inputs: list[Tensor], label: Tensor) -> None:
    """Full-batch L-BFGS on the (convex) logistic loss, to convergence."""
    opt = torch.optim.LBFGS(model.parameters(), max_iter=500, line_search_fn="strong_wolfe")
    target = label.float()

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(*inputs), target)
        loss.backward()  # type: ignore[no-untyped-call]  # torch stub lacks annotations
        return loss

    opt.step(closure)  # type: ignore[no-untyped-call]


def path_scores(rows: Rows, cond_prob: Tensor, depths: int) -> Tensor:
    """The product of conditional probabilities along each position's chain: [N]."""
    n_pos = int(rows.position.max()) + 1
    out = torch.empty_like(cond_prob)
    running = torch.ones(n_pos)
    for k in range(1, depths + 1):
        sel = rows.depth == k
        running = running.clone()
        running[rows.position[sel]] *= cond_prob[sel]
        out[sel] = running[rows.position[sel]]
    return out


def path_labels(rows: Rows) -> Tensor:
    return rows.ok & rows.reached


def _cell(score: Tensor, label: Tensor) -> str:
    a = auc(score, label)
    se = auc_standard_error(a, int(label.sum()), int((~label).sum()))
    brier = float(((score.clamp(0, 1) - label.float()) ** 2).mean())
    return f"{a:.3f} +-{1.96 * se:.3f} (Brier {brier:.3f})"


def report(name: str, rows: Rows, cond: Tensor, depths: int) -> list[str]:
    """Conditional and path AUC per depth of one score (``cond``: P(ok | reached), [N])."""
    path = path_scores(rows, cond, depths)
    lines = []
    for k in range(1, depths + 1):
        at = rows.depth == k
        r = at & rows.reached
        conditional = _cell(cond[r], rows.ok[r])
        lines.append(f"| {name} | {k} | {conditional} | {_cell(path[at], path_labels(rows)[at])} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", type=Path, required=True, help="train-draft's --work-dir")
    p.add_argument("--head", type=Path, required=True)
    p.add_argument("--depths", type=int, default=4)
    p.add_argument("--train-seqs", type=int, default=1500)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fit-on",
        choices=["heldout-half", "train"],
        default="heldout-half",
        help="where the predictors are fitted (module docstring)",
    )
    p.add_argument(
        "--bench",
        nargs="*",
        default=["humaneval", "mtbench"],
        help="also score the target's greedy answers in <work-dir>/bench-<name> (written by "
        "heldout_agreement.py --bench)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_all, heldout = split(load_sequences(args.work_dir / "data"))
    weights = load_model(None).model.weights
    head = load_head(args.head, weights.embed, weights.lm_head)
    head.eval()
    if args.fit_on == "train":
        greedy = [s for s in train_all if not is_sampled(s.prompt_id)]
        step = max(len(greedy) // args.train_seqs, 1)
        fit_seqs, score_seqs = greedy[::step][: args.train_seqs], heldout
        fit_name, score_name = "training split", "held-out"
    else:
        # a hash of its own: held-out ids already share crc32(id) % 20 == 0, so crc32 is even
        odd = [zlib.crc32(b"half:" + s.prompt_id.encode()) % 2 == 1 for s in heldout]
        fit_seqs = [s for s, o in zip(heldout, odd, strict=True) if not o]
        score_seqs = [s for s, o in zip(heldout, odd, strict=True) if o]
        fit_name, score_name = "held-out, even half", "held-out, odd half"
    tr = collect(head, fit_seqs, args.depths, weights.lm_head)
    te = collect(head, score_seqs, args.depths, weights.lm_head)
    print(
        f"fitted on {fit_name}: {len(fit_seqs)} sequences, {int((tr.depth == 1).sum())} "
        f"positions; scored on {score_name}: {len(score_seqs)} sequences, "
        f"{int((te.depth == 1).sum())} positions"
    )
    for k in range(1, args.depths + 1):
        at = te.depth == k
        print(
            f"{score_name} depth {k}: top-1 {float(te.ok[at].float().mean()):.3f}, "
            f"reached {float(te.reached[at].float().mean()):.3f}, "
            f"P(ok | reached) {float(te.ok[at & te.reached].float().mean()):.3f}"
        )
    fitted = report("head q1", tr, tr.scalars[:, 0].exp(), args.depths)
    print(f"\nhead q1 on the fitting rows ({fit_name}):\n" + "\n".join(fitted))

    sets = {score_name: te}
    for name in args.bench:
        bench_dir = args.work_dir / f"bench-{name}"
        if bench_dir.is_dir():
            sets[name] = collect(head, load_sequences(bench_dir), args.depths, weights.lm_head)

    r = tr.reached
    logistic = PerDepthLogistic(len(SCALARS), args.depths)
    fit_lbfgs(logistic, [_standardize(tr.scalars, tr.scalars)[0][r], tr.depth[r]], tr.ok[r])
    mlp = ConfidenceMLP(tr.feature.shape[1], len(SCALARS), args.depths, args.hidden)
    mlp.linear.load_state_dict(logistic.state_dict())  # the residual starts at the regression
    f_tr, s_tr = _standardize(tr.feature)[0], _standardize(tr.scalars)[0]
    fit(mlp, [f_tr[r], s_tr[r], tr.depth[r]], tr.ok[r], args.epochs, args.seed)
    for name, rows in sets.items():
        s_x = _standardize(tr.scalars, rows.scalars)[1]
        f_x = _standardize(tr.feature, rows.feature)[1]
        lines = [
            f"\n{name}: {int((rows.depth == 1).sum())} positions",
            "| score | depth | conditional AUC (95%) | path AUC (95%) |",
            "|---|---:|---|---|",
        ]
        lines += report("head q1", rows, rows.scalars[:, 0].exp(), args.depths)
        with torch.no_grad():
            lines += report("scalars", rows, torch.sigmoid(logistic(s_x, rows.depth)), args.depths)
            lines += report("mlp", rows, torch.sigmoid(mlp(f_x, s_x, rows.depth)), args.depths)
        print("\n".join(lines))
    w = logistic.w.detach()
    print("\nlogistic weights per depth (standardized scalars: " + ", ".join(SCALARS) + ")")
    for k in range(args.depths):
        print(f"  depth {k + 1}: " + " ".join(f"{float(x):+.2f}" for x in w[k]))


if __name__ == "__main__":
    main()
