"""The Slurm and Kubernetes recipes (deploy/), checked without a cluster, since none runs here.

Kubernetes: every manifest is an object of a kind Kubernetes has, every llamarl container's
command parses as a llamarl invocation (the real parsers, `tests/unit/worker_commands.py`, as
for docker-compose.yml) and its environment (secrets, the pod's address and `$(NAME)` references
resolved as the kubelet would) makes the ConfigMap's config a valid one pointing at the head
Service; and where kubectl is installed, it decodes every object into its own API types offline.
Slurm: the batch script parses, its #SBATCH directives are well-formed, and run under a stand-in
`srun` that records each step, it starts Redis, the broker and the reward worker on node 0, one
torchrun of the trainer per trainer node and generators on the rest, each step's command read by
the real llamarl and torchrun parsers and its environment resolving the config to node 0's
services and the step's own node address."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from torch.distributed.run import get_args_parser

from llamarl.config import RunConfig, load_config
from llamarl.launch.local import stop_grace_s
from tests.unit.worker_commands import parse_llamarl, parse_worker_options
from workers.cli import ROLES

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
SBATCH = REPO / "deploy" / "slurm" / "llamarl.sbatch"
IMAGE = "llamarl:latest"
POD_IP = "10.244.0.7"
BUILTIN_KINDS = {
    ("v1", "ConfigMap"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Pod"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "DaemonSet"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("batch/v1", "CronJob"),
    ("batch/v1", "Job"),
}
"""Kubernetes' built-in kinds a deployment like this one may use, at their current apiVersion
(kubectl checks against its whole scheme where it is installed)."""
WORKLOADS = {"Deployment", "Job", "StatefulSet", "DaemonSet"}


def _manifests() -> list[dict[str, Any]]:
    files = sorted(K8S.glob("*.yaml"))
    assert files, f"no manifests in {K8S}"
    return [doc for file in files for doc in yaml.safe_load_all(file.read_text()) if doc]


def _one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in _manifests() if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    return found


def _expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(NAME)` expansion in env values, command and args (unknown names stay)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def _env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = _expand(str(item["value"]), env)
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = _one("Secret", ref["name"])["stringData"][ref["key"]]
        else:
            assert source == {"fieldRef": {"fieldPath": "status.podIP"}}, item
            env[item["name"]] = POD_IP
    return env


def _entrypoint() -> list[str]:
    (line,) = [x for x in (REPO / "Dockerfile").read_text().splitlines() if x.startswith("ENTRY")]
    return json.loads(line.removeprefix("ENTRYPOINT"))


def _llamarl_containers() -> list[tuple[dict[str, Any], dict[str, Any], list[str]]]:
    """(pod spec, container, argv as the container runs it) of every llamarl container."""
    found = []
    for doc in _manifests():
        if doc["kind"] not in WORKLOADS:
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in spec["containers"]:
            if container["image"] == IMAGE:
                env = _env(container)
                argv = container.get("command", _entrypoint()) + container.get("args", [])
                found.append((spec, container, [_expand(arg, env) for arg in argv]))
    return found


def _mounted_config(spec: dict, container: dict, config_file: str, tmp_path: Path) -> Path:
    """The ConfigMap file a container's --config names, written out where load_config reads."""
    path = PurePosixPath(config_file)
    (mount,) = [m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == path.parent]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    data = _one("ConfigMap", volume["configMap"]["name"])["data"]
    local = tmp_path / path.name
    local.write_text(data[path.name])
    return local


def test_every_manifest_is_a_kubernetes_object() -> None:
    names = [(doc["kind"], doc["metadata"]["name"]) for doc in _manifests()]
    assert len(names) == len(set(names)), names
    for doc in _manifests():
        assert (doc["apiVersion"], doc["kind"]) in BUILTIN_KINDS, doc["metadata"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
        if doc["kind"] in WORKLOADS and doc["kind"] != "Job":
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_every_llamarl_container_runs_a_worker_on_a_valid_config(tmp_path: Path) -> None:
    (service,) = [doc for doc in _manifests() if doc["kind"] == "Service"]
    head = service["metadata"]["name"]
    password = _one("Secret", "llamarl-redis")["stringData"]["password"]
    roles = []
    for spec, container, argv in _llamarl_containers():
        assert argv[0] == "llamarl", argv
        command = parse_llamarl(argv[1:])
        roles.append(command.role)
        config_path = _mounted_config(spec, container, command.config_file, tmp_path)
        config = load_config(config_path, environ=_env(container))
        assert config.sync.transport == "gloo"
        if command.role == "broker":  # beside Redis, in the head pod
            assert config.redis.url == f"redis://:{password}@localhost:6379/0"
            assert (config.broker.host, config.broker.port) == ("0.0.0.0", 5555)
            continue
        assert config.redis.url == f"redis://:{password}@{head}:6379/0", command.role
        assert (config.broker.host, config.broker.port) == (head, 5555), command.role
        if command.role == "trainer":
            assert (config.sync.host, config.sync.advertise_host) == ("0.0.0.0", POD_IP)
    assert sorted(roles) == sorted(ROLES)


def test_the_configmap_is_the_cluster_config() -> None:
    data = _one("ConfigMap", "llamarl-config")["data"]
    cluster = yaml.safe_load((REPO / "configs" / "cluster.yaml").read_text())
    assert yaml.safe_load(data["cluster.yaml"]) == cluster


def test_the_head_service_reaches_redis_and_the_broker() -> None:
    head = _one("Deployment", "llamarl-head")["spec"]["template"]
    service = _one("Service", "llamarl-head")["spec"]
    assert service["selector"].items() <= head["metadata"]["labels"].items()
    assert {port["port"] for port in service["ports"]} == {6379, 5555, 5556, 5557, 5558}
    (redis,) = [c for c in head["spec"]["containers"] if c["name"] == "redis"]
    command = [_expand(arg, _env(redis)) for arg in redis["command"]]
    password = _one("Secret", "llamarl-redis")["stringData"]["password"]
    assert command[0] == "redis-server"
    assert command[command.index("--requirepass") + 1] == password


def test_generators_are_a_deployment_of_two_that_can_scale() -> None:
    generators = _one("Deployment", "llamarl-generator")
    assert generators["spec"]["replicas"] == 2
    (container,) = generators["spec"]["template"]["spec"]["containers"]
    assert "--worker-id" not in container["args"]
    assert "LLAMARL_WORKER_ID" not in _env(container)
    trainer = _one("Job", "llamarl-trainer")["spec"]
    assert trainer.get("parallelism", 1) == 1  # one rank: see trainer.yaml for several


def _missing(sent: Any, got: Any, path: str = "") -> list[str]:
    """Where `got` lacks what `sent` holds (kubectl drops the fields its types do not have)."""
    if isinstance(sent, dict) and isinstance(got, dict):
        return [m for k, v in sent.items() for m in _missing(v, got.get(k), f"{path}.{k}")]
    if isinstance(sent, list) and isinstance(got, list) and len(got) >= len(sent):
        return [m for i, v in enumerate(sent) for m in _missing(v, got[i], f"{path}[{i}]")]
    return [] if sent == got else [path]


def test_kubectl_decodes_every_manifest_offline() -> None:
    """`kubectl set env --local` decodes an object into kubectl's own API types with no server
    (`apply` and `create --dry-run=client` ask a server for its API list, so cannot): an
    unknown kind or apiVersion or a field of the wrong type fails, and a misspelt field is
    dropped, which the round trip shows. A kind without a pod template is decoded, then
    refused by name."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed; the other tests here check the manifests' YAML")
    for doc in _manifests():
        done = subprocess.run(
            ["kubectl", "set", "env", "--local", "-f", "-", "-o", "json", "LLAMARL_CHECK=1"],
            input=json.dumps(doc),
            capture_output=True,
            text=True,
            timeout=60,
        )
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in WORKLOADS:
            assert done.returncode == 0, done.stderr
            assert _missing(doc, json.loads(done.stdout)) == [], name
        else:
            version = doc["apiVersion"].rpartition("/")[2]
            assert f"does not have a pod template: *{version}.{doc['kind']}" in done.stderr, name


def test_sbatch_script_parses_and_its_directives_are_well_formed() -> None:
    subprocess.run(["bash", "-n", str(SBATCH)], check=True, timeout=30)
    lines = SBATCH.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    # sbatch reads #SBATCH lines only up to the first line that is not a comment
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert directives and max(directives) < first_command
    for i in directives:
        assert re.fullmatch(r"#SBATCH --[a-z][a-z-]*(=\S+)?", lines[i]), lines[i]
    assert "#SBATCH --nodes=2" in lines


def _run_sbatch(tmp_path: Path, num_nodes: int, **env: str) -> subprocess.CompletedProcess:
    """The batch script as Slurm would run it on node 0 of `num_nodes`, `srun` and `scontrol`
    stood in for; each step srun starts is recorded in tmp_path/steps.jsonl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stubs = {
        "srun": f'exec "{sys.executable}" "{Path(__file__).parent / "fake_srun.py"}" "$@"',
        "scontrol": f"printf 'node%s\\n' $(seq 0 {num_nodes - 1})",  # show hostnames LIST
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    environ = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SRUN_RECORD": str(tmp_path / "steps.jsonl"),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": f"node[0-{num_nodes - 1}]",
        "LLAMARL_RUN_DIR": str(tmp_path / "run"),
        **env,
    }
    return subprocess.run(["bash", str(SBATCH)], cwd=REPO, env=environ, capture_output=True, text=True, timeout=60)


def _steps(tmp_path: Path) -> list[dict[str, Any]]:
    """Each recorded step, with the node it ran on and its environment after --export."""
    steps = []
    for line in (tmp_path / "steps.jsonl").read_text().splitlines():
        step = json.loads(line)
        options = dict(o.partition("=")[::2] for o in step["options"])
        assert options["--overlap"] == "" and options["--nodes"] == "1", step
        step["node"] = int(options["--nodelist"].removeprefix("node"))
        exported = options.get("--export", "ALL").split(",")
        assert exported[0] == "ALL", step
        step["env"] |= dict(item.split("=", 1) for item in exported[1:])
        steps.append(step)
    return steps


def _config(step: dict[str, Any], config_file: str, node: int, head: str) -> RunConfig:
    """The config a step's llamarl process reads, checked against node 0's services."""
    config = load_config(REPO / config_file, environ=step["env"])
    assert config.redis.url == f"redis://:pw@{head}:6379/0"
    assert (config.broker.host, config.broker.port) == (head, 5555)
    assert config.sync.transport == "gloo" and config.sync.host == "0.0.0.0"
    assert config.sync.advertise_host == f"10.0.0.{node + 1}"
    assert config.run_id == "slurm-42"
    return config


@pytest.mark.parametrize(("num_nodes", "trainer_nodes", "ifname"), [(2, 1, None), (4, 2, "ib0")])
def test_sbatch_starts_every_role_on_its_nodes(
    tmp_path: Path, num_nodes: int, trainer_nodes: int, ifname: str | None
) -> None:
    env = {"LLAMARL_REDIS_PASSWORD": "pw", "TRAINER_NODES": str(trainer_nodes)}
    env |= {"TRAINER_PROCS_PER_NODE": "2"} | ({"GLOO_SOCKET_IFNAME": ifname} if ifname else {})
    done = _run_sbatch(tmp_path, num_nodes, **env)
    assert done.returncode == 0, done.stderr
    head, where = "10.0.0.1", {}
    for step in _steps(tmp_path):
        command, node = step["command"], step["node"]
        assert step["env"]["GLOO_SOCKET_IFNAME"] == (ifname or "eth0")
        if command[0] == "ip":  # the address probe
            assert command == ["ip", "-4", "-o", "addr", "show", "dev", ifname or "eth0"]
        elif command[0] == "redis-server":
            assert command[command.index("--requirepass") + 1] == "pw"
            assert command[command.index("--bind") + 1] == head
            where.setdefault("redis", []).append(node)
        elif command[0] == "llamarl":
            worker = parse_llamarl(command[1:])
            _config(step, worker.config_file, node, head)
            where.setdefault(worker.role, []).append(node)
        else:
            assert command[:3] == ["python", "-m", "torch.distributed.run"], command
            torchrun = get_args_parser().parse_args(command[3:])
            assert (torchrun.nnodes, torchrun.nproc_per_node) == (str(trainer_nodes), "2")
            assert (torchrun.rdzv_backend, torchrun.rdzv_endpoint) == ("c10d", f"{head}:29400")
            assert torchrun.local_addr == f"10.0.0.{node + 1}" and torchrun.node_rank == node
            assert (torchrun.module, torchrun.training_script) == (True, "workers.trainer")
            worker = parse_worker_options("trainer", torchrun.training_script_args)
            config = _config(step, worker.config_file, node, head)
            assert config.trainer.ranks == 2 * trainer_nodes
            where.setdefault("trainer", []).append(node)
    assert where == {
        "redis": [0],
        "broker": [0],
        "reward": [0],
        "trainer": list(range(trainer_nodes)),
        "generator": list(range(trainer_nodes, num_nodes)),
    }


def test_sbatch_refuses_a_job_it_cannot_lay_out(tmp_path: Path) -> None:
    done = _run_sbatch(tmp_path, 2, LLAMARL_REDIS_PASSWORD="pw", TRAINER_NODES="2")
    assert done.returncode == 2 and "none for generators" in done.stderr
    assert not (tmp_path / "steps.jsonl").exists()
    done = _run_sbatch(tmp_path, 3)
    assert done.returncode != 0 and "LLAMARL_REDIS_PASSWORD" in done.stderr
    assert not (tmp_path / "steps.jsonl").exists()
    done = _run_sbatch(tmp_path, 3, LLAMARL_REDIS_PASSWORD="pw", GLOO_SOCKET_IFNAME="wlan9")
    assert done.returncode == 2 and "node0 has no IPv4 address on wlan9" in done.stderr
    assert [json.loads(line)["command"][0] for line in open(tmp_path / "steps.jsonl")] == ["ip"]


def test_the_trainer_pod_is_given_the_time_to_write_its_stop_checkpoint() -> None:
    pod = _one("Job", "llamarl-trainer")["spec"]["template"]["spec"]
    config = load_config(REPO / "configs" / "cluster.yaml", environ={})
    assert pod["terminationGracePeriodSeconds"] >= stop_grace_s("trainer", config)
