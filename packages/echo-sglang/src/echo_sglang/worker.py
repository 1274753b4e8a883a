"""ECHO's SGLang worker: SGLang's EAGLE worker v2 with ECHO choosing the verify tree.

GPU only (it imports SGLang's EAGLE worker, which needs CUDA builds of torch and SGLang's
kernels); on CPU the same per-step logic (:mod:`~echo_sglang.step`) is tested
against SGLang's Triton kernels. What differs from EAGLE, all in :class:`EchoDraftWorker`:

- ``draft``: EAGLE drafts and builds its own verify input as usual; the pool it hands to
  ``organize_draft_results`` is captured, ECHO selects from it, and the verify tensors are
  overwritten in place (same ``T``, same buffers);
- ``draft_forward`` / ``_capture_cuda_graphs``: the draft-decode CUDA graph is kept. During its
  capture the pool handed to ``organize_draft_results`` is recorded per graph; after a replay the
  same tensors hold that step's pool (:mod:`~echo_sglang.graph_pool`). The graph still computes
  EAGLE's own top-(N - 1) tree, which ECHO then overwrites (a few small kernels per step).

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
from echo_sglang.graph_pool import DraftGraphPools, stream_capturing
from echo_sglang.pool_capture import capture_draft_pool
from echo_sglang.step import EchoStep, overwrite_verify_input


class EchoDraftWorker(EagleDraftWorker):  # type: ignore[misc]  # sglang ships no type information
    """EAGLE's draft worker whose verify tree ECHO selects (module docstring)."""

    echo_step: EchoStep
    echo_graph_pools: DraftGraphPools

    def _capture_cuda_graphs(self) -> None:
        pools = DraftGraphPools(rejection_sampling=get_spec().speculative_use_rejection_sampling)
        self.echo_graph_pools = pools
        super()._capture_cuda_graphs()
        runner = self.cuda_graph_runner
        if runner is None:
            return
        if not pools:
            raise RuntimeError(
                "SGLang captured a draft-decode CUDA graph but ECHO recorded no draft pool in it: "
                "organize_draft_results did not run inside a capture (--speculative-eagle-topk "
                "must be >= 2), or the graph backend ran the draft eagerly while capturing (a "
                "debug/eager CUDA-graph mode; turn the draft-decode graph off for it)"
            )
        runner.execute = pools.watch(runner.execute, runner)

    def draft_forward(self, forward_batch: Any) -> Any:
        if not stream_capturing():
            return super().draft_forward(forward_batch)
        with capture_draft_pool() as captured:
            out = super().draft_forward(forward_batch)
        if captured.lists is not None:
            info = forward_batch.sampling_info
            self.echo_graph_pools.record(
                captured.lists, all_greedy=info is not None and bool(info.is_all_greedy)
            )
        return out

    def draft(self, batch: Any, *, with_topology: bool = False) -> Any:
        if with_topology:
            raise NotImplementedError("ECHO does not support pipeline parallelism yet")
        if batch.forward_mode.is_idle():
            return super().draft(batch)
        pools = getattr(self, "echo_graph_pools", None)
        if pools is not None:
            pools.take_replay()  # forget a replay no step consumed
        with capture_draft_pool() as captured:
            verify_input = super().draft(batch)
        bs = batch.seq_lens.shape[0]
        lists = captured.lists  # set when the draft ran eagerly
        replay = None if pools is None else pools.take_replay()
        if lists is None and pools is not None and replay is not None:
            lists = pools.read(replay, bs)  # the draft graph replayed
        if lists is None:
            raise RuntimeError(
                "ECHO saw no EAGLE draft pool this step (organize_draft_results did not run and "
                "no draft-decode CUDA graph replayed): --speculative-eagle-topk must be >= 2"
            )
        root = verify_input.draft_token.view(bs, -1)[:, 0]
        step = self.echo_step
        layout = step.plan_layout(*lists, root, batch.seq_lens)
        mode = self._echo_mask_mode()
        overwrite_verify_input(verify_input, layout, mode, prefix_filled=step.sync_free)
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
