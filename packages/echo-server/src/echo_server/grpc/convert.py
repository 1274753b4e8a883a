"""The one place on the node that maps wire messages (echo_proto) to core values and back.

Incoming messages are validated here: a bad field raises :class:`FieldError` naming its path
(``sampling.top_p``) and the reason, which the servicers send as INVALID_ARGUMENT. Proto3
defaults keep their documented meaning (``max_tokens = 0``: the node's default; ``top_p = 0``:
off; an unset ``seed``: drawn by the node). The controller's side of the budget protocol, and
the constants both sides share (``WARMUP_FORMAT``), are in :mod:`echo_controller.convert`.
"""

from __future__ import annotations

import math

import torch

from echo_controller.convert import WARMUP_FORMAT
from echo_controller.errors import FieldError
from echo_core.errors import EchoError
from echo_core.sampling import SamplingParams
from echo_gating.policy import GatePolicy
from echo_gating.record_file import encode_records
from echo_proto.budget.v1 import budget_pb2 as bpb
from echo_proto.serving.v1 import serving_pb2 as spb
from echo_server.engine import FinishReason, GenerationRequest
from echo_server.node.items import Delta, RequestSummary
from echo_server.node.lease import NodeIdentity, NodeReport, ReceivedLease
from echo_server.node.limits import RequestLimits
from echo_server.node.stats import NodeSnapshot

MIN_TEMPERATURE = 1e-6
"""Positive temperatures below this sample as greedy (their limit): ``logits / T`` would
overflow float32 and turn the target distribution into NaNs."""
MIN_TOP_P = torch.finfo(torch.float32).tiny
"""Smaller positive top_p values are raised to this; both keep only the most likely token, but
the smaller ones round to 0 in float32, which the sampler rejects."""

FINISH_REASONS: dict[FinishReason, spb.FinishReason.ValueType] = {
    FinishReason.EOS: spb.FINISH_REASON_EOS,
    FinishReason.STOP: spb.FINISH_REASON_STOP_STRING,
    FinishReason.LENGTH: spb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: spb.FINISH_REASON_ABORTED,
    FinishReason.ERROR: spb.FINISH_REASON_ABORTED,
}


# -- generation API -------------------------------------------------------------------------


def generation_request(
    msg: spb.GenerateRequest, limits: RequestLimits, assigned_id: str
) -> GenerationRequest:
    """A validated core request; ``assigned_id`` is used when the client sent none."""
    rid = msg.request_id or assigned_id
    if len(rid) > limits.max_request_id_chars or not rid.isprintable():
        raise FieldError(
            "request_id", f"must be printable and at most {limits.max_request_id_chars} chars"
        )
    kind = msg.WhichOneof("prompt")
    if kind is None:
        raise FieldError("prompt", "set exactly one of text and token_ids")
    if msg.HasField("policy") and msg.policy != limits.policy:
        raise FieldError("policy", f"this node serves only {limits.policy!r}, got {msg.policy!r}")
    params = sampling_params(msg.sampling, limits)
    if kind == "token_ids":
        if msg.chat:
            raise FieldError("chat", "only valid with a text prompt")
        ids = tuple(msg.token_ids.ids)
        if not ids:
            raise FieldError("token_ids.ids", "needs at least one token id")
        if len(ids) > limits.max_prompt_tokens:
            raise FieldError("token_ids.ids", f"more than {limits.max_prompt_tokens} tokens")
        bad = [t for t in ids if t >= limits.vocab_size]
        if bad:
            raise FieldError(
                "token_ids.ids", f"ids must be < the vocabulary size {limits.vocab_size}: {bad[:3]}"
            )
        return GenerationRequest(rid, prompt_ids=ids, chat=False, params=params)
    if not msg.text.strip():
        raise FieldError("text", "the prompt is empty")
    if len(msg.text) > limits.max_prompt_chars:
        raise FieldError("text", f"longer than {limits.max_prompt_chars} characters")
    return GenerationRequest(rid, prompt=msg.text, chat=msg.chat, params=params)


def sampling_params(msg: spb.SamplingParams, limits: RequestLimits) -> SamplingParams:
    if not math.isfinite(msg.temperature) or msg.temperature < 0:
        raise FieldError("sampling.temperature", f"must be finite and >= 0, got {msg.temperature}")
    if msg.top_k < 0:
        raise FieldError("sampling.top_k", f"must be >= 0, got {msg.top_k}")
    if not (math.isfinite(msg.top_p) and 0.0 <= msg.top_p <= 1.0):
        raise FieldError("sampling.top_p", f"must lie in [0, 1], got {msg.top_p}")
    if msg.max_tokens > limits.max_tokens:
        raise FieldError("sampling.max_tokens", f"must be <= {limits.max_tokens}")
    stops = tuple(msg.stop)
    if len(stops) > limits.max_stop_strings:
        raise FieldError("sampling.stop", f"at most {limits.max_stop_strings} stop strings")
    if any(not s or len(s) > limits.max_stop_chars for s in stops):
        raise FieldError("sampling.stop", f"needs non-empty strings of <= {limits.max_stop_chars}")
    try:
        return SamplingParams(
            temperature=msg.temperature if msg.temperature >= MIN_TEMPERATURE else 0.0,
            top_k=msg.top_k,
            top_p=max(msg.top_p, MIN_TOP_P) if msg.top_p > 0 else 1.0,
            max_tokens=msg.max_tokens or limits.default_max_tokens,
            seed=msg.seed if msg.HasField("seed") else None,
            stop=stops,
            ignore_eos=msg.ignore_eos,
        )
    except EchoError as exc:  # belt and braces: core validation has the last word
        raise FieldError("sampling", str(exc)) from exc


def request_stats(s: RequestSummary) -> spb.RequestStats:
    return spb.RequestStats(
        prompt_tokens=s.prompt_tokens,
        output_tokens=len(s.token_ids),
        decode_steps=s.steps,
        mean_accepted_length=s.mean_accepted_length,
        draft_tokens_verified=s.verified,
        draft_tokens_accepted=s.accepted,
        draft_yield=s.draft_yield,
        queue_ms=s.queue_ms,
        time_to_first_token_ms=s.ttft_ms,
        total_ms=s.total_ms,
    )


def generate_response(s: RequestSummary) -> spb.GenerateResponse:
    return spb.GenerateResponse(
        request_id=s.request_id,
        text=s.text,
        token_ids=s.token_ids,
        finish_reason=FINISH_REASONS[s.finish_reason],
        stats=request_stats(s),
    )


def stream_delta(d: Delta) -> spb.GenerateStreamResponse:
    return spb.GenerateStreamResponse(delta=spb.TokenDelta(token_ids=d.token_ids, text=d.text))


def stream_final(s: RequestSummary) -> spb.GenerateStreamResponse:
    final = spb.GenerateStreamFinal(
        request_id=s.request_id,
        finish_reason=FINISH_REASONS[s.finish_reason],
        stats=request_stats(s),
    )
    return spb.GenerateStreamResponse(final=final)


def stats_response(
    node_id: str,
    snap: NodeSnapshot,
    policy: str,
    lease: ReceivedLease | None,
    max_batch: int,
    max_waiting: int,
) -> spb.GetStatsResponse:
    return spb.GetStatsResponse(
        node_id=node_id,
        running=snap.running,
        waiting=snap.waiting,
        tokens_per_second=snap.tokens_per_second,
        mean_accepted_length=snap.mean_accepted_length,
        draft_yield=snap.draft_yield,
        verified_tokens_per_step=snap.verified_per_step,
        budget_k=snap.budget_k,
        window_s=snap.window_s,
        steps_total=snap.steps_total,
        output_tokens_total=snap.output_tokens_total,
        policy=policy,
        lease_budget_k=lease.budget_k if lease is not None else 0,
        lease_epoch=lease.epoch if lease is not None else 0,
        gate_policy_version=snap.gate_policy_version,
        max_batch=max_batch,
        max_waiting=max_waiting,
    )


# -- budget control plane: node side ------------------------------------------------------------


def register_request(node: NodeIdentity) -> bpb.RegisterNodeRequest:
    return bpb.RegisterNodeRequest(
        node_id=node.node_id,
        hardware=bpb.Hardware(accelerator=node.accelerator, device_count=node.device_count),
        models=bpb.ModelPair(target=node.target, drafter=node.drafter),
        verify_cost=[
            bpb.VerifyCostPoint(total_tokens=t, latency_ms=ms) for t, ms in node.verify_cost
        ],
        pool=node.pool,
        k_max=node.k_max,
    )


def report_request(node_id: str, registration: int, r: NodeReport) -> bpb.ReportRequest:
    records = encode_records(r.records) if r.records is not None and len(r.records) else b""
    return bpb.ReportRequest(
        node_id=node_id,
        registration_epoch=registration,
        load=bpb.Load(running=r.running, waiting=r.waiting),
        utility=bpb.MarginalUtility(budget_step=r.budget_step, accepted_per_token=r.utility),
        acceptance=bpb.AcceptanceStats(
            window_ms=r.window_ms,
            steps=r.steps,
            draft_tokens_verified=r.verified,
            draft_tokens_accepted=r.accepted,
            mean_accepted_length=r.mean_accepted_length,
        ),
        lease_epoch=r.lease_epoch,
        warmup_records=records,
        warmup_format=WARMUP_FORMAT if records else "",
        drift_detected=r.drift_reason is not None,
        drift_reason=r.drift_reason or "",
        gate_policy_version=r.gate_policy_version,
    )


def received_lease(msg: bpb.Lease, now: float) -> ReceivedLease:
    if msg.ttl_ms < 1 or msg.epoch < 1:
        raise FieldError(
            "lease", f"needs ttl_ms >= 1 and epoch >= 1, got {msg.ttl_ms}, {msg.epoch}"
        )
    return ReceivedLease(msg.budget_k, msg.epoch, msg.ttl_ms, msg.gate_policy_version, now)


def gate_policy(msg: bpb.GatePolicyArtifact) -> GatePolicy:
    try:
        policy = GatePolicy.from_json(msg.json)
    except EchoError as exc:
        raise FieldError("gate_policy.json", str(exc)) from exc
    if policy.version != msg.version:
        raise FieldError("gate_policy.version", f"{msg.version!r} != {policy.version!r} inside")
    return policy
