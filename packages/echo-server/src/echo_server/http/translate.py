"""HTTP bodies to the node's generation request, and finished requests to OpenAI's shapes.

Validation has one definition: a body becomes the same ``GenerateRequest`` message a gRPC
client would send and goes through :func:`echo_server.grpc.convert.generation_request`, so both
APIs accept and refuse exactly the same values. Only the field names differ, mapped back here
(``sampling.top_p`` -> ``top_p``). Values the wire types cannot hold (a negative
``max_tokens``, a seed outside uint64) are refused before that.

Finish reasons: end-of-sequence and stop strings are ``stop``, the token limit is ``length``.
"""

from __future__ import annotations

import time

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from pydantic import BaseModel

from echo_controller.errors import FieldError
from echo_core.errors import EchoError
from echo_proto.serving.v1 import serving_pb2 as spb
from echo_server.engine import FinishReason, GenerationRequest
from echo_server.grpc import convert
from echo_server.http.errors import ApiError
from echo_server.http.schemas import ChatCompletionBody, CompletionBody
from echo_server.model.tokenizer import Tokenizer
from echo_server.node.items import RequestSummary
from echo_server.node.limits import RequestLimits

UINT32_MAX, INT32_MAX, UINT64_MAX = 2**32 - 1, 2**31 - 1, 2**64 - 1
FINISH = {FinishReason.EOS: "stop", FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


def completion_request(
    body: CompletionBody, limits: RequestLimits, request_id: str
) -> GenerationRequest:
    """The core request of ``POST /v1/completions`` (raw prompt: no chat template)."""
    msg = spb.GenerateRequest(request_id=request_id, sampling=_sampling(body))
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(400, "prompt: exactly one prompt per request (n = 1)", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        msg.text = prompt
    else:
        ids = [t for t in prompt if isinstance(t, int)]
        if len(ids) != len(prompt) or any(t < 0 or t > UINT32_MAX for t in ids):
            raise ApiError(400, "prompt: token ids must be non-negative integers", "prompt")
        msg.token_ids.ids.extend(ids)
    return _validated(msg, body, limits, "prompt")


def chat_request(
    body: ChatCompletionBody, limits: RequestLimits, tokenizer: Tokenizer, request_id: str
) -> GenerationRequest:
    """The core request of ``POST /v1/chat/completions``: the messages rendered with the
    model's chat template (the same ids the gRPC ``chat`` flag gives for one user turn)."""
    msg = spb.GenerateRequest(request_id=request_id, sampling=_sampling(body))
    try:
        msg.text = tokenizer.render_chat(
            [{"role": m.role, "content": m.text()} for m in body.messages]
        )
    except EchoError as exc:  # the model has no chat template
        raise ApiError(400, f"messages: {exc}", "messages") from exc
    except Exception as exc:  # the template refused the conversation (jinja raise_exception)
        raise ApiError(400, f"messages: the chat template refused them: {exc}", "messages") from exc
    return _validated(msg, body, limits, "messages")


def _sampling(body: CompletionBody | ChatCompletionBody) -> spb.SamplingParams:
    for name, why in body.unsupported().items():
        raise ApiError(400, f"{name}: {why}", name)
    limit_name, max_tokens = body.output_limit()
    if max_tokens is not None and not 1 <= max_tokens <= UINT32_MAX:
        raise ApiError(400, f"{limit_name}: must be >= 1, got {max_tokens}", limit_name)
    if body.seed is not None and not 0 <= body.seed <= UINT64_MAX:
        raise ApiError(400, f"seed: must lie in [0, 2**64), got {body.seed}", "seed")
    if body.top_k is not None and not 0 <= body.top_k <= INT32_MAX:
        raise ApiError(400, f"top_k: must be >= 0 (0 = off), got {body.top_k}", "top_k")
    params = spb.SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        max_tokens=max_tokens or 0,
        stop=body.stop_strings(),
        ignore_eos=body.ignore_eos,
    )
    if body.seed is not None:
        params.seed = body.seed
    return params


def _validated(
    msg: spb.GenerateRequest,
    body: CompletionBody | ChatCompletionBody,
    limits: RequestLimits,
    prompt_name: str,
) -> GenerationRequest:
    if body.policy is not None:
        msg.policy = body.policy
    try:
        return convert.generation_request(msg, limits, msg.request_id)
    except FieldError as exc:
        name = _http_field(exc.field, prompt_name, body.output_limit()[0])
        raise ApiError(400, f"{name}: {exc.reason}", name) from exc


def _http_field(grpc_field: str, prompt_name: str, limit_name: str) -> str:
    if grpc_field in ("text", "token_ids.ids", "prompt"):
        return prompt_name
    name = grpc_field.removeprefix("sampling.")
    return limit_name if name == "max_tokens" else name


# -- responses -----------------------------------------------------------------------------------


def finish_reason(s: RequestSummary) -> str:
    """OpenAI's finish reason; a cancelled or failed request has none (it is an error)."""
    if s.finish_reason not in FINISH:
        raise ApiError(
            503 if s.finish_reason is FinishReason.CANCELLED else 500,
            f"the request ended early: {s.finish_reason.value}",
        )
    return FINISH[s.finish_reason]


def usage(s: RequestSummary) -> CompletionUsage:
    out = len(s.token_ids)
    return CompletionUsage(
        prompt_tokens=s.prompt_tokens, completion_tokens=out, total_tokens=s.prompt_tokens + out
    )


def echo_stats(s: RequestSummary) -> dict[str, float | int]:
    """ECHO's per-request speculation stats (the gRPC RequestStats), an extension field."""
    return {
        "decode_steps": s.steps,
        "mean_accepted_length": s.mean_accepted_length,
        "draft_tokens_verified": s.verified,
        "draft_tokens_accepted": s.accepted,
        "draft_yield": s.draft_yield,
        "queue_ms": s.queue_ms,
        "time_to_first_token_ms": s.ttft_ms,
        "total_ms": s.total_ms,
    }


def with_stats(reply: BaseModel, s: RequestSummary) -> None:
    """Attach :func:`echo_stats` as the ``echo`` field (OpenAI's models allow extra fields)."""
    setattr(reply, "echo", echo_stats(s))  # noqa: B010 (not a declared field)


def completion(s: RequestSummary, model: str, created: int) -> Completion:
    choice = CompletionChoice(index=0, text=s.text, finish_reason=finish_reason(s))  # type: ignore[arg-type]
    out = Completion(
        id=f"cmpl-{s.request_id}",
        object="text_completion",
        created=created,
        model=model,
        choices=[choice],
        usage=usage(s),
    )
    with_stats(out, s)
    return out


def chat_completion(s: RequestSummary, model: str, created: int) -> ChatCompletion:
    message = ChatCompletionMessage(role="assistant", content=s.text)
    choice = ChatChoice(index=0, message=message, finish_reason=finish_reason(s))  # type: ignore[arg-type]
    out = ChatCompletion(
        id=f"chatcmpl-{s.request_id}",
        object="chat.completion",
        created=created,
        model=model,
        choices=[choice],
        usage=usage(s),
    )
    with_stats(out, s)
    return out


def completion_chunk(
    request_id: str, model: str, created: int, text: str, finish: str | None = None
) -> Completion:
    """One streamed piece of a completion (OpenAI streams completions as ``Completion``s)."""
    choice = CompletionChoice.model_construct(
        index=0, text=text, finish_reason=finish, logprobs=None
    )
    return Completion.model_construct(
        id=f"cmpl-{request_id}",
        object="text_completion",
        created=created,
        model=model,
        choices=[choice],
    )


def chat_chunk(
    request_id: str,
    model: str,
    created: int,
    delta: ChoiceDelta,
    finish: str | None = None,
) -> ChatCompletionChunk:
    choice = ChunkChoice(index=0, delta=delta, finish_reason=finish)  # type: ignore[arg-type]
    return ChatCompletionChunk(
        id=f"chatcmpl-{request_id}",
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=[choice],
    )


def now() -> int:
    return int(time.time())
