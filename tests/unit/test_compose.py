"""docker-compose.yml, checked without a Docker engine (none runs here): every service's command
parses as a llamarl invocation, and its environment resolves configs/cluster.yaml to a valid
config pointing at the compose services; with docker-compose.multihost.yml over it, at the head
host named by LLAMARL_HEAD (`docker-compose config` in .ci/run checks the merge itself)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llamarl.config import load_config
from llamarl.launch.local import stop_grace_s
from tests.unit.worker_commands import parse_llamarl
from workers.cli import ROLES

REPO = Path(__file__).resolve().parents[2]


def _services() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def test_compose_runs_every_role() -> None:
    services = _services()
    roles = {s["command"][1] for name, s in services.items() if name != "redis"}
    assert roles == set(ROLES)


def test_every_service_command_and_environment_is_valid() -> None:
    for name, service in _services().items():
        if name == "redis":
            continue
        command = parse_llamarl(["--log-format", "json", *service["command"]])
        assert command.role == name
        env = {k: str(v) for k, v in service["environment"].items()}
        config = load_config(REPO / command.config_file, environ=env)
        assert config.redis.url == "redis://redis:6379/0"
        assert config.sync.transport == "gloo"
        expected_host = "0.0.0.0" if name == "broker" else "broker"
        assert (config.broker.host, config.broker.port) == (expected_host, 5555)


def test_image_pins_the_cpu_torch_build() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "torch==2.13.0" in dockerfile
    assert '"llamarl"' in dockerfile


def test_generators_can_scale() -> None:
    """`docker compose up --scale generator=N`: nothing in the service may be the same in two
    replicas (a container name, a host port, a worker id)."""
    generator = _services()["generator"]
    assert "container_name" not in generator and "ports" not in generator
    assert "--worker-id" not in generator["command"]
    assert "LLAMARL_WORKER_ID" not in generator.get("environment", {})


def _substitute(value: str, environ: dict[str, str]) -> str:
    """Compose's `${NAME}` and `${NAME:?message}` interpolation."""
    return re.sub(r"\$\{(\w+)(?::\?[^}]*)?\}", lambda m: environ[m.group(1)], value)


def test_multihost_services_reach_the_head_host() -> None:
    head = {"LLAMARL_HEAD": "10.0.0.1", "LLAMARL_REDIS_PASSWORD": "pw"}
    override = yaml.safe_load((REPO / "docker-compose.multihost.yml").read_text())["services"]
    base = _services()
    assert set(override) == set(base)
    assert all(service["network_mode"] == "host" for service in override.values())
    assert "pw" in [_substitute(arg, head) for arg in override["redis"]["command"]]
    for name, service in override.items():
        if name == "redis":
            continue
        env = {k: _substitute(str(v), head) for k, v in (base[name]["environment"] | service["environment"]).items()}
        config = load_config(REPO / "configs" / "cluster.yaml", environ=env)
        assert config.redis.url == "redis://:pw@10.0.0.1:6379/0", name
        expected_host = "0.0.0.0" if name == "broker" else "10.0.0.1"
        assert (config.broker.host, config.broker.port) == (expected_host, 5555), name
        if name == "trainer":
            assert config.sync.advertise_host == "10.0.0.1" and config.sync.host == "0.0.0.0"


def test_the_trainer_is_given_the_time_to_write_its_stop_checkpoint() -> None:
    trainer = _services()["trainer"]
    env = {k: str(v) for k, v in trainer["environment"].items()}
    config = load_config(REPO / "configs" / "cluster.yaml", environ=env)
    grace = re.fullmatch(r"(\d+)s", trainer["stop_grace_period"])
    assert grace is not None and float(grace.group(1)) >= stop_grace_s("trainer", config)
