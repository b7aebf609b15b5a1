"""A sampled turn as the endpoint answers it: the choice it records (token ids, behaviour
log-probs, version), cut at the first stop string, and the OpenAI response body around it, with
llamarl's additions a client library keeps as extra fields: each choice's `token_ids` and the
response's `policy_version`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from llamarl.agents.record import Choice
from llamarl.agents.tool_formats import call_ids, parse_reply
from llamarl.agents.wire import ChatRequest, Request
from llamarl.engine.model import Policy


def sampled_choice(
    policy: Policy,
    ids: list[int],
    logprobs: list[float],
    version: int,
    stops: Sequence[str],
) -> tuple[Choice, str]:
    """The choice a sampled row makes and its finish reason (stop, or length when cut at its
    token budget): without EOS in its text, and ending where its first stop string begins. The
    tokens kept are those wholly before the stop string, or, when a token holds text on both
    sides of its start, up to that token."""
    eos = policy.eos_id
    ended_with_eos = bool(ids) and ids[-1] == eos
    spoken = ids[:-1] if ended_with_eos else ids
    text = str(policy.tokenizer.decode(spoken, skip_special_tokens=True))
    cuts = [at for at in (text.find(s) for s in stops) if at >= 0]
    if not cuts:
        return Choice(ids, logprobs, version, text, ended_with_eos), ("stop" if ended_with_eos else "length")
    cut = min(cuts)
    size = _kept(policy, spoken, text[:cut])
    return Choice(ids[:size], logprobs[:size], version, text[:cut], False), "stop"


def _kept(policy: Policy, spoken: list[int], before: str) -> int:
    """How many of `spoken` to keep for the text `before` (see `sampled_choice`)."""
    for size in range(len(spoken) + 1):
        prefix = str(policy.tokenizer.decode(spoken[:size], skip_special_tokens=True))
        if prefix == before or len(prefix) > len(before):
            return size
    return len(spoken)


def _chat_logprobs(policy: Policy, choice: Choice) -> dict[str, Any]:
    tokens = policy.tokenizer.convert_ids_to_tokens(choice.ids)
    return {
        "content": [
            {"token": str(t), "logprob": lp, "bytes": list(str(t).encode()), "top_logprobs": []}
            for t, lp in zip(tokens, choice.logprobs, strict=True)
        ]
    }


def _text_logprobs(policy: Policy, choice: Choice) -> dict[str, Any]:
    tokens = [str(t) for t in policy.tokenizer.convert_ids_to_tokens(choice.ids)]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": choice.logprobs,
        "top_logprobs": None,
        "text_offset": offsets,
    }


def reply_of(
    policy: Policy, choice: Choice, tools: list[dict[str, Any]], tool_format: str
) -> tuple[dict[str, Any], int]:
    """The assistant message a sampled turn answers a chat request with, its calls read in
    `tool_format` (`llamarl.agents.tool_formats`), and how many malformed calls it held. A
    family's format is read from the turn's text with its special tokens (`[TOOL_CALLS]` is
    one); a turn without calls answers its plain text."""
    if not tools:
        return {"role": "assistant", "content": choice.text}, 0
    text = choice.text
    if tool_format != "llamarl":
        spoken = choice.ids[:-1] if choice.ended_with_eos else choice.ids
        text = str(policy.tokenizer.decode(spoken, skip_special_tokens=False))
    message, malformed = parse_reply(policy.tokenizer, tool_format, text, tools, call_ids(tool_format))
    if "tool_calls" not in message:
        message = {"role": "assistant", "content": choice.text}
    return message, malformed


def response_body(
    policy: Policy,
    request: Request,
    ident: str,
    model: str,
    context: list[int],
    sampled: list[tuple[Choice, str]],
    tool_format: str = "llamarl",
) -> tuple[list[Choice], dict[str, Any], int]:
    """The choices as the episode keeps them (chat: with the message answered), the body, and
    the malformed tool calls its turns held."""
    chat = isinstance(request, ChatRequest)
    kept, bodies, malformed = [], [], 0
    for index, (choice, finish) in enumerate(sampled):
        body: dict[str, Any] = {"index": index, "finish_reason": finish, "token_ids": choice.ids}
        if isinstance(request, ChatRequest):
            message, bad = reply_of(policy, choice, request.offered_tools(), tool_format)
            malformed += bad
            choice = Choice(**{**vars(choice), "message": message})
            if "tool_calls" in message:
                body["finish_reason"] = "tool_calls"
            body["message"] = message
            body["logprobs"] = _chat_logprobs(policy, choice) if request.logprobs else None
        else:
            body["text"] = choice.text
            body["logprobs"] = _text_logprobs(policy, choice) if request.logprobs else None
        kept.append(choice)
        bodies.append(body)
    completion = sum(len(c.ids) for c in kept)
    return (
        kept,
        {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{ident}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": bodies,
            "usage": {
                "prompt_tokens": len(context),
                "completion_tokens": completion,
                "total_tokens": len(context) + completion,
            },
            "policy_version": kept[0].version if kept else -1,
        },
        malformed,
    )


def error_body(status: int, message: str) -> dict[str, Mapping[str, Any]]:
    """An OpenAI-style error answer."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": status}}
