"""Multi-turn episodes on the built model: the environment's tokens are in the sequence but not
in the loss and have no behaviour log-prob, per-token versions, limits and the reasons episodes
end, the trainer's door, and the environment registry's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llamarl.config import EnvironmentConfig, ModelConfig, RunConfig
from llamarl.engine.episodes import EpisodeRunner, Sampling
from llamarl.engine.model import build_policy
from llamarl.engine.rollouts import oldest_version, pack_episodes, score_group, train_group
from llamarl.engine.turns import TurnRenderer
from llamarl.envs.registry import EnvFactory, environment_class
from llamarl.errors import ConfigError, ProtocolError
from llamarl.protocol import ScoredGroup, TypedArray
from llamarl.rewards import make_verifier
from llamarl.rewards.scorers import VerifierScorer
from llamarl.roles.admission import check_scored
from llamarl.tasks import make_prompt_set
from llamarl.training.learner import Learner
from tests import episode_envs

EXTRA = '<>/{}":acelorstu'


def runner(kind: str, **fields: object) -> EpisodeRunner:
    policy = build_policy(ModelConfig(extra_characters=EXTRA), seed=0)
    config = EnvironmentConfig(kind=kind, **fields)  # type: ignore[arg-type]
    return EpisodeRunner(policy, EnvFactory(config, make_verifier("exact_int")), config)


def examples(count: int = 2) -> list:  # type: ignore[type-arg]
    task = make_prompt_set(RunConfig().task, seed=0)
    return [task.train_item(i) for i in range(count)]


def play(run: EpisodeRunner, num_samples: int = 4, versions: list[int] | None = None) -> list:  # type: ignore[type-arg]
    sequence = iter(versions or [3] * 10)
    current = [0]

    def before_turn() -> None:
        current[0] = next(sequence)

    sampling = Sampling(8, generator=torch.Generator().manual_seed(0))
    return run.run(examples(), num_samples, sampling, lambda: current[0], before_turn)


def test_environment_tokens_have_version_minus_one_and_no_logprob() -> None:
    episodes = play(runner("tests.episode_envs:TwoTurnEnv"), versions=[3, 5])
    (group, _) = pack_episodes(episodes, examples(), [(0, 0), (1, 0)])
    tokens = group.completion_tokens.to_numpy()
    versions = group.token_versions.to_numpy()
    logprobs = group.behaviour_logprobs.to_numpy()
    lengths = group.completion_lengths.to_numpy()
    reply = [int(t) for t in run_ids("= 7 ")]
    for row, episode in enumerate(episodes[:4]):
        assert episode.end == "done" and episode.num_model_turns == 2
        first = next(i for i, v in enumerate(versions[row]) if v != 3)
        assert list(tokens[row, first : first + len(reply)]) == reply  # the env's text, as is
        env = np.zeros(tokens.shape[1], bool)
        env[first : first + len(reply)] = True
        assert (versions[row][env] == -1).all() and (logprobs[row][env] == 0).all()
        model = ~env & (np.arange(tokens.shape[1]) < lengths[row])
        assert (logprobs[row][model] < 0).all()
        # The second turn was sampled after a newer version was taken up.
        assert set(versions[row][model]) == {3, 5}
        assert [t["role"] for t in episode.turns] == ["assistant", "tool", "assistant"]
    # The staleness gate and the trainer judge the episode by its oldest token.
    assert oldest_version(group) == 3


def run_ids(text: str) -> list[int]:
    policy = build_policy(ModelConfig(extra_characters=EXTRA), seed=0)
    return list(policy.tokenizer(text, add_special_tokens=False).input_ids)


def test_loss_gradient_is_zero_on_environment_tokens() -> None:
    run = runner("tests.episode_envs:TwoTurnEnv")
    episodes = play(run, versions=[0, 0])
    groups = pack_episodes(episodes, examples(), [(0, 0), (1, 0)])
    rewards = TypedArray.from_numpy(np.array([1, 0, 1, 0], np.float32))
    trained = [train_group(ScoredGroup(g, rewards, "test")) for g in groups]
    policy = run.policy
    config = RunConfig()
    learner = Learner(policy, config.algorithm, config.trainer, temperature=1.0)
    seen: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
        output.retain_grad()
        seen.append(output)

    hook = policy.model.lm_head.register_forward_hook(keep)
    learner.step(trained[:1])
    hook.remove()
    # The completions' pass: the logit at position j predicts completion token j + 1.
    logits = next(t for t in reversed(seen) if t.shape[1] > 1)
    assert logits.grad is not None
    grad = logits.grad.abs().sum(-1)
    versions = groups[0].token_versions.to_numpy()[:, : grad.shape[1] + 1]
    lengths = groups[0].completion_lengths.to_numpy()
    real = np.arange(1, versions.shape[1])[None, :] < lengths[:, None]
    env = torch.from_numpy((versions[:, 1:] < 0) & real)
    model = torch.from_numpy((versions[:, 1:] >= 0) & real)
    assert env.any() and float(grad[env].sum()) == 0.0
    assert float(grad[model].sum()) > 0.0


def test_a_slow_step_ends_its_episode_with_its_reason() -> None:
    episode_envs.RELEASE.clear()
    try:
        episodes = play(runner("tests.episode_envs:SlowEnv", step_timeout_s=0.5), num_samples=2)
    finally:
        episode_envs.RELEASE.set()
    ends = [(e.example.index, e.end) for e in episodes]
    assert ends == [(0, "done"), (0, "done"), (1, "env_timeout"), (1, "env_timeout")]
    assert episodes[2].error == "timeout"


def test_limits_end_episodes_by_turns_and_tokens() -> None:
    by_turns = play(runner("tests.episode_envs:TwoTurnEnv", max_turns=1), num_samples=2)
    assert {e.end for e in by_turns} == {"max_turns"}
    assert all(e.num_model_turns == 1 for e in by_turns)
    by_tokens = play(runner("tests.episode_envs:TwoTurnEnv", max_tokens=10), num_samples=2)
    assert "max_tokens" in {e.end for e in by_tokens}
    assert all(len(e.tokens) <= 10 for e in by_tokens)
    # The turn that reaches the limit is still judged: the environment's reward counts.
    assert all(e.reward is not None for e in by_tokens if e.num_model_turns == 2)


def test_an_environment_answering_with_anything_but_an_envstep_ends_its_episode() -> None:
    examples_ = examples(5)
    run = runner("tests.episode_envs:BadOutputEnv")
    episodes = run.run(examples_, 1, Sampling(8, generator=torch.Generator().manual_seed(0)), lambda: 0)
    assert [e.end for e in episodes] == ["env_error"] * 5
    errors = [str(e.error) for e in episodes]
    assert "not an EnvStep" in errors[0] and "messages must be" in errors[1]
    assert all("finite number within float32's range" in error for error in errors[2:])


def test_an_environment_that_raises_ends_its_episode_and_the_trainer_refuses_its_group() -> None:
    episodes = play(runner("tests.episode_envs:RaisingEnv"), num_samples=2)
    assert [e.end for e in episodes] == ["env_error", "env_error", "done", "done"]
    assert "the environment broke" in str(episodes[0].error)


def test_a_start_of_no_tokens_ends_its_episodes_before_the_sampler_and_packs_a_group() -> None:
    run = runner("tests.episode_envs:EmptyStartEnv")
    episodes = play(run, num_samples=2)
    assert [e.end for e in episodes] == ["env_error", "env_error", "done", "done"]
    assert "empty_context" in str(episodes[0].error) and episodes[0].num_model_turns == 0
    group = pack_episodes(episodes, examples(), [(0, 0), (1, 0)])[0]
    scored = score_group(group, VerifierScorer(make_verifier("exact_int"), "exact_int"))
    check_scored(scored, vocab_size=64, policy_version=3)  # the trainer takes it, to set it aside


def test_environment_rewards_win_over_the_scorer_and_records_are_checked() -> None:
    episodes = play(runner("tests.episode_envs:TwoTurnEnv"), num_samples=2)
    group = pack_episodes(episodes, examples(), [(0, 0), (1, 0)])[0]
    scored = score_group(group, VerifierScorer(lambda text, answer: 0.5, "half"))
    given = [e.reward for e in episodes[:2]]
    assert list(scored.rewards.to_numpy()) == given and scored.scorer == "environment"
    check_scored(scored, vocab_size=64, policy_version=3)
    broken = ScoredGroup(group.__class__(**{**group.__dict__, "episodes": "[{}]"}), scored.rewards, "x")
    with pytest.raises(ProtocolError, match="bad_episodes"):
        check_scored(broken, vocab_size=64, policy_version=3)
    logprobs = group.behaviour_logprobs.to_numpy().copy()
    logprobs[group.token_versions.to_numpy() < 0] = -0.5
    lying = group.__class__(**{**group.__dict__, "behaviour_logprobs": TypedArray.from_numpy(logprobs)})
    with pytest.raises(ProtocolError, match="bad_logprob"):
        check_scored(ScoredGroup(lying, scored.rewards, "x"), vocab_size=64, policy_version=3)


def test_a_custom_environment_is_checked_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="environment.kind no_such_module:Env: cannot import"):
        environment_class("no_such_module:Env")
    with pytest.raises(ConfigError, match="is not a class with start"):
        environment_class("tests.episode_envs:RELEASE")
    with pytest.raises(ValueError, match="fsdp ranks evaluate together"):
        RunConfig.model_validate({"environment": {"kind": "retry"}, "trainer": {"ranks": 2, "sharding": "fsdp"}})
    with pytest.raises(ValueError, match="generation.min_new_tokens"):
        RunConfig.model_validate({"environment": {"kind": "retry"}, "generation": {"min_new_tokens": 2}})


def test_a_reply_is_what_follows_the_model_turn_even_when_the_template_rewrites_it() -> None:
    """A template that renders the last assistant turn differently (as Qwen3's adds an empty
    think block): the reply is read after the model's text in the whole conversation."""
    policy = build_policy(ModelConfig(), seed=0)
    policy.tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'user' %}-{% elif m.role == 'assistant' %}*"
        "{% if loop.last %}00{% endif %}{% else %} {% endif %}{{ m.content }}={% endfor %}"
        "{% if add_generation_prompt %}*{% endif %}"
    )
    policy.chat = True
    renderer = TurnRenderer(policy)
    history = [{"role": "user", "content": "1+1"}]
    assert renderer.prompt(history) == run_ids("-1+1=*")
    reply = renderer.reply(history, True, [{"role": "tool", "content": "2"}])
    assert reply == run_ids("= 2=*")
