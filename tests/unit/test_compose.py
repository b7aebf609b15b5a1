"""docker-compose.yml, checked without a Docker engine (none runs here): every service's command
parses as a llamarl invocation, and its environment resolves configs/cluster.yaml to a valid
config pointing at the compose services."""

from __future__ import annotations

from pathlib import Path

import yaml

from llamarl.config import load_config
from workers.cli import ROLES, build_parser

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
        args = build_parser().parse_args(["--log-format", "json", *service["command"]])
        assert args.role == name
        config_file = args.rest[args.rest.index("--config") + 1]
        env = {k: str(v) for k, v in service["environment"].items()}
        config = load_config(REPO / config_file, environ=env)
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
