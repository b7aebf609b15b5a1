"""Every bus topic name, and which message kinds each may carry. Defined here and nowhere else.

Fan-out topics reach every subscriber (XPUB/XSUB); work topics reach exactly one of the competing
consumers (credit-based load balancing in the broker).
"""

VERSIONS = "versions"
CONTROL = "control"
HEARTBEATS = "heartbeats"
ROLLOUTS = "rollouts"
SCORED = "scored"

FANOUT_TOPICS: dict[str, frozenset[str]] = {
    VERSIONS: frozenset({"version"}),
    CONTROL: frozenset({"control"}),
    HEARTBEATS: frozenset({"heartbeat"}),
}
WORK_TOPICS: dict[str, frozenset[str]] = {
    ROLLOUTS: frozenset({"rollout_group"}),
    SCORED: frozenset({"scored_group"}),
}
