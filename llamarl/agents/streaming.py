"""A chat completion answered as server-sent events (`stream: true`), in the OpenAI API's chunk
form: per choice, a chunk opening the assistant's message, one with its content (and its
log-probs when asked), one per tool call (whole: its id, name and arguments), and one with its
finish reason and, as in the unstreamed answer, the sampled `token_ids`; with
`stream_options.include_usage`, a last chunk holding the usage; then `data: [DONE]`.

A turn is sampled in a batch with other episodes' turns, so the events follow the whole turn
rather than each token as it is decoded: what a streaming client reads is exactly what the
unstreamed answer holds, and the episode records the same tokens either way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def _event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


def chat_events(body: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """The events of the chat completion `body` (as `llamarl.agents.responses` writes it)."""
    base = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
        "policy_version": body["policy_version"],
    }

    def chunk(index: int, delta: dict[str, Any], **more: Any) -> str:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None} | more
        return _event(base | {"choices": [choice]})

    for choice in body["choices"]:
        index, message = choice["index"], choice["message"]
        yield chunk(index, {"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk(index, {"content": message["content"]}, logprobs=choice["logprobs"])
        for position, call in enumerate(message.get("tool_calls") or []):
            yield chunk(index, {"tool_calls": [{"index": position, **call}]})
        yield chunk(index, {}, finish_reason=choice["finish_reason"], token_ids=choice["token_ids"])
    if include_usage:
        yield _event(base | {"choices": [], "usage": body["usage"]})
    yield "data: [DONE]\n\n"
