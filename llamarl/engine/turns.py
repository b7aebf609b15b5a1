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

from llamarl.engine.model import Policy
from llamarl.envs.base import Message

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but newline and tab: escaped in an environment's text."""


def escape_control(text: str) -> str:
    return CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


class TurnRenderer:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.specials = [t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special]
        """The texts the tokenizer turns into control tokens unless told to split them."""

    def _render(self, messages: list[Message], cue: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=cue, tokenize=False)
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

    def _forges(self, text: str) -> bool:
        """Whether `text` holds what would not stay text if tokenized whole: a special token's
        text or a control character."""
        return CONTROL.search(text) is not None or any(special in text for special in self.specials)

    def prompt(self, messages: list[Message]) -> list[int]:
        """The prompt's tokens, ending with the cue for the model's first turn; the messages'
        text is never a control token (see the module's doc)."""
        if len(messages) == 1:  # exactly as a single-turn rollout encodes its prompt
            messages = [{"role": "user", "content": messages[0]["content"]}]
        if not self.policy.chat:
            return self.first_text_ids("".join(m["content"] for m in messages))
        if not any(self._forges(m["content"]) for m in messages):
            return self.policy.encode_messages(messages)
        nonce = secrets.token_hex(8)
        marks = {f"\x00text-{nonce}-{i}\x00": m["content"] for i, m in enumerate(messages)}
        marked = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
        return self._spelled(self._render(marked, cue=True), marks)

    def _spelled(self, rendered: str, marks: dict[str, str]) -> list[int]:
        """Tokens of template text holding `marks`' markers: each marker spelled as the text it
        stands for, the template's pieces with their control tokens."""
        if not marks:  # an empty pattern would split between every character
            return self.ids(rendered)
        ids: list[int] = []
        for piece in re.split("(" + "|".join(map(re.escape, marks)) + ")", rendered):
            ids += self.text_ids(marks[piece]) if piece in marks else self.ids(piece)
        return ids

    def reply(self, history: list[Message], ended_with_eos: bool, new: list[Message]) -> list[int]:
        """The tokens of `new` after a model turn; `history` is the conversation before that
        turn (the turn itself not included)."""
        if not self.policy.chat:
            return self.text_ids("".join(m["content"] for m in new))
        nonce = secrets.token_hex(8)
        turn = f"\x00model-turn-{nonce}\x00"
        marks = {f"\x00env-text-{nonce}-{i}\x00": m["content"] for i, m in enumerate(new)}
        with_turn = [*history, {"role": "assistant", "content": turn}]
        marked = [{**m, "content": mark} for m, mark in zip(new, marks, strict=True)]
        # Everything after the model's text, as the template writes it once the reply follows
        # (a template may render a turn differently when it is no longer the last one).
        after = self._render(with_turn + marked, cue=True)
        rest = after[after.index(turn) + len(turn) :]
        eos = str(self.tokenizer.eos_token)
        if ended_with_eos and rest.startswith(eos):
            rest = rest[len(eos) :]
        return self._spelled(rest, marks)
