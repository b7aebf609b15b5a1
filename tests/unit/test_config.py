"""Config validation: every shipped config loads; bad keys and values name the field, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llamarl.config import AlgorithmConfig, apply_overrides, load_config, parse_config
from llamarl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_configs_directory_is_not_empty() -> None:
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    config = load_config(path, environ={})
    assert config.run_id


def test_misspelt_key_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.lrr: Extra inputs"):
        parse_config({"trainer": {"lrr": 0.1}}, environ={})


def test_out_of_range_value_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^generation\.top_p: Input should be less than"):
        parse_config({"generation": {"top_p": 1.5}}, environ={})


def test_env_overrides_apply_and_are_validated() -> None:
    env = {
        "LLAMARL_REDIS_URL": "redis://example:6380/1",
        "LLAMARL_BROKER": "10.0.0.5:7000",
        "LLAMARL__TRAINER__LR": "0.001",
    }
    config = parse_config({}, environ=env)
    assert config.redis.url == "redis://example:6380/1"
    assert (config.broker.host, config.broker.port) == ("10.0.0.5", 7000)
    assert config.trainer.lr == 0.001
    with pytest.raises(ConfigError, match=r"^trainer\.lr"):
        parse_config({}, environ={"LLAMARL__TRAINER__LR": "-1"})
    with pytest.raises(ConfigError, match="LLAMARL_BROKER"):
        parse_config({}, environ={"LLAMARL_BROKER": "nohostport"})


def test_command_line_overrides_set_the_environment_overrides_they_stand_for() -> None:
    environ = {"LLAMARL__TRAINER__LR": "0.5"}
    apply_overrides(["trainer.lr=0.001", "staleness.max_staleness=3", "run_id=x"], environ)
    config = parse_config({"trainer": {"lr": 0.1}}, environ=environ)
    assert (config.trainer.lr, config.staleness.max_staleness, config.run_id) == (0.001, 3, "x")
    for bad in ("trainer.lr", "trainer..lr=1", "=1", "trainer.l-r=1"):
        with pytest.raises(ConfigError, match=r"^override .*: write section\.field=value"):
            apply_overrides([bad], {})


def test_config_check_applies_overrides_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.cli import main

    # The command sets its overrides in the process's environment: a copy, for this test only.
    monkeypatch.setattr(os, "environ", dict(os.environ))
    tiny = str(REPO / "configs" / "tiny.yaml")
    assert main(["config", "check", tiny, "staleness.max_staleness=4"]) == 0
    assert "max_staleness: 4" in capsys.readouterr().out
    assert main(["config", "check", tiny, "trainer.num_step=5"]) == 2
    assert capsys.readouterr().err.strip() == ("config error: trainer.num_step: Extra inputs are not permitted")


def test_overrides_after_options_reach_the_config_and_stray_words_are_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.cli import main

    monkeypatch.setattr(os, "environ", dict(os.environ))
    tiny = str(REPO / "configs" / "tiny.yaml")
    # The misspelt override after --mode is applied (and refused) before anything starts.
    assert main(["run", tiny, "--mode", "sync", "trainer.num_step=5"]) == 2
    assert "trainer.num_step: Extra inputs are not permitted" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["run", tiny, "--mode", "sync", "stray"])
    assert exited.value.code == 2
    assert "unrecognized arguments: stray" in capsys.readouterr().err


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_config_check_prints_resolved_config() -> None:
    done = _check(REPO / "configs" / "tiny.yaml")
    assert done.returncode == 0, done.stderr
    assert "run_id: tiny" in done.stdout and "max_staleness: 1" in done.stdout


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("trainer:\n  lrr: 0.1\n", "trainer.lrr"),
        ("staleness:\n  max_staleness: -1\n", "staleness.max_staleness"),
        ("task:\n  kind: jsonl\n", "task.kind, task.path"),
        ("algorithm:\n  loss: ppo_clip\n  clip_low: 1.3\n  clip_high: 1.2\n", "algorithm.clip_low"),
        ("algorithm:\n  mis_low: 1.5\n", "algorithm.mis_low"),
        ("algorithm:\n  mis_low: 1.0\n  mis_high: 1.0\n", "algorithm.mis_low, algorithm.mis_high"),
        ("trainer:\n  lr_warmup_steps: 100\n", "trainer.lr_warmup_steps, trainer.num_steps"),
    ],
)
def test_config_check_bad_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, fields: str
) -> None:
    # In process (the command's own entry point is run above): a subprocess costs ~9 s here.
    from workers.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["config", "check", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1
    assert lines[0].startswith(f"config error: {fields}:")


def _refused(tree: dict[str, Any], line: str) -> None:
    """`tree` alone is refused with exactly `line` (fields first), and each rule's test also
    loads the nearest valid config, so a rule that refuses too much fails too."""
    with pytest.raises(ConfigError) as caught:
        parse_config(tree, environ={})
    assert str(caught.value) == line


def test_file_task_without_a_path_is_refused() -> None:
    _refused(
        {"task": {"kind": "jsonl"}},
        "task.kind, task.path: kind jsonl reads prompts from path; set it",
    )
    assert parse_config({"task": {"kind": "parquet", "path": "p.parquet"}}, environ={}).task.path


def test_arithmetic_task_with_a_path_is_refused() -> None:
    _refused(
        {"task": {"path": "prompts.jsonl"}},
        "task.kind, task.path: kind arithmetic ignores path; set kind file",
    )


def test_worked_answers_on_a_file_task_are_refused() -> None:
    _refused(
        {"task": {"kind": "jsonl", "path": "p.jsonl", "show_work": True, "verifier": "final_int"}},
        "task.show_work, task.kind: show_work applies to kind arithmetic only, not jsonl",
    )


def test_worked_answers_with_a_whole_answer_verifier_are_refused() -> None:
    _refused(
        {"task": {"show_work": True}},
        "task.show_work, task.verifier: verifier exact_int scores 0 on worked answers; use final_int",
    )
    assert parse_config({"task": {"show_work": True, "verifier": "final_int"}}).task.show_work


def test_held_out_set_too_large_for_the_digits_is_refused() -> None:
    _refused(
        {"task": {"num_digits": 1, "num_eval": 26}},
        "task.num_eval, task.num_digits: 26 held out of 100 pairs leaves too few to train on (at most 25)",
    )
    assert parse_config({"task": {"num_digits": 1, "num_eval": 25}}, environ={}).task.num_eval == 25


def test_min_new_tokens_above_max_new_tokens_is_refused() -> None:
    _refused(
        {"generation": {"min_new_tokens": 7, "max_new_tokens": 6}},
        "generation.min_new_tokens, generation.max_new_tokens: 7 > 6: EOS would be banned past the end",
    )
    assert parse_config({"generation": {"min_new_tokens": 6}}, environ={}).generation


def test_chat_template_on_the_built_model_is_refused() -> None:
    _refused(
        {"model": {"chat_template": True}},
        "model.chat_template, model.path: the built model's tokenizer has no chat template",
    )
    assert parse_config({"model": {"chat_template": True, "path": "m"}}, environ={}).model


def test_hidden_size_not_a_multiple_of_heads_is_refused() -> None:
    _refused(
        {"model": {"hidden_size": 30, "num_heads": 4}},
        "model.hidden_size, model.num_heads: 30 is not a multiple of 4 heads",
    )
    # The fields only shape the built model; a loaded one ignores them.
    assert parse_config({"model": {"hidden_size": 30, "num_heads": 4, "path": "m"}}, environ={})


def test_odd_head_width_is_refused() -> None:
    _refused(
        {"model": {"hidden_size": 12, "num_heads": 4}},
        "model.hidden_size, model.num_heads: head width 3 is odd; RoPE needs an even one",
    )
    assert parse_config({"model": {"hidden_size": 16, "num_heads": 4}}, environ={}).model


def test_heartbeat_ttl_not_above_the_interval_is_refused() -> None:
    _refused(
        {"workers": {"heartbeat_s": 10, "heartbeat_ttl_s": 10}},
        "workers.heartbeat_ttl_s, workers.heartbeat_s: a live worker would be reported dead "
        "between beats; make the TTL longer",
    )
    assert parse_config({"workers": {"heartbeat_s": 9.5}}, environ={}).workers


def test_one_sample_a_prompt_is_refused() -> None:
    _refused(
        {"generation": {"num_samples": 1}, "algorithm": {"advantage": "rloo"}},
        "generation.num_samples, algorithm.advantage: rloo needs 2 or more samples a prompt to learn anything",
    )
    assert parse_config({"generation": {"num_samples": 2}}, environ={}).generation


def test_completions_longer_than_the_built_model_is_refused() -> None:
    _refused(
        {"generation": {"max_new_tokens": 64}},
        "generation.max_new_tokens, model.max_position_embeddings: 64 new tokens leave no room "
        "for a prompt in 64 positions",
    )
    assert parse_config({"generation": {"max_new_tokens": 63}}, environ={}).generation
    assert parse_config({"generation": {"max_new_tokens": 64}, "model": {"path": "m"}}, environ={})


def test_a_clip_range_must_hold_1() -> None:
    # clip_low and clip_high bound the ratio, so low > high cannot pass their bounds.
    _refused(
        {"algorithm": {"loss": "ppo_clip", "clip_low": 1.3, "clip_high": 1.2}},
        "algorithm.clip_low: Input should be less than 1",
    )
    _refused(
        {"algorithm": {"loss": "ppo_clip", "clip_high": 0.9}}, "algorithm.clip_high: Input should be greater than 1"
    )
    algorithm = parse_config(
        {"algorithm": {"loss": "ppo_clip", "clip_low": 0.8, "clip_high": 1.28}}, environ={}
    ).algorithm
    assert (algorithm.clip_low, algorithm.clip_high) == (0.8, 1.28)


def test_a_clip_range_for_another_loss_is_refused() -> None:
    _refused(
        {"algorithm": {"clip_high": 1.28}},
        "algorithm.clip_low, algorithm.clip_high, algorithm.loss: the clip range is ppo_clip's, not aipo's",
    )


def test_a_masking_band_outside_its_bounds_or_empty_is_refused() -> None:
    _refused({"algorithm": {"mis_low": 0}}, "algorithm.mis_low: Input should be greater than 0")
    _refused({"algorithm": {"mis_low": 1.5}}, "algorithm.mis_low: Input should be less than or equal to 1")
    _refused({"algorithm": {"mis_high": 0.5}}, "algorithm.mis_high: Input should be greater than or equal to 1")
    _refused(
        {"algorithm": {"mis_low": 1.0, "mis_high": 1.0}},
        "algorithm.mis_low, algorithm.mis_high: 1.0 >= 1.0 keeps no ratio",
    )
    _refused(
        {"algorithm": {"mis_level": "sequence"}},
        "algorithm.mis_level, algorithm.mis_low, algorithm.mis_high: mis_level needs a band: set mis_low or mis_high",
    )
    assert parse_config({"algorithm": {"mis_low": 1.0, "mis_high": 1.01}}, environ={}).algorithm


def test_options_that_would_be_ignored_are_refused() -> None:
    _refused(
        {"algorithm": {"loss": "reinforce", "ratio_level": "sequence"}},
        "algorithm.ratio_level, algorithm.loss: reinforce uses no ratio",
    )
    _refused(
        {"algorithm": {"advantage": "rloo", "grpo_scale_by_std": False}},
        "algorithm.grpo_scale_by_std, algorithm.advantage: rloo has no std to divide by",
    )
    _refused(
        {"algorithm": {"kl_in": "reward"}},
        "algorithm.kl_estimator, algorithm.kl_in, algorithm.kl_coef: the KL penalty is off; set kl_coef > 0",
    )
    _refused(
        {"algorithm": {"loss_constant": 100}},
        "algorithm.loss_constant, algorithm.aggregation: loss_constant divides aggregation constant_sum",
    )
    _refused(
        {"trainer": {"lr_min_ratio": 0.1}},
        "trainer.lr_min_ratio, trainer.lr_schedule: lr_min_ratio is the floor of a decay",
    )
    assert parse_config(
        {
            "algorithm": {"kl_in": "reward", "kl_coef": 0.1, "kl_estimator": "k1"},
            "trainer": {"lr_schedule": "cosine", "lr_min_ratio": 0.1},
        },
        environ={},
    )


def test_a_warm_up_as_long_as_the_run_is_refused() -> None:
    _refused(
        {"trainer": {"lr_warmup_steps": 10, "num_steps": 10}},
        "trainer.lr_warmup_steps, trainer.num_steps: a warm-up of 10 steps never ends in 10",
    )
    assert parse_config({"trainer": {"lr_warmup_steps": 9, "num_steps": 10}}, environ={})


def test_constant_sum_divides_by_the_longest_completion_unless_told() -> None:
    dr_grpo = AlgorithmConfig(aggregation="constant_sum")
    assert dr_grpo.with_loss_constant(9).loss_constant == 9
    assert dr_grpo.model_copy(update={"loss_constant": 4}).with_loss_constant(9).loss_constant == 4
    assert AlgorithmConfig().with_loss_constant(9).loss_constant is None


def test_reducing_every_micro_batch_is_refused_without_fsdp() -> None:
    _refused(
        {"trainer": {"ranks": 2, "reduce_gradients": "micro_batch"}},
        "trainer.reduce_gradients, trainer.sharding: reducing every micro-batch keeps only shards "
        "of the gradients, with fsdp; ddp ranks hold whole gradients anyway and reduce once a step",
    )
    trainer = {"ranks": 2, "sharding": "fsdp", "reduce_gradients": "micro_batch"}
    assert parse_config({"trainer": trainer}, environ={}).trainer.reduce_gradients == "micro_batch"


def test_k1_in_the_loss_and_dynamic_sampling_with_the_kl_in_the_reward_are_refused() -> None:
    k1 = {"kl_coef": 0.1, "kl_estimator": "k1"}
    _refused(
        {"algorithm": k1},
        "algorithm.kl_estimator, algorithm.kl_in: k1's gradient is zero in expectation, so as a "
        "loss it only adds noise; use k1 with kl_in: reward, or k2/k3 in the loss",
    )
    in_reward = k1 | {"kl_in": "reward"}
    assert parse_config({"algorithm": in_reward}, environ={}).algorithm.kl_in == "reward"
    _refused(
        {"algorithm": in_reward, "sampling": {"dynamic_sampling": True}},
        "sampling.dynamic_sampling, algorithm.kl_in: dynamic sampling skips groups whose task "
        "rewards are equal, but with the KL in the reward such a group still has advantages; put "
        "the KL in the loss",
    )


def test_an_unquoted_off_means_off(tmp_path: Path) -> None:
    """YAML 1.1 reads `off` as false; the fields that offer "off" take it as meant."""
    path = tmp_path / "off.yaml"
    path.write_text("sampling:\n  overlong: off\nlogging:\n  wandb: off\n")
    config = load_config(path, environ={})
    assert (config.sampling.overlong, config.logging.wandb) == ("off", "off")
    overridden = parse_config({}, environ={"LLAMARL__SAMPLING__OVERLONG": "off"})
    assert overridden.sampling.overlong == "off"


def test_a_family_tool_format_without_a_chat_template_or_an_agent_is_refused() -> None:
    agent = {"kind": "agent", "agent": "tests.user_agents:three_turns"}
    _refused(
        {"environment": agent | {"tool_format": "hermes"}},
        "environment.tool_format, model.chat_template: tool format hermes is written by the model's chat "
        "template; set model.chat_template: true (an instruct model's), or tool_format: llamarl",
    )
    _refused(
        {"environment": {"tool_format": "mistral"}},
        "environment.tool_format, environment.kind: tool_format is how an agent's model writes its calls; "
        "set kind agent",
    )
    assert parse_config({"environment": agent | {"tool_format": "llamarl"}}).environment.tool_format == "llamarl"
