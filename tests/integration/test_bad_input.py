"""Every bad input a user can give `llamarl`: one line naming the field or value and what to do,
exit 2 for configuration and 1 at run time, within 5 s, nothing left running. Each case runs the
real command; README's "Bad input" table must hold exactly the rows these runs produce (the
failure message prints the row to paste)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from llamarl.launch import supervise
from llamarl.net import free_port_block
from tests.integration.commands import LLAMARL, TINY_MODEL

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    input: str
    """What the user did wrong, as README's table shows it."""
    command: Callable[[Path], list[str]]
    exit_code: int


def _config(tmp: Path, **tree: object) -> str:
    path = tmp / "bad.yaml"
    base = {"run_id": "bad", "run_dir": str(tmp / "run"), "model": TINY_MODEL}
    path.write_text(yaml.safe_dump(base | tree))
    return str(path)


def _run(tmp: Path, *extra: str, **tree: object) -> list[str]:
    return [*LLAMARL, "run", _config(tmp, **tree), *extra]


def _data(tmp: Path, text: str, **task: object) -> list[str]:
    """`llamarl run` on a data file holding `text`."""
    (tmp / "data.jsonl").write_text(text)
    return _run(tmp, task={"kind": "file", "path": str(tmp / "data.jsonl"), "num_eval": 1, **task})


def _chat_data(tmp: Path, text: str) -> list[str]:
    """`llamarl run` on chat rows with a model directory (its config.json is all the launcher
    reads before the data)."""
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
    (tmp / "data.jsonl").write_text(text)
    task = {"kind": "file", "path": str(tmp / "data.jsonl"), "messages_field": "messages"}
    return _run(tmp, task=task, model={"path": str(tmp / "model"), "chat_template": True})


def _busy_port(tmp: Path) -> list[str]:
    port = int((tmp / "port").read_text())
    return [*LLAMARL, "worker", "broker", "--config", _config(tmp, broker={"port": port})]


CASES = [
    Case("an unknown config key", lambda t: _run(t, trainer={"num_step": 5}), 2),
    Case("a value out of bounds", lambda t: _run(t, trainer={"lr": -1}), 2),
    Case("a run_dir that cannot be written (async)", lambda t: _run(t, run_dir=str(t / "file" / "run")), 2),
    Case("a malformed Redis URL", lambda t: _run(t, redis={"url": "localhost:6379"}), 2),
    Case(
        "an unreachable Redis URL", lambda t: _run(t, redis={"url": "redis://127.0.0.1:9/0"}, broker={"port": 40000}), 1
    ),
    Case(
        "a model.path that is not a model (sync)",
        lambda t: _run(t, "--mode", "sync", model={"path": str(t / "nothing")}),
        2,
    ),
    Case("a model.path that is not a model (async)", lambda t: _run(t, model={"path": str(t / "nothing")}), 2),
    Case("the in-process transport in an async run", lambda t: _run(t, sync={"transport": "local"}), 2),
    Case("a jsonl task without a path", lambda t: _run(t, task={"kind": "jsonl"}), 2),
    Case(
        "a data row without its answer",
        lambda t: _data(t, '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n'),
        2,
    ),
    Case("an empty data file", lambda t: _data(t, ""), 2),
    Case(
        "a chat row that is not a list of messages", lambda t: _chat_data(t, '{"messages": "hi", "answer": "2"}\n'), 2
    ),
    Case(
        "chat rows with the built model",
        lambda t: _run(t, task={"kind": "file", "path": "chat.jsonl", "messages_field": "messages"}),
        2,
    ),
    Case(
        "a reward that returns a string",
        lambda t: _run(t, task={"num_digits": 1, "num_eval": 4, "reward": "tests.user_rewards:says_yes"}),
        2,
    ),
    Case(
        "a loss whose module cannot be imported", lambda t: _run(t, algorithm={"loss": "tests.no_such_module:loss"}), 2
    ),
    Case(
        "a loss that returns one value per sequence",
        lambda t: _run(t, "--mode", "sync", algorithm={"loss": "tests.user_losses:one_per_sequence"}),
        2,
    ),
    Case(
        "an advantage that is not finite when a group's rewards are equal",
        lambda t: _run(t, algorithm={"advantage": "tests.user_losses:std_of_equal_rewards"}),
        2,
    ),
    Case("a broker port in use", _busy_port, 2),
    Case("a broker port in use (llamarl run)", lambda t: _run(t, broker={"port": int((t / "port").read_text())}), 2),
    Case(
        "a run_dir that cannot be written (sync)",
        lambda t: _run(t, "--mode", "sync", run_dir=str(t / "file" / "run")),
        2,
    ),
    Case("the vLLM engine with the built model", lambda t: _run(t, generation={"engine": "vllm"}), 2),
    Case(
        "an agent that is not an async function",
        lambda t: _run(t, environment={"kind": "agent", "agent": "tests.user_rewards:says_yes"}),
        2,
    ),
    Case(
        "an agent endpoint port in use",
        lambda t: _run(
            t,
            environment={"kind": "agent", "agent": "tests.user_agents:paced"},
            generation={"openai": {"port": int((t / "port").read_text()) + 1}},
        ),
        2,
    ),
    Case("a broker.curve_keys directory without keys", lambda t: _run(t, broker={"curve_keys": str(t / "no-keys")}), 2),
]


def _row(case: Case, message: str) -> str:
    return f"| {case.input} | `` {message} `` | {case.exit_code} |"


@pytest.mark.parametrize("case", CASES, ids=[c.input for c in CASES])
def test_bad_input_is_one_line_and_an_exit_code(case: Case, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where a directory should be")
    with socket.socket() as holder:
        port = free_port_block()
        holder.bind(("127.0.0.1", port + 1))  # one of the broker's four ports is taken
        (tmp_path / "port").write_text(str(port))
        tag = uuid.uuid4().hex  # inherited by everything the command starts
        proc = supervise.start(
            case.command(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "LLAMARL_TEST_TAG": tag},
        )
        try:
            _, err = proc.communicate(timeout=120)  # a hang guard, not a speed bound
        finally:
            supervise.stop(proc)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert proc.returncode == case.exit_code, err[-2000:]
    assert len(lines) == 1, f"expected one line, got: {lines}"
    assert "Traceback" not in err
    assert "redis retry" not in err, "a retry before the one line is said in it, not logged"
    message = re.sub(re.escape(str(tmp_path)), "TMP", lines[0])
    message = re.sub(r"\b\d{5}\b", "PORT", message)
    row = _row(case, message)
    assert row in (REPO / "docs" / "operations.md").read_text(), f"README's bad-input table lacks:\n{row}"
    assert _tagged(tag) == [], "something the command started was left running"


def _tagged(tag: str) -> list[int]:
    """Live processes whose environment carries `tag` (orphans are reparented away from the
    command, so its tree no longer finds them)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"LLAMARL_TEST_TAG={tag}".encode() in environ.read_bytes().split(b"\0"):
                pid = int(environ.parent.name)
                if supervise.alive(pid):
                    found.append(pid)
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return found
