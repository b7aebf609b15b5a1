"""A user's own loss and advantage (`algorithm.loss` / `algorithm.advantage` as
`module:function`): the built-in ones meet the contract a user's is held to, the example
(examples/own_algorithm.py) computes what it says, and one that cannot be imported or returns
the wrong thing is refused with one line naming the field, by the check, by `llamarl config
check` and by a trainer before it starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from examples.own_algorithm import cispo, group_mean_batch_std
from llamarl.algorithms.advantages import advantage_function
from llamarl.algorithms.losses import LOSSES, loss_inputs, policy_loss
from llamarl.algorithms.user import advantages_problem, check_user_functions, loss_problem
from llamarl.config import AlgorithmConfig, ModelConfig, TrainerConfig, parse_config
from llamarl.config.learning import BUILT_IN_ADVANTAGES
from llamarl.engine.model import build_policy
from llamarl.errors import ConfigError
from llamarl.training.learner import Learner

CISPO = "examples.own_algorithm:cispo"


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp, behaviour_logp, advantages, mask): ratios 1.5, 1, 0.5 | 1, 1, 1 (padding)."""
    logp = torch.log(torch.tensor([[0.6, 0.2, 0.1], [0.5, 0.4, 0.3]])).requires_grad_()
    behaviour = torch.log(torch.tensor([[0.4, 0.2, 0.2], [0.5, 0.4, 0.3]]))
    return logp, behaviour, torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    ("loss", "level"),
    [
        ("aipo", "token"),
        ("aipo", "sequence"),
        ("ppo_clip", "token"),
        ("ppo_clip", "sequence"),
        ("reinforce", "token"),
    ],
)
def test_every_built_in_loss_meets_the_contract_a_user_loss_is_held_to(loss: str, level: str) -> None:
    algorithm = AlgorithmConfig(loss=loss, ratio_level=level)
    logp, behaviour, advantages, mask = _batch()
    returned = LOSSES[loss](**loss_inputs(algorithm, logp, behaviour, advantages, mask))
    assert loss_problem(returned, logp, mask) is None


@pytest.mark.parametrize("kind", BUILT_IN_ADVANTAGES)
def test_every_built_in_advantage_meets_the_contract_a_user_one_is_held_to(kind: str) -> None:
    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert advantages_problem(advantage_function(kind)(rewards), rewards) is None


def test_the_example_cispo_is_reinforce_on_policy_and_bounds_its_weight_off_policy() -> None:
    logp, behaviour, advantages, mask = _batch()
    options = {"entropy_coef": 0.1, "mis_high": 1.4}  # applied to a user's loss as to ours
    entropy = torch.full_like(logp, 0.5)
    on_policy = policy_loss(CISPO, logp, logp.detach(), advantages, mask, entropy=entropy, **options)
    reinforce = policy_loss("reinforce", logp, logp.detach(), advantages, mask, entropy=entropy, **options)
    assert on_policy.loss.item() == pytest.approx(reinforce.loss.item())
    algorithm = AlgorithmConfig(loss=CISPO, clip_high=1.25)
    per_token, clipped = cispo(**loss_inputs(algorithm, logp, behaviour, advantages, mask))
    weights = torch.tensor([[1.25, 1.0, 0.8], [1.0, 1.0, 1.0]])  # 1.5 -> 1.25, 0.5 -> 0.8
    assert torch.allclose(per_token, -weights * advantages[:, None] * logp)
    assert clipped.tolist() == [[True, False, True], [False, False, False]]
    (gradient,) = torch.autograd.grad(per_token.sum(), logp)
    assert bool((gradient[0] != 0).all()), "unlike PPO-clip, a clipped token keeps its gradient"


def test_the_example_advantage_centres_on_the_group_and_scales_by_the_steps_std() -> None:
    rewards = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    step_std = rewards.std(unbiased=False)  # sqrt(3)/4
    expected = torch.tensor([[-0.5, 0.5], [0.0, 0.0]]) / step_std
    assert torch.allclose(group_mean_batch_std(rewards), expected, atol=1e-5)
    assert torch.equal(group_mean_batch_std(torch.ones(2, 3)), torch.zeros(2, 3))


@pytest.mark.parametrize(
    ("field", "spec", "says"),
    [
        ("loss", "tests.nothing:loss", "cannot import tests.nothing (ModuleNotFoundError"),
        ("loss", "tests.user_losses:nothing", "tests.user_losses has no function nothing; name"),
        ("loss", "tests.user_losses:NOT_A_FUNCTION", "has no function NOT_A_FUNCTION"),
        ("loss", "tests.user_losses:positional", "raised TypeError (positional() got an unexp"),
        ("loss", "tests.user_losses:one_per_sequence", "a loss of shape (2, 1), not (2, 3)"),
        ("loss", "tests.user_losses:loss_only", "returned a Tensor, not a pair (per_token_loss"),
        ("loss", "tests.user_losses:detached", "returned a loss without gradients"),
        ("loss", "tests.user_losses:sqrt_of_zero", "returned a loss whose gradient is not finite"),
        ("advantage", "tests.user_losses:std_of_equal_rewards", "advantages that are not finite"),
        ("advantage", "tests.user_losses:one_per_group", "advantages of shape (2,), not (2, 4)"),
        ("advantage", "tests.user_losses:signs", "of dtype torch.int64, not floating point"),
    ],
)
def test_a_user_function_that_fails_its_check_is_one_line_naming_the_field(field: str, spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_user_functions(AlgorithmConfig.model_validate({field: spec}))
    message = str(refused.value)
    assert message.startswith(f"algorithm.{field} {spec}") and says in message
    assert "\n" not in message


def test_a_user_loss_may_read_the_clip_range_and_other_names_are_refused() -> None:
    assert AlgorithmConfig(loss=CISPO, clip_low=0.9, clip_high=1.3).clip_high == 1.3
    with pytest.raises(ConfigError, match="algorithm.loss: String should match pattern"):
        parse_config({"algorithm": {"loss": "cispo"}})
    with pytest.raises(ConfigError, match="algorithm.advantage: String should match pattern"):
        parse_config({"algorithm": {"advantage": "examples.own_algorithm"}})


def test_config_check_calls_the_users_loss_and_refuses_a_bad_one_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.cli import main

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    own = f"algorithm:\n  loss: {CISPO}\n  advantage: examples.own_algorithm:group_mean_batch_std\n"
    good.write_text(own)
    assert main(["config", "check", str(good)]) == 0
    assert f"loss: {CISPO}" in capsys.readouterr().out
    bad.write_text(own.replace(CISPO, "tests.user_losses:one_per_sequence"))
    assert main(["config", "check", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith(
        "config error: algorithm.loss tests.user_losses:one_per_sequence: on a synthetic batch"
    )


def test_a_trainer_started_alone_checks_the_users_loss_before_it_trains() -> None:
    policy = build_policy(ModelConfig(hidden_size=16, num_layers=1, num_heads=2), seed=0)
    algorithm = AlgorithmConfig(loss="tests.user_losses:detached")
    with pytest.raises(ConfigError, match="algorithm.loss tests.user_losses:detached"):
        Learner(policy, algorithm, TrainerConfig(), temperature=1.0)
