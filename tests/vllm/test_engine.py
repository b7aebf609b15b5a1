"""The vLLM engine on the real SmolLM2-135M-Instruct, float32: a version the trainer publishes
is the one vLLM samples with; its behaviour log-probs are the trainer's recomputation, with and
without top-p truncation and after a version taken up mid-sequence; sampling is seeded; an
agent's episode over the OpenAI endpoint records what it sampled."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from llamarl.agents.runner import AgentRunner
from llamarl.config import EnvironmentConfig, ShmSync, VllmConfig
from llamarl.config.endpoint import EndpointConfig
from llamarl.engine.continuous import FinishedGroup, Sampler
from llamarl.engine.episodes import Sampling
from llamarl.engine.model import Policy, load_policy
from llamarl.engine.sampling import SampleBatch, sample, sampling_logprobs, token_logprobs
from llamarl.engine.vllm_batch import VllmBatch
from llamarl.engine.vllm_engine import VllmEngine
from llamarl.tasks import Example
from llamarl.weightsync import make_publisher, make_receiver
from tests import user_agents

QUESTIONS = [f"What is {a} plus {b}? Answer with the number." for a, b in zip(range(3, 35), range(40, 72), strict=True)]


@pytest.fixture(scope="module")
def policy(smollm2: Path) -> Policy:
    """The generator's staging model (what the weight receiver fills)."""
    loaded = load_policy(smollm2)
    loaded.chat = True
    return loaded


@pytest.fixture(scope="module")
def engine(smollm2: Path, policy: Policy) -> Iterator[VllmEngine]:
    engine = VllmEngine.start(str(smollm2), VllmConfig(dtype="float32"), "cpu", policy.eos_id, 0)
    yield engine
    engine.load(policy.model)  # the next test starts from the weights on disk


def perturbed(policy: Policy, seed: int, scale: float = 0.05) -> Policy:
    """A copy of `policy` whose every weight moved by `scale` of its spread (a trainer's new
    version, large enough to change greedy completions)."""
    changed = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in changed.model.parameters():
            noise = torch.randn(weight.shape, generator=generator)
            weight.add_(noise * weight.std() * scale)
    return changed


def completions(batch: SampleBatch) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(batch.completion_ids, batch.completion_mask, strict=True)]


def decode_all(batch: VllmBatch, version: int, steps: int | None = None) -> list[FinishedGroup]:
    done: list[FinishedGroup] = []
    taken = 0
    while batch.num_groups and (steps is None or taken < steps):
        done += batch.step(version)
        taken += 1
    return done


def recomputed(policy: Policy, group: FinishedGroup, temperature: float, min_new: int = 0):
    """The trainer's log pi of the group's tokens (`token_logprobs`, which the trainer's
    shared-prompt pass equals), and the logits it came from."""
    b = group.batch
    logp, _ = token_logprobs(
        policy,
        b.prompt_ids,
        b.prompt_mask,
        b.completion_ids,
        b.completion_mask,
        temperature,
        min_new,
    )
    return logp.detach()


def test_a_published_version_is_what_vllm_samples_with(policy: Policy, engine: VllmEngine) -> None:
    prompts = [policy.encode_prompt(q) for q in QUESTIONS]
    greedy = {"num_samples": 1, "max_new_tokens": 16, "greedy": True}
    old = completions(engine.sample(policy, prompts, **greedy))
    trainer = perturbed(policy, seed=1)
    publisher = make_publisher(ShmSync(), "vllm-engine-test")
    receiver = make_receiver(ShmSync(), "generator-test")
    try:
        meta = publisher.publish(publisher.stage(trainer.model, 1))
        meta = {k: str(v) for k, v in meta.items()} | {"policy_version": "1"}
        version, fetched = receiver.fetch(meta)
        receiver.swap_in(policy.model, fetched)
        engine.load(policy.model)
    finally:
        receiver.close()
        publisher.close()
    assert version == 1
    new = completions(engine.sample(policy, prompts, **greedy))
    native = completions(sample(trainer, prompts, **greedy))
    same = sum(a == b for a, b in zip(new, native, strict=True))
    changed = sum(a != b for a, b in zip(new, old, strict=True))
    assert same >= 0.9 * len(prompts), f"vLLM matched the native engine on {same} of 32"
    assert changed >= len(prompts) // 2, f"only {changed} of 32 changed with the new version"


def test_behaviour_logprobs_are_the_trainers_recomputation(policy: Policy, engine: VllmEngine) -> None:
    prompts = [policy.encode_prompt(q) for q in QUESTIONS[:8]]
    sampler = Sampler(4, 16, 4, temperature=0.7, generator=torch.Generator().manual_seed(0))
    batch = VllmBatch(engine, sampler, policy.pad_id)
    batch.admit(list(enumerate(prompts)))
    done = decode_all(batch, version=0)
    assert sorted(f.key for f in done) == list(range(8))
    gaps = []
    for group in done:
        real = group.batch.completion_mask.bool()
        trainer = recomputed(policy, group, 0.7, min_new=4)
        gaps.append((trainer - group.batch.logprobs)[real].abs())
        assert bool((group.versions[real] == 0).all()) and bool((group.versions[~real] == -1).all())
    gap = torch.cat(gaps)
    assert float(gap.mean()) < 1e-3, f"mean |Δ log-prob| {float(gap.mean()):.2e}"


def test_top_p_log_probs_are_of_the_truncated_distribution(policy: Policy, engine: VllmEngine) -> None:
    prompts = [policy.encode_prompt(q) for q in QUESTIONS[:4]]
    sampled = engine.sample(
        policy,
        prompts,
        num_samples=4,
        max_new_tokens=12,
        temperature=0.8,
        top_p=0.7,
        generator=torch.Generator().manual_seed(1),
    )
    ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)
    mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
    with torch.no_grad():
        logits = policy.model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).logits
    width = sampled.prompt_ids.shape[1]
    truncated = sampling_logprobs(logits[:, width - 1 : -1], 0.8, 0.7)
    expected = truncated.gather(-1, sampled.completion_ids[..., None]).squeeze(-1)
    real = sampled.completion_mask.bool()
    gap = (expected - sampled.logprobs)[real].abs()
    assert float(gap.mean()) < 1e-3, f"mean |Δ log-prob| {float(gap.mean()):.2e}"


def test_a_version_taken_up_mid_sequence_samples_the_rest(policy: Policy, engine: VllmEngine) -> None:
    """In-flight update: tokens after the load are tagged with the new version and are drawn
    from it alone; every cached key and value was recomputed with the new weights."""
    prompts = [policy.encode_prompt(q) for q in QUESTIONS[:4]]
    sampler = Sampler(2, 20, 20, generator=torch.Generator().manual_seed(2))
    batch = VllmBatch(engine, sampler, policy.pad_id)
    batch.admit(list(enumerate(prompts)))
    assert decode_all(batch, version=0, steps=8) == []
    newer = perturbed(policy, seed=3)
    engine.load(newer.model)
    done = decode_all(batch, version=1)
    assert len(done) == 4
    old_gaps, new_gaps = [], []
    for group in done:
        versions = group.versions
        assert bool((versions[:, :8] == 0).all()) and bool((versions[:, 8:] == 1).all())
        under_new = recomputed(newer, group, 1.0, min_new=20)
        under_old = recomputed(policy, group, 1.0, min_new=20)
        old_gaps.append((under_old - group.batch.logprobs)[:, :8].abs().flatten())
        new_gaps.append((under_new - group.batch.logprobs)[:, 8:].abs().flatten())
    assert float(torch.cat(old_gaps).mean()) < 1e-3
    assert float(torch.cat(new_gaps).mean()) < 1e-3
    engine.load(policy.model)


def test_a_dropped_group_reports_its_tokens_and_the_rest_finish(policy: Policy, engine: VllmEngine) -> None:
    """A restarted group's request is aborted: `drop` says how many tokens it threw away (what
    `llamarl bench async-vs-sync` counts as extra decode work) and only the others end."""
    prompts = [policy.encode_prompt(q) for q in QUESTIONS[:3]]
    sampler = Sampler(2, 10, 10, generator=torch.Generator().manual_seed(4))
    batch = VllmBatch(engine, sampler, policy.pad_id)
    batch.admit(list(enumerate(prompts)))
    assert decode_all(batch, version=0, steps=3) == []
    assert batch.drop(1) == 2 * 3, "two samples of three tokens each"
    assert sorted(group.key for group in decode_all(batch, version=0)) == [0, 2]


def test_seeded_sampling_repeats(policy: Policy, engine: VllmEngine) -> None:
    prompts = [policy.encode_prompt(q) for q in QUESTIONS[:4]]

    def draw(seed: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(seed)
        return completions(engine.sample(policy, prompts, num_samples=4, max_new_tokens=12, generator=generator))

    first = draw(5)
    assert draw(5) == first
    assert draw(6) != first


def test_an_agent_over_the_endpoint_records_what_vllm_sampled(policy: Policy, engine: VllmEngine) -> None:
    """A three-turn chat agent (`tests.user_agents:three_turns`, the official `openai` client
    over real HTTP) on SmolLM2's chat template, sampled by vLLM: the recorded model tokens are
    the ones each answer carried, and between them only the template's user turns."""
    config = EnvironmentConfig(kind="agent", agent="tests.user_agents:three_turns")
    runner = AgentRunner(policy, config, EndpointConfig(), "smollm2", engine.sample)
    try:
        examples = [Example(0, QUESTIONS[0], "43", row={"a": 3})]
        sampling = Sampling(6, generator=torch.Generator().manual_seed(0))
        (episode,) = runner.run(examples, 1, sampling, lambda: 2)
    finally:
        runner.close()
    assert episode.end == "done" and episode.num_model_turns == 3
    assert episode.prompt == policy.encode_messages([{"role": "user", "content": QUESTIONS[0]}])
    (answers,) = [a for a in user_agents.SEEN.values() if len(a) == 3]
    turns, current, previous = [], [], -1
    for token, version in zip(episode.tokens, episode.versions, strict=True):
        if version >= 0 and previous < 0:
            current = []
            turns.append(current)
        if version >= 0:
            current.append(token)
        previous = version
    assert turns == [a["token_ids"] for a in answers]
    assert {a["policy_version"] for a in answers} == {2}
    environment = [t for t, v in zip(episode.tokens, episode.versions, strict=True) if v < 0]
    text = policy.tokenizer.decode(environment)
    assert text.count("<|im_start|>user\n+1 <|im_end|>") == 2, text
