"""Every role on a host of its own: Redis (with a password) and the broker (with CURVE keys) on
host a, the trainer on host b, two generators and the reward worker on host c. Nothing is shared
but the links and the run directory (a shared filesystem). The demo learns from its warm start,
weights travel over gloo between hosts, and the ledger balances. Shared memory cannot cross
hosts and is refused in one line; a host without the keys or the password is refused too."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import REPO
from tests.integration.async_helpers import check_finished_run
from tests.multihost.netns import Cluster
from tests.multihost.roles import (
    PASSWORD,
    Head,
    curve_keys,
    log_tail,
    summary,
    timers,
    worker,
    write_config,
)

STEPS = 60
PROMPTS_PER_STEP = 4
TINY = REPO / "configs" / "tiny.yaml"
NOISE = 0.12  # as tests/integration/test_learning.py: 400 held-out prompts


def demo(tmp_path: Path, warm_start: Path, keys: Path, transport: str = "gloo") -> Path:
    tiny = yaml.safe_load(TINY.read_text())
    tiny["model"] |= {"path": str(warm_start)}
    tiny["trainer"] |= {"sft_steps": 0, "num_steps": STEPS, "eval_every": STEPS}
    tiny["workers"] = {"num_generators": 2, "num_reward": 1, "heartbeat_s": 0.5}
    tiny["broker"] = {"curve_keys": str(keys)}
    tiny["sync"] = {"transport": transport}
    return write_config(tmp_path, "hosts", tiny)


def test_roles_on_three_hosts_learn_and_balance(tmp_path: Path, tiny_warm_start: Path) -> None:
    config = demo(tmp_path, tiny_warm_start, curve_keys(tmp_path))
    run_dir = tmp_path / "hosts"
    logs = run_dir / "logs"
    with Cluster(["a", "b", "c"]) as cluster:
        head = Head(cluster, "a", run_dir, config).start()
        b, c = cluster["b"], cluster["c"]
        trainer_env = {**head.env, "LLAMARL__SYNC__HOST": b.address}
        trainer = worker(b, "trainer", "trainer", config, trainer_env, logs)
        others = [worker(c, "generator", f"generator-{i}", config, head.env, logs) for i in range(2)] + [
            worker(c, "reward", "reward-0", config, head.env, logs)
        ]
        assert trainer.wait(600) == 0, log_tail(logs, "trainer")
        for proc in others:
            assert proc.wait(60) == 0, [log_tail(logs, w) for w in ("generator-0", "reward-0")]
        result = {**summary(run_dir), "ledger": head.ledger()}
    check_finished_run(result, run_dir, STEPS * PROMPTS_PER_STEP, k=1)
    assert result["final_accuracy"] - result["initial_accuracy"] >= NOISE, result
    for generator in ("generator-0", "generator-1"):  # sync.transport auto: gloo across hosts
        assert timers(run_dir, generator)["syncs"] >= 2, log_tail(logs, generator)


def test_shared_memory_across_hosts_is_refused_in_one_line(tmp_path: Path, tiny_warm_start: Path) -> None:
    config = demo(tmp_path, tiny_warm_start, curve_keys(tmp_path), transport="shm")
    logs = tmp_path / "hosts" / "logs"
    with Cluster(["a", "b", "c"]) as cluster:
        head = Head(cluster, "a", tmp_path / "hosts", config).start()
        worker(cluster["b"], "trainer", "trainer", config, head.env, logs)
        generator = worker(cluster["c"], "generator", "generator-0", config, head.env, logs)
        assert generator.wait(120) == 2, log_tail(logs, "generator-0")
    last = log_tail(logs, "generator-0").strip().splitlines()[-1]
    assert last.startswith(
        "config error: sync.transport: shm: the trainer's versions are in "
        "the shared memory of host 'b' and this generator runs on 'c'"
    ), last


def test_a_host_without_the_keys_or_the_password_is_refused(tmp_path: Path) -> None:
    """Host d has no copy of the CURVE keys (the directory is empty there), then the keys but a
    Redis URL without the password: each worker ends with one line, before any work."""
    keys = curve_keys(tmp_path)
    tree = {"broker": {"curve_keys": str(keys)}, "sync": {"transport": "gloo"}}
    config = write_config(tmp_path, "refused", tree)
    logs = tmp_path / "refused" / "logs"
    with Cluster(["a", "d"]) as cluster:
        head = Head(cluster, "a", tmp_path / "refused", config).start()
        d = cluster["d"]
        no_keys = d.run(["mount", "-t", "tmpfs", "tmpfs", str(keys)])
        assert no_keys.returncode == 0, no_keys.stderr
        keyless = worker(d, "generator", "keyless", config, head.env, logs)
        assert keyless.wait(60) == 2, log_tail(logs, "keyless")
        assert d.run(["umount", str(keys)]).returncode == 0
        url = head.redis_url.replace(f":{PASSWORD}@", "")
        passwordless = worker(d, "generator", "passwordless", config, {**head.env, "LLAMARL_REDIS_URL": url}, logs)
        assert passwordless.wait(60) == 2, log_tail(logs, "passwordless")
    for worker_id, says in (
        ("keyless", "config error: broker.curve_keys"),
        ("passwordless", "config error: redis.url "),
    ):
        lines = log_tail(logs, worker_id).strip().splitlines()
        assert lines[-1].startswith(says) and "Traceback" not in "".join(lines), lines[-3:]
