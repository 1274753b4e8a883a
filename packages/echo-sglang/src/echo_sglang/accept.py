"""SGLang's verify outputs read back as echo-core's :class:`~echo_core.acceptance.AcceptResult`.

SGLang's tree verify kernels (``verify_tree_greedy``, tree speculative sampling) walk the padded
pointers from the root: at each level they take the first sibling whose token matches (greedy) or
is accepted, and write

- ``accept_index`` [B, L] int32: ``accept_index[b, 0]`` is the root's flat slot ``b T``, then the
  flat slots ``b T + 1 + i`` of the accepted nodes in depth order, -1 after;
- ``accept_token_num`` [B] int32: accepted draft nodes (the bonus token not counted; SGLang's
  ``eagle_sample`` returns this plus one as ``accept_lens``);
- ``predicts`` [B T] int32: the target's token at every accepted slot; the bonus token of request
  b is ``predicts[accept_index[b, accept_token_num[b]]]``.

Greedy acceptance agrees with echo-core's ``greedy_accept`` whenever sibling tokens are distinct
(EAGLE's top-k children always are): then at most one sibling matches at each level, so the first
match is the only one. With duplicate sibling tokens SGLang commits to the first matching sibling
while echo-core takes the deepest fully matching path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.acceptance import PAD_NODE, AcceptResult
from echo_scheduler.interface import StepOutcome


def accept_result(
    accept_index: Tensor,  # [B, L] int32/int64, flat padded slots, -1 after the accepted path
    accept_token_num: Tensor,  # [B] int, accepted draft nodes per request
    predicts: Tensor,  # [B * T] int, target token at the accepted slots
    num_draft_tokens: int,  # T
) -> AcceptResult:
    """Translate SGLang's verify outputs (module docstring) into an AcceptResult."""
    b, width = accept_index.shape
    t = num_draft_tokens
    if accept_token_num.shape != (b,) or predicts.shape != (b * t,):
        raise ValueError(
            f"accept_token_num must be [B={b}] and predicts [B*T={b * t}], got "
            f"{tuple(accept_token_num.shape)} and {tuple(predicts.shape)}"
        )
    count = accept_token_num.to(torch.int64)
    if b and bool(((count < 0) | (count >= width)).any()):
        raise ValueError(f"accept_token_num must lie in [0, {width - 1}], got {count.tolist()}")
    index = accept_index.to(torch.int64)
    level = torch.arange(1, width, device=index.device)  # [L - 1]
    valid = level.unsqueeze(0) <= count.unsqueeze(1)  # [B, L - 1]
    base = torch.arange(b, device=index.device).unsqueeze(1) * t
    nodes = torch.where(valid, index[:, 1:] - base - 1, PAD_NODE)
    keep = int(count.max()) if b else 0
    last = index.gather(1, count.unsqueeze(1)).squeeze(1)  # [B] flat slot of the last accepted
    return AcceptResult(
        accepted_nodes=nodes[:, :keep].contiguous(),
        num_accepted=count,
        bonus_token=predicts.to(torch.int64)[last],
    )


def step_outcome(result: AcceptResult, verified: Tensor) -> StepOutcome:
    """Feedback for ``Policy.observe``; verified: [B] int64 draft nodes verified per request."""
    return StepOutcome(accepted_lengths=result.num_accepted, verified=verified.to(torch.int64))
