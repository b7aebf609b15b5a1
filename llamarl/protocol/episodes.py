"""The episode records a multi-turn rollout group carries (`RolloutGroup.episodes`), checked
where they are read: a JSON list of one record per completion, each `{"turns": [{"role",
"content", ...}], "reward": number or null, "end": reason, "error": text or null}`. Anything
else is a ProtocolError, so a malformed group is rejected and counted, never crashing a worker.
"""

from __future__ import annotations

import json
from typing import Any

from llamarl.errors import ProtocolError
from llamarl.protocol.messages import trainable_reward


def _bad(detail: str) -> ProtocolError:
    return ProtocolError("bad_episodes", detail)


def _check_record(record: Any, index: int) -> None:
    if not isinstance(record, dict) or not {"turns", "reward", "end"} <= record.keys():
        raise _bad(f"episode {index}: expected turns, reward and end")
    reward, end, turns = record["reward"], record["end"], record["turns"]
    if reward is not None and (type(reward) not in (int, float) or not trainable_reward(reward)):
        raise _bad(f"episode {index}: reward must be a number finite as float32, or null")
    if not isinstance(end, str) or not isinstance(turns, list):
        raise _bad(f"episode {index}: end must be text and turns a list")
    for turn in turns:
        if not isinstance(turn, dict) or not all(isinstance(turn.get(key), str) for key in ("role", "content")):
            raise _bad(f"episode {index}: every turn needs a role and content")


def parse_episodes(text: str, num_samples: int) -> list[dict[str, Any]]:
    """The records of a group of `num_samples` episodes; ProtocolError when malformed."""
    try:
        records = json.loads(text)
    except ValueError:
        raise _bad("not JSON") from None
    if not isinstance(records, list) or len(records) != num_samples:
        raise _bad(f"expected a list of {num_samples} episode records")
    for index, record in enumerate(records):
        _check_record(record, index)
    return records
