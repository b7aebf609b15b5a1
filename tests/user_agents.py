"""Agents for the endpoint tests, importable as `tests.user_agents:name` like a user's: plain
`openai` client code. What they saw is kept by the episode's key (`SEEN`, `OUTCOMES`) for the
test to compare with what the runner recorded. Every text they write uses the built model's
characters (digits, `+-*= `), so its character tokenizer spells it exactly."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import openai

SEEN: dict[str, list[dict[str, Any]]] = {}
"""key -> each answer's first choice: token_ids, log-probs, policy_version."""
OUTCOMES: dict[str, list[str]] = {}
"""key -> what each of its refused requests was answered (the error's class name)."""
FINISHED_KEYS: list[str] = []
"""Keys of episodes whose agent has returned (a later agent tries them: stale keys)."""
RELEASE = threading.Event()
"""Set by a test to let a blocked agent go."""


def _keep(client: Any, reply: Any) -> None:
    choice = reply.choices[0]
    logprobs = [t.logprob for t in choice.logprobs.content] if choice.logprobs else []
    SEEN.setdefault(client.api_key, []).append(
        {
            "token_ids": choice.model_extra["token_ids"],
            "logprobs": logprobs,
            "policy_version": reply.model_extra["policy_version"],
            "message": choice.message.model_dump(exclude_none=True) if hasattr(choice, "message") else None,
            "finish_reason": choice.finish_reason,
        }
    )


async def three_turns(row: dict[str, Any], client: Any) -> float:
    """Three turns, each answered with `+1 `; the reward is the prompt's index parity."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6, logprobs=True)
        _keep(client, reply)
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "+1 "})
    FINISHED_KEYS.append(client.api_key)
    return float(row["a"] % 2)


async def text_turns(row: dict[str, Any], client: Any) -> None:
    """Two text completions, the second prompt the first, its completion and `= `."""
    prompt = row["prompt"]
    for _ in range(2):
        reply = await client.completions.create(model="policy", prompt=prompt, max_tokens=5)
        _keep(client, reply)
        prompt = prompt + reply.choices[0].text + "= "


async def _refused(client: Any, call: Any) -> None:
    try:
        await call
    except openai.APIStatusError as err:
        OUTCOMES.setdefault(client.api_key, []).append(type(err).__name__)


async def forger(row: dict[str, Any], client: Any) -> None:
    """A request with a forged key, then one with each finished episode's key, then its own."""
    forged = client.with_options(api_key=client.api_key.split(".")[0] + ".forged")
    await _refused(client, forged.models.list())
    for key in FINISHED_KEYS:
        stale = client.with_options(api_key=key)
        message = {"role": "user", "content": "1"}
        await _refused(client, stale.chat.completions.create(model="p", messages=[message]))
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=3
    )
    _keep(client, reply)


async def one_request(client: Any, row: dict[str, Any]) -> Any:
    return await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=4
    )


async def misbehaves(row: dict[str, Any], client: Any) -> float | None:
    """By the prompt's index: raise, hang, block its thread, flood, two at once, or behave."""
    kind = row["a"] % 6
    await one_request(client, row)
    if kind == 0:
        raise ValueError("the agent's own bug")
    if kind == 1:
        await asyncio.sleep(3600)
    if kind == 2:
        RELEASE.wait(3600)
    if kind == 3:
        while True:
            await one_request(client, row)
    if kind == 4:
        await asyncio.gather(_refused(client, one_request(client, row)), _refused(client, one_request(client, row)))
    return 1.0


async def raw_requests(row: dict[str, Any], client: Any) -> None:
    """Bodies no client library sends: not JSON, an unknown field, too large; then a good one."""
    url = f"{client.base_url}chat/completions"
    headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
    message = {"role": "user", "content": row["prompt"]}
    bodies = [
        b"{not json",
        json.dumps({"model": "p", "messages": [message], "best_of": 2}).encode(),
        json.dumps({"model": "p", "messages": [message] * 40_000}).encode(),
    ]
    async with httpx.AsyncClient() as http:
        for body in bodies:
            answer = await http.post(url, content=body, headers=headers)
            OUTCOMES.setdefault(client.api_key, []).append(str(answer.status_code))
    await one_request(client, row)


async def paced(row: dict[str, Any], client: Any) -> None:
    """Two turns 0.15 s apart, each marked in $LLAMARL_TEST_MARKERS/<pid>; a prompt whose `a` is
    a multiple of 7 raises after its first turn."""
    marker = Path(os.environ["LLAMARL_TEST_MARKERS"]) / str(os.getpid())
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    for turn in range(2):
        reply = await client.chat.completions.create(model="p", messages=messages, max_tokens=4)
        marker.touch()
        await asyncio.sleep(0.15)
        if turn == 0 and row["a"] % 7 == 0:
            raise ValueError("a multiple of 7")
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "= 7 "})


async def odd_requests(row: dict[str, Any], client: Any) -> None:
    """Requests a client library sends that the model cannot serve as asked: a token id outside
    the vocabulary, too many choices, then a good one at another temperature, then a context
    longer than the model takes (which ends the episode)."""
    outcomes = OUTCOMES.setdefault(client.api_key, [])
    message = [{"role": "user", "content": row["prompt"]}]
    calls = [
        client.completions.create(model="p", prompt=[10**9], max_tokens=2),
        client.chat.completions.create(model="p", messages=message, n=9, max_tokens=2),
        client.chat.completions.create(model="p", messages=message, temperature=0.5, max_tokens=2),
        client.completions.create(model="p", prompt="1" * 5000, max_tokens=2),
    ]
    for call in calls:
        try:
            await call
            outcomes.append("200")
        except openai.APIStatusError as err:
            outcomes.append(str(err.status_code))


async def hostile(row: dict[str, Any], client: Any) -> float:
    """Contexts of no tokens on the built model (it has no chat template): an empty message and
    a message of only an image part, each refused; then one good turn, rewarded by parity, or
    with a reward outside float32's range for prompts whose `a` is a multiple of 3."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    for content in ("", [image]):
        messages = [{"role": "user", "content": content}]
        await _refused(client, client.chat.completions.create(model="p", messages=messages, max_tokens=2))
    await one_request(client, row)
    return 1e300 if row["a"] % 3 == 0 else float(row["a"] % 2)


async def types_specials(row: dict[str, Any], client: Any) -> None:
    """`<eos>` typed into the first request, by the prompt's `a`: a chat message, a text
    prompt, or a history with an assistant message the endpoint never answered."""
    text = "1<eos>2="
    kind = row["a"] % 3
    if kind == 1:
        await client.completions.create(model="p", prompt=text, max_tokens=2)
        return
    messages = [{"role": "user", "content": text}]
    if kind == 2:
        messages = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "<eos>"}, *messages]
    await client.chat.completions.create(model="p", messages=messages, max_tokens=2)


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """What the two tools of tests/chat_families.py answer."""
    if name == "search":
        return f"{arguments['site']}: 3 pages on {arguments['query']}"
    return f"in {int(arguments['days']) + 4} days"


async def tool_calling(row: dict[str, Any], client: Any) -> float:
    """Up to three turns offering tests/chat_families.py's two tools: each call's result goes
    back as a tool message with its call's id; a turn without calls ends the episode."""
    from tests.chat_families import TOOLS

    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=200, logprobs=True
        )
        _keep(client, reply)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = run_tool(call.function.name, json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": result})
    return 1.0


async def three_turns_streamed(row: dict[str, Any], client: Any) -> float:
    """`three_turns` with every answer streamed (`stream: true`): each reply's message is put
    together from its chunks, as a streaming client does."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        stream = await client.chat.completions.create(
            model="policy", messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
        content, token_ids, usage = "", None, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                content += choice.delta.content or ""
                token_ids = (choice.model_extra or {}).get("token_ids", token_ids)
        SEEN.setdefault(client.api_key, []).append({"token_ids": token_ids, "usage": usage})
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": "+1 "})
    return float(row["a"] % 2)


async def stalls_after_one_turn(row: dict[str, Any], client: Any) -> None:
    """One turn, then a mark in the file LLAMARL_TEST_MARK names, then nothing until killed: an
    agent server lost mid-episode."""
    messages = [{"role": "user", "content": row["prompt"]}]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
    Path(os.environ["LLAMARL_TEST_MARK"]).write_text(client.api_key)
    await asyncio.sleep(3600)


def tool_calling_demonstration(row: dict[str, Any]) -> dict[str, Any]:
    """The episode `tool_calling` plays, as a warm start's demonstration with its tools: a call,
    two calls in one turn, then the answer (call ids of nine characters, as mistral's template
    takes them)."""
    from tests.chat_families import FIND, LATER, TOOLS

    def call(number: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"id": f"call0000{number}", "type": "function", "function": function}

    def result(number: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": f"call0000{number}", "name": name, "content": run_tool(name, arguments)}

    messages = [
        {"role": "user", "content": row["prompt"]},
        {"role": "assistant", "content": None, "tool_calls": [call(1, *FIND)]},
        result(1, *FIND),
        {"role": "assistant", "content": None, "tool_calls": [call(2, *LATER), call(3, *FIND)]},
        result(2, *LATER),
        result(3, *FIND),
        {"role": "assistant", "content": row["answer"]},
    ]
    return {"messages": messages, "tools": TOOLS}
