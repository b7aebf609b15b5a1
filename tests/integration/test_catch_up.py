"""A generator that missed versions, or whose pull failed, catches up with the next one: it
pulls only the newest version (never the ones in between), and a failed pull keeps its weights
and is retried on the next version. Real Redis, real broker, the real generator component."""

from __future__ import annotations

from pathlib import Path

from brokers.redis_server import RedisServer
from llamarl.config import RunConfig, parse_config
from llamarl.engine.model import build_policy
from llamarl.net import BrokerEndpoints
from llamarl.protocol import VersionAnnouncement
from llamarl.roles import build
from llamarl.topics import VERSIONS
from llamarl.weightsync import make_publisher
from llamarl.weightsync.flat import flatten

MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


def _config(tmp_path: Path, redis_server: RedisServer, broker: BrokerEndpoints) -> RunConfig:
    """A tiny model on this test's Redis and broker, weights over shared memory."""
    return parse_config(
        {
            "run_id": "test",
            "run_dir": str(tmp_path),
            "model": MODEL,
            "redis": {"url": redis_server.url},
            "broker": {"host": broker.host, "port": broker.port},
            "sync": {"transport": "shm"},
        }
    )


def test_generator_skips_to_the_newest_version_and_recovers_from_a_failed_pull(
    tmp_path: Path, redis_server: RedisServer, broker: BrokerEndpoints
) -> None:
    config = _config(tmp_path, redis_server, broker)
    ctx = build.connect("generator", config, "g0")
    generator = build.generator(ctx)
    publisher = make_publisher(config.sync, config.run_id, None, None)

    def publish(version: int) -> str:
        policy = build_policy(config.model, seed=100 + version)  # distinct weights per version
        meta = publisher.publish(publisher.stage(policy.model, version))
        ctx.store.publish_version(version, meta)
        return str(meta["checksum"])

    def catch_up() -> None:
        """What the generator does when no announcement reached it: ask Redis."""
        meta = generator.newest_announced(wait_ms=10)
        assert meta is not None
        generator.sync_weights(meta)

    def held() -> str:
        return flatten(generator.policy.model, generator.policy_version).checksum

    try:
        for version in range(4):  # the generator is busy while four versions go by
            newest = publish(version)
        catch_up()
        assert generator.policy_version == 3 and held() == newest
        assert ctx.counters["syncs"] == 1, "versions 0..2 must not be pulled"

        publish(4)
        Path(ctx.store.version_meta()["endpoint"]).unlink()  # version 4 vanishes mid-pull
        before = held()
        catch_up()
        assert ctx.counters["sync_failures"] == 1
        assert generator.policy_version == 3 and held() == before, "weights must be untouched"

        newest = publish(5)
        catch_up()
        assert generator.policy_version == 5 and held() == newest
        assert ctx.counters["syncs"] == 2
    finally:
        publisher.close()
        ctx.close()
        ctx.store.close()


def test_generator_learns_of_a_version_from_the_bus_alone(
    tmp_path: Path, redis_server: RedisServer, broker: BrokerEndpoints
) -> None:
    """The announcement wakes the generator: Redis holds no version, so only the `versions`
    subscription can have told it."""
    config = _config(tmp_path, redis_server, broker)
    ctx = build.connect("generator", config, "g0")
    generator = build.generator(ctx)
    publisher = make_publisher(config.sync, config.run_id, None, None)
    trainer_bus = ctx.connect_bus()
    try:
        policy = build_policy(config.model, seed=7)
        meta = publisher.publish(publisher.stage(policy.model, 4))
        announcement = VersionAnnouncement(
            policy_version=4,
            num_bytes=int(meta["num_bytes"]),
            checksum=str(meta["checksum"]),
            transport="shm",
            endpoint=str(meta["endpoint"]),
        )
        heard = None
        for _ in range(50):  # a PUB socket drops what it sends before it has connected
            trainer_bus.publish(VERSIONS, announcement, 4)
            if (heard := generator.newest_announced(wait_ms=200)) is not None:
                break
        assert ctx.store.policy_version() == -1, "nothing in Redis: the bus told it"
        assert heard is not None and heard["policy_version"] == "4"
        generator.sync_weights(heard)
        assert generator.policy_version == 4
        assert flatten(generator.policy.model, 4).checksum == meta["checksum"]
    finally:
        trainer_bus.close()
        publisher.close()
        ctx.close()
        ctx.store.close()
