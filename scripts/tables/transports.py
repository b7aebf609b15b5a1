"""The transports' tables against their raw limits: weight sync on one host (docs/benchmarks.md)
and across two hosts (docs/scaling-out.md), from `llamarl bench weight-sync`, and the bus
(docs/benchmarks.md), from `llamarl bench bus`."""

from __future__ import annotations

from typing import Any

from tables.figures import counted, load, rounded, spread

ARMS = {
    "shm": ("`shm`", "memcpy"),
    "shm_verified": ("`shm` checksum verified", "memcpy"),
    "gloo": ("`gloo` checksum verified", "raw send/recv"),
    "gloo_size_only": ("`gloo` size only", "raw send/recv"),
}
"""The bench's arms: how the table names each, and the raw limit it is measured against."""


def _pulls(size: dict[str, Any], arm: str, ranks: int, generators: int) -> dict[str, Any]:
    pulls: dict[str, Any] = size[arm][f"ranks_{ranks}"][f"generators_{generators}"]
    return pulls


def weight_sync_local() -> list[str]:
    """Pull seconds of each transport on one host, 1 and 2 trainer ranks, against its raw limit."""
    result = load("weight_sync.json")
    generators, ranks = result["generators"], result["trainer_ranks"]
    big, small = result["sizes"][-1], result["sizes"][0]
    lines = [
        f"| {big['mb']:.0f} MB, pull s | "
        + " | ".join(f"{g} generator{'s' if g > 1 else ''}" for g in generators)
        + f" | 1 generator against the raw limit | {generators[-1]} against 1 | stage s (slowest rank) |",
        "|---" * (len(generators) + 4) + "|",
    ]
    for arm, (label, limit) in ARMS.items():
        base = "memcpy" if arm.startswith("shm") else "raw_gloo"
        for rank in ranks:
            pulls = [spread(_pulls(big, arm, rank, g)["pull_s"], 3, "") for g in generators]
            ratio = big[f"{arm}_vs_{base}"][f"ranks_{rank}"]
            times = big[f"{arm}_time_{generators[-1]}_vs_{generators[0]}"][f"ranks_{rank}"]
            stage = _pulls(big, arm, rank, generators[0])["stage_s"]["median"]
            lines.append(
                f"| {label}, {rank} rank{'s' if rank > 1 else ''} | {' | '.join(pulls)} "
                f"| {rounded(ratio)}x {limit} | {rounded(times)}x | {stage:.3f} |"
            )

    def limits(size: dict[str, Any]) -> str:
        return (
            f"memcpy {spread(size['memcpy_GBps'], 2, ' GB/s')}, raw gloo send/recv "
            f"{spread(size['raw_gloo_GBps'], 2, ' GB/s')}"
        )

    at_small = ", ".join(
        f"{label} {rounded(small[f'{arm}_vs_' + ('memcpy' if arm.startswith('shm') else 'raw_gloo')]['ranks_1'])}x"
        for arm, (label, _) in ARMS.items()
    )
    return [
        *lines,
        "",
        f"The raw limits, measured in the same run: at {big['mb']:.0f} MB {limits(big)}; at {small['mb']:.0f} MB "
        f"{limits(small)}. At {small['mb']:.0f} MB, 1 rank, against the raw limit: {at_small}.",
    ]


def weight_sync_across_hosts() -> list[str]:
    """docs/scaling-out.md's table: gloo pulls across a link against a raw send on it."""
    lines = [
        "| weights | raw gloo send | gloo, 1 rank, 1 generator | ratio | gloo, 2 ranks, 1 generator | ratio "
        "| 2 generators (1 rank / 2 ranks) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in load("weight_sync_across_hosts.json")["sizes"]:
        ratio = size["gloo_vs_raw_gloo"]
        two = [_pulls(size, "gloo", ranks, 2)["pull_s"]["median"] for ranks in (1, 2)]
        two_ms = " / ".join(f"{seconds * 1000:.3g}" for seconds in two)
        lines.append(
            f"| {size['mb']:.0f} MB | {spread(size['raw_gloo_GBps'], unit=' GB/s')} "
            f"| {spread(_pulls(size, 'gloo', 1, 1)['pull_GBps'], unit=' GB/s')} | {rounded(ratio['ranks_1'])} "
            f"| {spread(_pulls(size, 'gloo', 2, 1)['pull_GBps'], unit=' GB/s')} | {rounded(ratio['ranks_2'])} "
            f"| {two_ms} ms |"
        )
    return lines


def bus() -> list[str]:
    """Messages a second through the broker against raw pyzmq, direct and through a bare forwarder."""
    result = load("bus.json")
    return [
        "| pattern | messages/s | against raw |",
        "|---|---|---|",
        f"| raw pyzmq, direct | {counted(result['raw_direct_msgs_per_s'])} | |",
        f"| raw pyzmq, through a bare forwarder | {counted(result['raw_msgs_per_s'])} | 1 |",
        f"| work through the broker (validated, credit {result['credit']}, exactly one consumer each) "
        f"| {counted(result['work_msgs_per_s'])} | {rounded(result['work_vs_raw'])} |",
        f"| fan-out through the broker (validated) | {counted(result['fanout_msgs_per_s'])} "
        f"| {rounded(result['fanout_vs_raw'])} |",
        "",
        f"{result['messages']:,} messages of {result['message_bytes']} bytes a round. Work messages lost: "
        f"{result['work_lost']}; fan-out messages dropped at the subscriber's high-water mark: "
        f"{result['fanout_dropped_at_hwm']:,}, as XPUB does by design.",
    ]
