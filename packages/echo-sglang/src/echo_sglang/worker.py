"""ECHO's SGLang worker: SGLang's EAGLE worker v2 with ECHO choosing the verify tree.

GPU only (it imports SGLang's EAGLE worker, which needs CUDA builds of torch and SGLang's
kernels); on CPU the same per-step logic (:mod:`~echo_sglang.step`) is tested
against SGLang's Triton kernels. What differs from EAGLE, all in :class:`EchoDraftWorker`:

- ``draft``: EAGLE drafts and builds its own verify input as usual; the pool it hands to
  ``organize_draft_results`` is captured, ECHO selects from it, and the verify tensors are
  overwritten in place (same ``T``, same buffers);
- ``_capture_cuda_graphs``: the draft-decode CUDA graph is dropped after capture, because it bakes
  EAGLE's top-(N - 1) choice in and never returns the scores (the target-verify graphs, with fixed
  ``T``, are untouched). The captured graph's memory is wasted: a GPU to-do.

SGLang builds its draft worker inside ``EAGLEWorkerV2.__init__``; :class:`EchoWorker` adopts it
by switching its class to :class:`EchoDraftWorker`, which adds methods and no constructor.

After each decode verify SGLang calls :meth:`EchoWorker.on_verify_complete_cpu` with the accepted
draft tokens per request, already on the host; it goes to :meth:`EchoStep.observe` (the policy
and the gate drift monitor, :mod:`~echo_sglang.feedback`) and then to EAGLE's own handler (its
adaptive controller, when one is configured).
"""

from __future__ import annotations

from typing import Any

from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from echo_sglang.args import current_args
from echo_sglang.config import EagleShape, resolve
from echo_sglang.pool_capture import capture_draft_pool
from echo_sglang.step import EchoStep, overwrite_verify_input


class EchoDraftWorker(EagleDraftWorker):  # type: ignore[misc]  # sglang ships no type information
    """EAGLE's draft worker whose verify tree ECHO selects (module docstring)."""

    echo_step: EchoStep

    def _capture_cuda_graphs(self) -> None:
        super()._capture_cuda_graphs()
        self.cuda_graph_runner = None

    def draft(self, batch: Any, *, with_topology: bool = False) -> Any:
        if with_topology:
            raise NotImplementedError("ECHO does not support pipeline parallelism yet")
        if batch.forward_mode.is_idle():
            return super().draft(batch)
        with capture_draft_pool() as captured:
            verify_input = super().draft(batch)
        if captured.lists is None:
            raise RuntimeError(
                "ECHO saw no EAGLE draft pool this step (organize_draft_results did not run): "
                "the draft-decode CUDA graph must be off and --speculative-eagle-topk >= 2"
            )
        bs = batch.seq_lens.shape[0]
        root = verify_input.draft_token.view(bs, -1)[:, 0]
        _, layout = self.echo_step.plan(*captured.lists, root, batch.seq_lens)
        overwrite_verify_input(verify_input, layout, self._echo_mask_mode())
        return verify_input

    def _echo_mask_mode(self) -> int:
        verify_mask = self.target_worker.model_runner.attn_backend.verify_mask
        mode = self.tree_mask_mode if verify_mask is None else verify_mask.mode
        return int(mode)


class EchoWorker(EAGLEWorkerV2):  # type: ignore[misc]  # sglang ships no type information
    """SGLang's EAGLE worker v2 driving :class:`EchoDraftWorker`."""

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        spec = get_spec()
        shape = EagleShape(
            spec.speculative_num_steps,
            spec.speculative_eagle_topk,
            spec.speculative_num_draft_tokens,
        )
        config = resolve(current_args(), shape)
        draft = self._draft_worker
        self.echo_step: EchoStep | None = None
        if draft is not None:
            draft.__class__ = EchoDraftWorker
            draft.echo_step = self.echo_step = EchoStep(config)

    def on_verify_complete_cpu(
        self, num_correct_drafts_per_req: list[int], batch_size: int = 0
    ) -> None:
        """SGLang's hook after verify, counts on the host (module docstring)."""
        if self.echo_step is not None:
            self.echo_step.observe(num_correct_drafts_per_req)
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
