"""The reward role: takes rollout groups off the work queue, scores them (the task's verifier,
the user's reward function or a reward model: a `GroupScorer`) and passes them on to the
trainer."""

from __future__ import annotations

from llamarl.engine.rollouts import score_group
from llamarl.errors import ProtocolError
from llamarl.rewards.scorers import GroupScorer
from llamarl.roles.base import RoleResult
from llamarl.roles.runtime import RoleRuntime
from llamarl.topics import ROLLOUTS, SCORED

POLL_MS = 50
MAX_BATCH = 64  # groups scored between two looks at the control topic


class RewardScorer:
    def __init__(self, runtime: RoleRuntime, scorer: GroupScorer) -> None:
        self.runtime = runtime
        self.scorer = scorer
        config = runtime.config
        credit = config.broker.consumer_credit or config.generation.prompts_per_batch
        self.rollouts = runtime.bus.consume(ROLLOUTS, credit=credit)

    def score_waiting(self, timeout_ms: int) -> int:
        """Score the groups waiting (the first wait up to `timeout_ms`); how many."""
        runtime = self.runtime
        scored = 0
        while scored < MAX_BATCH and (envelope := self.rollouts.recv(timeout_ms)) is not None:
            runtime.timer.busy()
            try:
                result = score_group(envelope.payload, self.scorer)
            except ProtocolError as err:  # malformed episode records: rejected and counted
                runtime.rejections.record(err.reason, str(err))
            else:
                runtime.bus.push(SCORED, result, envelope.policy_version)
                runtime.count("scored")
            runtime.timer.idle()
            scored += 1
            timeout_ms = 0
        return scored

    def start(self) -> None:
        """Nothing before the loop."""

    def run(self) -> RoleResult:
        runtime = self.runtime
        while not runtime.stopping:
            runtime.beat(scored=runtime.counters.get("scored", 0))
            self.score_waiting(POLL_MS)
        scored = int(runtime.counters.get("scored", 0))
        return RoleResult(runtime.role, runtime.worker_id, scored)

    def close(self) -> None:
        """The scorer holds nothing of its own (its queue belongs to the runtime's bus)."""
