"""Messages to tokens for episodes: the prompt from the environment's first messages, and the
tokens of each environment reply that follows a model turn.

With a chat template (model.chat_template) a reply is what the template adds to the
conversation: the end of the model's turn that it did not write itself (the newline after EOS,
or the whole end-of-turn marker when the turn was cut short), the reply's messages, and the cue
for the model's next turn: what follows a placeholder for the model's text when the whole
conversation is rendered, so the model's own tokens are never re-tokenized. Without a template the messages'
texts are appended as they are. The model's tokens stay exactly those it sampled.

Text an environment, a tool or an agent wrote cannot forge tokens, in a reply or in the first
messages: its control characters are escaped (`\\x00`), so no text can contain the renderer's
markers, which also carry a fresh random nonce each time (the model cannot write them either),
and it is tokenized with special tokens split (`<eos>` typed by an agent is the five characters,
never the end-of-sequence token). Only the template's own markup becomes control tokens. First
messages with nothing that could become one are rendered whole, exactly as a single-turn
rollout encodes its prompt.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from llamarl.engine.model import Policy

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but newline and tab: escaped in an environment's text."""


def escape_control(text: str) -> str:
    return CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


Tools = Sequence[Mapping[str, Any]] | None
"""The tools a conversation offers (OpenAI form), handed to the chat template; None: none."""


class TurnRenderer:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.specials = [t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special]
        """The texts the tokenizer turns into control tokens unless told to split them."""

    def _render(self, messages: Sequence[Mapping[str, Any]], cue: bool, tools: Tools) -> str:
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=cue,
            tokenize=False,
        )
        return str(text)

    def ids(self, text: str) -> list[int]:
        """Tokens of template text: its special tokens are control tokens."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def text_ids(self, text: str) -> list[int]:
        """Tokens of an environment's text: control characters escaped, special tokens split."""
        encoded = self.tokenizer(escape_control(text), add_special_tokens=False, split_special_tokens=True)
        return list(encoded.input_ids)

    def first_text_ids(self, text: str) -> list[int]:
        """Tokens of a whole text prompt: as `text_ids`, after the tokenizer's own start (BOS)."""
        encoded = self.tokenizer(escape_control(text), split_special_tokens=True)
        return list(encoded.input_ids)

    def turn_text(self, history: Sequence[Mapping[str, Any]], message: Mapping[str, Any], tools: Tools = None) -> str:
        """The text of the assistant turn `message` as the model writes it after `history`:
        its content, or with a chat template whatever the template writes between the
        assistant's cue and the end of the turn (its tool calls in the family's markup)."""
        if not self.policy.chat or not message.get("tool_calls"):
            return str(message["content"] or "")
        cue = self._render(history, True, tools)
        whole = self._render([*history, message], False, tools)
        eos = str(self.tokenizer.eos_token)
        end = whole.find(eos, len(cue))
        if not whole.startswith(cue) or end < 0:
            raise ValueError("the chat template does not write an assistant turn after its cue, ending in EOS")
        return whole[len(cue) : end]

    def _forges(self, text: str) -> bool:
        """Whether `text` holds what would not stay text if tokenized whole: a special token's
        text or a control character."""
        return CONTROL.search(text) is not None or any(special in text for special in self.specials)

    def _check_calls(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Refuse tool calls whose names or arguments could forge a token: the template writes
        them as its own text (only a message's content is spelled as text)."""
        for message in messages:
            if any(self._forges(text) for text in _strings(message.get("tool_calls"))):
                raise ValueError("a tool call holds a special token's text or a control character")

    def prompt(self, messages: Sequence[Mapping[str, Any]], tools: Tools = None) -> list[int]:
        """The prompt's tokens, ending with the cue for the model's first turn (the `tools`
        offered handed to the template); the messages' text is never a control token (see the
        module's doc)."""
        if len(messages) == 1 and not tools:  # exactly as a single-turn rollout encodes its prompt
            messages = [{"role": "user", "content": messages[0]["content"]}]
        if not self.policy.chat:
            return self.first_text_ids("".join(m["content"] for m in messages))
        self._check_calls(messages)
        if not any(self._forges(m.get("content") or "") for m in messages):
            return self.policy.encode_messages(messages, tools)
        return self._spelled(*self._marked(messages, 0, tools))

    def _marked(self, messages: Sequence[Mapping[str, Any]], start: int, tools: Tools) -> tuple[str, dict[str, str]]:
        """The conversation rendered with the assistant's cue, each text from message `start`
        on replaced by a marker; and the markers' texts. A template that rewrites a text
        (JSON-quotes it) loses its marker: that text is rendered as it is, which only text that
        cannot forge a token may be."""
        nonce = secrets.token_hex(8)
        marks = {i: f"\x00text-{nonce}-{i}\x00" for i, m in enumerate(messages) if i >= start and m.get("content")}

        def render() -> str:
            return self._render(
                [{**m, "content": marks[i]} if i in marks else m for i, m in enumerate(messages)], True, tools
            )

        rendered = render()
        lost = [i for i, mark in marks.items() if mark not in rendered]
        if any(self._forges(messages[i]["content"]) for i in lost):
            raise ValueError("the chat template rewrites a message's text, which may then hold no special token's text")
        if lost:
            marks = {i: mark for i, mark in marks.items() if i not in lost}
            rendered = render()
        return rendered, {mark: messages[i]["content"] for i, mark in marks.items()}

    def _spelled(self, rendered: str, marks: dict[str, str]) -> list[int]:
        """Tokens of template text holding `marks`' markers: each marker spelled as the text it
        stands for, the template's pieces with their control tokens."""
        if not marks:  # an empty pattern would split between every character
            return self.ids(rendered)
        ids: list[int] = []
        for piece in re.split("(" + "|".join(map(re.escape, marks)) + ")", rendered):
            ids += self.text_ids(marks[piece]) if piece in marks else self.ids(piece)
        return ids

    def reply(
        self,
        history: Sequence[Mapping[str, Any]],
        ended_with_eos: bool,
        new: Sequence[Mapping[str, Any]],
        tools: Tools = None,
    ) -> list[int]:
        """The tokens of `new` after a model turn; `history` is the conversation before that
        turn (the turn itself not included)."""
        if not self.policy.chat:
            return self.text_ids("".join(m["content"] for m in new))
        self._check_calls(new)
        turn = f"\x00model-turn-{secrets.token_hex(8)}\x00"
        # Everything after the model's text, as the template writes it once the reply follows
        # (a template may render a turn differently when it is no longer the last one).
        after, marks = self._marked([*history, {"role": "assistant", "content": turn}, *new], len(history) + 1, tools)
        rest = after[after.index(turn) + len(turn) :]
        eos = str(self.tokenizer.eos_token)
        if ended_with_eos and rest.startswith(eos):
            rest = rest[len(eos) :]
        return self._spelled(rest, marks)


def _strings(value: Any) -> Iterator[str]:
    """Every string inside `value` (dicts' keys and values, lists' items)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
