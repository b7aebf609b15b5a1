"""The built wheel as a user installs it, in a fresh virtualenv: without the `agents` extra an
agent run is refused in one line naming it; with it, the endpoint and the agents' client import.
Packages come from the registries (pip's own cache makes a rerun quick: about 2 min here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHECK_AGENT = """
from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch.agent_checks import check_agent
tree = {"environment": {"kind": "agent", "agent": "asyncio:sleep"}, "trainer": {"sft_steps": 0}}
config = parse_config(tree, environ={})
try:
    check_agent(config)
except ConfigError as err:
    print(err)
"""

AGENT_PATH = """
import llamarl.agents.endpoint, llamarl.agents.runner, llamarl.agents.isolation
from llamarl.agents.tool_formats import FORMATS
print(sorted(FORMATS))
"""


@pytest.mark.long
def test_the_wheel_needs_the_agents_extra_for_an_agent_run_and_runs_the_agent_path_with_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*command: str | Path) -> str:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", REPO)
    (wheel,) = (tmp_path / "dist").glob("llamarl-*.whl")
    run(sys.executable, "-m", "venv", tmp_path / "fresh")
    python = tmp_path / "fresh" / "bin" / "python"
    # torch pinned as scripts/setup.sh pins it (an unpinned one would pull a CUDA build)
    run(python, "-m", "pip", "install", "-q", str(wheel), "torch==2.13.0")
    assert "fastapi" not in run(python, "-m", "pip", "list")
    refused = run(python, "-c", CHECK_AGENT).strip()
    assert refused == "environment.kind agent: fastapi, uvicorn, openai not installed; pip install 'llamarl[agents]'"

    run(python, "-m", "pip", "install", "-q", f"{wheel}[agents]")
    assert run(python, "-c", CHECK_AGENT).strip() == "", "with the extra, the agent run's checks pass"
    assert run(python, "-c", AGENT_PATH).strip() == "['hermes', 'llama3_json', 'llamarl', 'mistral']"
