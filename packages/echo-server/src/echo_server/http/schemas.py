"""Request bodies of the OpenAI-compatible HTTP API, as typed pydantic models.

Only what ECHO can honour exactly is accepted. Fields the OpenAI API defines but ECHO cannot
serve without changing the output distribution (``n > 1``, ``best_of``, ``logprobs``,
penalties, ``logit_bias``, tools, ``echo``, ``suffix``) are declared so that a value other than
their neutral default is refused with 400 naming the field, never silently ignored. Unknown
fields are ignored (clients send ``user``, ``metadata`` and the like).

Extension fields (not in OpenAI's API; the usual ones of other servers where they exist):

- ``top_k`` (int >= 0, 0 = off): sample among the k most likely tokens;
- ``ignore_eos`` (bool): keep generating past end-of-sequence (benchmarks);
- ``policy`` (str): the node's speculative policy name; any other name is refused, as in gRPC;
- ``timeout_s`` (float > 0): a deadline; when it passes the request is cancelled in the engine
  (504, or an error event on a stream).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _Sampling(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # extensions
    top_k: int | None = None
    ignore_eos: bool = False
    policy: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)

    def output_limit(self) -> tuple[str, int | None]:
        """The output-length field the client used and its value."""
        return "max_tokens", self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def unsupported(self) -> dict[str, str]:
        """Fields set to something ECHO cannot serve exactly: name -> why."""
        out: dict[str, str] = {}
        if self.n != 1:
            out["n"] = "only n = 1 is supported"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0.0):
                out[name] = "penalties are not supported (they would change the distribution)"
        if self.logit_bias:
            out["logit_bias"] = "logit_bias is not supported"
        return out


class CompletionBody(_Sampling):
    """``POST /v1/completions``: one prompt, as text or as token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None

    def unsupported(self) -> dict[str, str]:
        out = super().unsupported()
        if self.echo:
            out["echo"] = "echo is not supported"
        if self.best_of not in (None, 1):
            out["best_of"] = "only best_of = 1 is supported"
        if self.logprobs is not None:
            out["logprobs"] = "logprobs are not supported"
        if self.suffix:
            out["suffix"] = "suffix is not supported"
        return out


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionBody(_Sampling):
    """``POST /v1/chat/completions``: messages rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    response_format: dict[str, object] | None = None

    def output_limit(self) -> tuple[str, int | None]:
        """``max_completion_tokens`` (OpenAI's newer name) wins over ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    def unsupported(self) -> dict[str, str]:
        out = super().unsupported()
        if self.logprobs or self.top_logprobs:
            out["logprobs"] = "logprobs are not supported"
        if self.tools:
            out["tools"] = "tool calls are not supported"
        if self.tool_choice not in (None, "none"):
            out["tool_choice"] = "tool calls are not supported"
        if self.response_format is not None and self.response_format.get("type") != "text":
            out["response_format"] = "only the text response format is supported"
        return out
