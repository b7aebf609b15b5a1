"""The requests the endpoint accepts, checked field by field: the OpenAI API's chat and text
completion bodies, the fields llamarl serves and the ones it may ignore (named below), and
nothing else: an unknown field is refused rather than silently dropped."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=512)
    n: int = Field(1, ge=1, le=64)
    temperature: float | None = Field(None, ge=0, le=10)
    """Accepted; training turns are sampled at generation.temperature (counted when it differs)."""
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: Literal[False] | None = None
    """Text completions are answered whole; chat completions may stream (ChatRequest)."""
    frequency_penalty: float | None = Field(None, ge=0, le=0)
    presence_penalty: float | None = Field(None, ge=0, le=0)
    # Accepted and ignored: they change nothing here (seeding is the run's).
    user: str | None = None
    seed: int | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    stream_options: dict[str, Any] | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        found = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in found if s]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # Accepted and ignored: what client libraries echo back of an answer.
    refusal: str | None = None
    reasoning_content: str | None = None
    annotations: list[dict[str, Any]] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None


class ToolFunction(BaseModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    type: Literal["function"]
    function: ToolFunction


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = None  # type: ignore[assignment]
    """Answered as server-sent events (`llamarl.agents.streaming`)."""
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: Literal[0] | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["auto", "none"] | None = None

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def offered_tools(self) -> list[dict[str, Any]]:
        """The tools as the client sent them (no field it left out added as null: the chat
        template writes them into the prompt, and a warm start renders them as given)."""
        return [] if self.tool_choice == "none" else [t.model_dump(exclude_unset=True) for t in self.tools or []]


class CompletionRequest(_Body):
    prompt: str | list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    logprobs: Literal[0, 1] | None = None
    echo: Literal[False] | None = None

    def limit(self) -> int | None:
        return self.max_tokens


Request = ChatRequest | CompletionRequest


def problem(err: ValidationError) -> str:
    """The first thing wrong with a body, in one line naming its field."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    if first["type"] == "extra_forbidden":
        return f"{where}: unknown field; see docs/environments.md for the fields served"
    return f"{where}: {first['msg']}"
