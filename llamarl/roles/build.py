"""Builds each role's component from the run config: the collaborators it is handed (store, bus,
weight transport) and the parts it owns (policy, learner, prompt set, verifier).

`connect` builds a runtime on the networked store and bus (Redis and the ZeroMQ broker) for a
role process; the synchronous baseline builds its runtimes on in-process ones instead
(`llamarl.launch.sync_run`). Everything else here is the same for both.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from llamarl.algorithms.overlong import overlong_shaping
from llamarl.bus import BusClient
from llamarl.config import EvalSetConfig, RunConfig, writable_run_dir
from llamarl.curve import load_curve
from llamarl.engine.adapters import with_adapters
from llamarl.engine.episodes import Decode, EpisodeRunner, PlaysEpisodes
from llamarl.engine.model import Policy, make_policy, model_directory, place
from llamarl.engine.sampling import sample
from llamarl.engine.vllm_engine import VllmEngine
from llamarl.envs.registry import EnvFactory
from llamarl.errors import ConfigError
from llamarl.limits import RejectHook, Rejections
from llamarl.net import BrokerEndpoints
from llamarl.observe.progress import Listener
from llamarl.rewards import make_verifier
from llamarl.rewards.custom import Problem, UserReward
from llamarl.rewards.judge import JudgeScorer
from llamarl.rewards.reward_model import RewardModelScorer
from llamarl.rewards.scorers import GroupScorer, SampleScorer, TextScorer, VerifierScorer
from llamarl.roles.generator import Generator
from llamarl.roles.held_out import (
    GeneratorEvaluations,
    HeldOutSet,
    TrainerEvaluations,
    shares_evaluations,
)
from llamarl.roles.reward import RewardScorer
from llamarl.roles.runtime import RoleRuntime
from llamarl.roles.trainer import Trainer
from llamarl.roles.trainer_durability import Checkpointer
from llamarl.roles.trainer_follower import TrainerFollower
from llamarl.store import RedisStore, RejectCounts
from llamarl.tasks import Example, make_prompt_set, read_examples
from llamarl.training.checkpoint import CheckpointStore, Restored
from llamarl.training.eval_sets import EvalSet, SetSums, evaluate_set
from llamarl.training.evaluate import Evaluation, evaluate, evaluate_episodes
from llamarl.training.learner import Learner
from llamarl.training.parallel import TrainerRanks
from llamarl.training.sft import starting_policy
from llamarl.training.sharded_checkpoint import load_shards
from llamarl.weightsync import (
    WeightPublisher,
    WeightReceiver,
    advertise_towards,
    check_crosses_processes,
    make_publisher,
    make_receiver,
)
from llamarl.weightsync.flat import WHOLE, Shard
from llamarl.weightsync.messages import MAX_WORKER_ID


def connect(role: str, config: RunConfig, worker_id: str) -> RoleRuntime:
    """A runtime on the run's Redis and broker. Raises ConfigError when either is not set and
    ConnectionError when Redis stays unreachable past `redis.connect_deadline_s`."""
    if config.redis.url is None or config.broker.port is None:
        raise ConfigError("redis.url and broker.port: a worker needs both (or LLAMARL_REDIS_URL, LLAMARL_BROKER)")
    if len(worker_id) > MAX_WORKER_ID:
        raise ConfigError(
            f"worker id {worker_id[:20]!r}... is {len(worker_id)} characters; at most {MAX_WORKER_ID} (set --worker-id)"
        )
    check_crosses_processes(config.sync)
    writable_run_dir(config)  # every role writes its timers there, the trainer its logs
    store = RedisStore(config.redis.url, config.run_id, config.redis.connect_deadline_s)
    rejections = rejections_of(role, config, store)
    endpoints = BrokerEndpoints(config.broker.host, config.broker.port)
    curve = load_curve(config.broker.curve_keys)

    def bus() -> BusClient:
        return BusClient(
            endpoints,
            run_id=config.run_id,
            sender=worker_id,
            hwm=config.broker.hwm,
            max_message_bytes=config.broker.max_message_bytes,
            on_reject=rejections.record,
            curve=curve,
        )

    return RoleRuntime(role, config, worker_id, store, bus(), rejections, bus, bus_name=f"broker {endpoints}")


def rejections_of(role: str, config: RunConfig, store: RejectCounts) -> Rejections:
    """The role's rejection counter, adding its counts to the store in batches."""
    return Rejections(
        role,
        lambda reason, count: store.count_rejected(role, reason, count),
        log_interval_s=config.broker.reject_log_interval_s,
    )


def generator(
    runtime: RoleRuntime,
    receiver: WeightReceiver | None = None,
    policy: Policy | None = None,
    evaluates: bool = True,
) -> Generator:
    """A generator with its own policy on `generation.device` in `generation.dtype` (or
    `policy`, shared with a trainer in the same process) and its own sampling stream, seeded
    from the run's seed and its worker id; it takes on held-out evaluations when `evaluates`
    and the run shares its evaluations (`llamarl.roles.held_out`)."""
    config = runtime.config
    if receiver is None:
        curve = load_curve(config.broker.curve_keys)
        receiver = make_receiver(config.sync, runtime.worker_id, curve)
    seed = config.seed * 100_003 + zlib.crc32(runtime.worker_id.encode())
    if policy is None:
        with runtime.keep_alive("starting"):
            policy = make_policy(config.model, config.seed)
        gen = config.generation
        place(policy, gen.device, gen.dtype)
        policy = with_adapters(policy, config.model.lora, config.seed)
    evaluations = None
    if evaluates and shares_evaluations(config):
        evaluations = GeneratorEvaluations(runtime, held_out_evaluation(config, policy))
    engine = None
    if config.generation.engine == "vllm":
        with runtime.keep_alive("starting"):
            engine = start_engine(config, policy, seed)
    return Generator(
        runtime,
        policy,
        make_prompt_set(config.task, config.seed),
        receiver,
        torch.Generator(device=config.generation.device).manual_seed(seed),
        episode_runner(config, policy, engine.sample if engine else sample, runtime),
        evaluations,
        engine,
    )


def start_engine(config: RunConfig, policy: Policy, seed: int) -> VllmEngine:
    """A vLLM engine on `model.path`, holding `policy`'s weights."""
    assert config.model.path is not None  # preflight refuses vllm without one
    gen = config.generation
    engine = VllmEngine.start(str(model_directory(config.model.path)), gen.vllm, gen.device, policy.eos_id, seed)
    engine.load(policy.model)
    return engine


def episode_runner(
    config: RunConfig,
    policy: Policy,
    decode: Decode = sample,
    runtime: RoleRuntime | None = None,
) -> PlaysEpisodes | None:
    """What plays `policy`'s episodes in the configured environment, sampling with `decode`
    (None: single-turn); an agent's with the endpoint's refusals and counts going to
    `runtime`'s."""
    if config.environment.kind is None:
        return None
    if config.environment.kind == "agent":
        from llamarl.agents.runner import AgentRunner

        name = Path(config.model.path).name if config.model.path else config.run_id
        endpoint = config.generation.openai
        if runtime is None:  # an evaluation's own endpoint, beside a generator's in its process
            free = endpoint.model_copy(update={"port": 0})
            return AgentRunner(policy, config.environment, free, name, decode)
        return AgentRunner(
            policy,
            config.environment,
            endpoint,
            name,
            decode,
            on_reject=runtime.rejections.record,
            count=runtime.count,
        )
    factory = EnvFactory(config.environment, make_verifier(config.task.verifier))
    return EpisodeRunner(policy, factory, config.environment, decode)


def text_scorer(config: RunConfig, on_problem: Problem | None = None) -> SampleScorer | VerifierScorer:
    """The task's verifier or the user's own function (`task.reward`, which reads a group's
    data row through the prompt set), for the reward role and the held-out score."""
    task = config.task
    if task.reward is None:
        return VerifierScorer(make_verifier(task.verifier), task.verifier)
    prompt_set = make_prompt_set(task, config.seed)
    return SampleScorer(UserReward(task, on_problem), prompt_set.train_item)


def scorer(
    config: RunConfig,
    loading: Callable[[], AbstractContextManager[Any]],
    on_problem: Problem | None = None,
) -> GroupScorer:
    """`text_scorer`, with the reward model (`task.reward_model`) and the generative judge
    (`task.judge`, each loaded inside `loading()`) when there are."""
    task = config.task
    scorer: GroupScorer = text_scorer(config, on_problem)
    if task.reward_model is not None:
        with loading():
            scorer = RewardModelScorer(
                task.reward_model,
                task.reward_model_weight,
                None if task.reward_model_only else scorer,
            )
    if task.judge is not None:
        prompt_set = make_prompt_set(task, config.seed)
        with loading():
            scorer = JudgeScorer(task.judge, scorer, lambda index: prompt_set.train_item(index).row, on_problem)
    return scorer


def reward(runtime: RoleRuntime) -> RewardScorer:
    """A reward worker with the config's scorer."""

    def loading() -> AbstractContextManager[Any]:
        return runtime.keep_alive("loading a reward model or judge")

    return RewardScorer(runtime, scorer(runtime.config, loading, runtime.rejections.record))


def checkpoint_store(config: RunConfig) -> CheckpointStore:
    return CheckpointStore(Path(config.run_dir) / "checkpoints", config.run_id, config.trainer.keep_checkpoints)


def learner(
    config: RunConfig,
    policy: Policy,
    restored: Restored | None,
    ranks: TrainerRanks | None,
) -> Learner:
    """The learner on `policy` placed where the trainer computes, with the restored reference
    model and optimizer state (under DistributedDataParallel with ranks) and its learning-rate
    schedule at the restored step."""
    trainer_config = config.trainer
    device = ranks.device if ranks is not None else torch.device(trainer_config.device)
    place(policy, device, trainer_config.dtype)
    reference = restored.reference if restored is not None else None
    if reference is not None:
        place(reference, device, trainer_config.dtype)
    gen = config.generation
    algorithm = config.algorithm.with_loss_constant(gen.max_new_tokens)
    built = Learner(
        policy,
        algorithm,
        trainer_config,
        gen.temperature,
        reference,
        min_new_tokens=gen.min_new_tokens,
        ranks=ranks,
    )
    if restored is not None and restored.sharded:
        load_shards(built.policy.model, built.optimizer, restored.path)
    elif restored is not None and restored.optimizer_state is not None:
        if ranks is not None and trainer_config.sharding == "fsdp":
            raise ConfigError(
                f"checkpoint {restored.path} holds a replica's optimizer state (trainer.sharding "
                "ddp): resume it with trainer.sharding: ddp, or start a new run_dir"
            )
        built.optimizer.load_state_dict(restored.optimizer_state)
    if restored is not None:
        built.resume_schedule(restored.state.step)
    return built


def shard_publisher(config: RunConfig, ranks: TrainerRanks | None, on_reject: RejectHook | None) -> WeightPublisher:
    """This trainer rank's end of the weight transport, for its own shard of each version."""
    rows = config.trainer.sharding == "fsdp"
    shard = Shard(ranks.rank, ranks.world, rows) if ranks is not None else WHOLE
    curve = load_curve(config.broker.curve_keys)
    sync = advertise_towards(config.sync, config.broker.host)
    return make_publisher(sync, config.run_id, curve, on_reject, shard)


def trainer(
    runtime: RoleRuntime,
    publisher: WeightPublisher | None = None,
    ranks: TrainerRanks | None = None,
    evaluates_all: bool = False,
) -> Trainer:
    """The trainer (rank 0 of `ranks`), resumed from its run's newest checkpoint when there is
    one. Its wall clock starts here, before the model is loaded or warm-started. It evaluates
    before RL and after the last step, and in between when `evaluates_all` (a sync run) or
    the run does not share its evaluations; else it shares them (`llamarl.roles.held_out`)."""
    started = runtime.clock()
    config = runtime.config
    prompt_set = make_prompt_set(config.task, config.seed)
    checkpoints = checkpoint_store(config)
    with runtime.keep_alive("starting") as phase:  # loading or warm-starting can take minutes
        latest = checkpoints.latest()
        restored = checkpoints.load(latest) if latest is not None else None
        if restored is not None:
            policy = restored.policy
        else:
            policy = starting_policy(config, prompt_set, phase.report)
            if config.model.lora is not None and config.trainer.sharding == "ddp":
                checkpoints.save_base(policy)
    policy = with_adapters(policy, config.model.lora, config.seed)
    learner_ = learner(config, policy, restored, ranks)
    if publisher is None:
        publisher = shard_publisher(config, ranks, runtime.rejections.record)
    evaluation = held_out_evaluation(config, policy)

    def evaluate_now() -> Evaluation:
        with runtime.keep_alive("evaluating") as phase:
            return evaluation(phase.report)

    checkpointer = Checkpointer(
        checkpoints, runtime.store, config.trainer.checkpoint_every, config.trainer.sharding == "fsdp", ranks
    )
    shared = None
    if not evaluates_all and shares_evaluations(config):
        counters = restored.state.counters if restored is not None else {}
        shared = TrainerEvaluations(runtime, evaluation, counters)
    return Trainer(runtime, learner_, publisher, checkpointer, evaluate_now, restored, started, ranks, shared)


def held_out_evaluation(config: RunConfig, policy: Policy, on_problem: Problem | None = None) -> HeldOutSet:
    """The task's held-out prompts and the named evaluation sets (`evaluation.sets`), evaluated
    with `policy` (greedy, so every sharded rank takes the same steps; a set's samples seeded).
    The held-out score is the task's verifier's, or `task.reward`'s."""
    held_out = make_prompt_set(config.task, config.seed).eval_items()
    score = text_scorer(config, on_problem).score_texts
    gen = config.generation
    runner = episode_runner(config, policy)
    if runner is not None:
        with_env = runner

        def run_episodes(examples: Sequence[Example], listener: Listener | None) -> Evaluation:
            return evaluate_episodes(with_env, examples, score, gen.max_new_tokens, listener=listener)

        return HeldOutSet(held_out, run_episodes)

    def run(examples: Sequence[Example], listener: Listener | None) -> Evaluation:
        return evaluate(policy, examples, score, gen.max_new_tokens, gen.min_new_tokens, listener=listener)

    def run_part(eval_set: EvalSet, first: int, examples: Sequence[Example]) -> SetSums:
        return evaluate_set(policy, eval_set, first, examples, gen.max_new_tokens, gen.min_new_tokens)

    return HeldOutSet(held_out, run, eval_sets(config, on_problem), run_part)


def eval_sets(config: RunConfig, on_problem: Problem | None = None) -> tuple[EvalSet, ...]:
    """The named evaluation sets (`evaluation.sets`), their prompts read like the task's."""
    built = []
    for each in config.evaluation.sets:
        field = f"evaluation.sets.{each.name}.path"
        examples = read_examples(each.path, config.task, field, each.max_prompts)
        built.append(
            EvalSet(
                each.name,
                examples,
                set_scorer(config, each, on_problem),
                each.num_samples,
                each.temperature,
                each.ks,
                each.pass_threshold,
                config.seed,
            )
        )
    return tuple(built)


def set_scorer(config: RunConfig, each: EvalSetConfig, on_problem: Problem | None) -> TextScorer:
    """What scores a set: its own verifier or reward function, else the task's."""
    if each.reward is not None:
        task = config.task.model_copy(update={"reward": each.reward})
        return SampleScorer(UserReward(task, on_problem)).score_texts
    if each.verifier is not None:
        return VerifierScorer(make_verifier(each.verifier), each.verifier).score_texts
    return text_scorer(config, on_problem).score_texts


def trainer_follower(config: RunConfig, ranks: TrainerRanks, store: RedisStore) -> TrainerFollower:
    """A trainer rank other than 0: the model of the newest checkpoint (or a fresh one: its
    weights come from rank 0 when the learner wraps it), its shard's publisher."""
    checkpoints = checkpoint_store(config)
    latest = checkpoints.latest()
    restored = checkpoints.load(latest) if latest is not None else None
    policy = restored.policy if restored is not None else make_policy(config.model, config.seed)
    policy = with_adapters(policy, config.model.lora, config.seed)
    overlong = overlong_shaping(config.sampling, config.generation.max_new_tokens, policy.eos_id)
    return TrainerFollower(
        ranks,
        learner(config, policy, restored, ranks),
        shard_publisher(config, ranks, None),
        store,
        config.sync.timeout_s,
        held_out_evaluation(config, policy),
        checkpoints,
        overlong,
    )
