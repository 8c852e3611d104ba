"""RLOOTrainer on tiny offline models: parameters move, metrics are logged, the leave-one-out layout is
right, micro-batching does not change the update, resuming continues exactly, bad input fails early,
and the score rises on a learnable task."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.rloo.trainer import RLOOTrainer

METRICS = (
    "eps",
    "objective/kl",
    "objective/entropy",
    "objective/non_score_reward",
    "objective/rlhf_reward",
    "objective/scores",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "loss/policy_avg",
    "val/clipfrac_avg",
    "policy/entropy_avg",
    "val/ratio",
    "val/ratio_var",
    "val/num_eos_tokens",
    "lr",
    "episode",
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _config(tmp_path, **kwargs) -> RLOOConfig:
    defaults = dict(
        output_dir=str(tmp_path / "out"),
        report_to="none",
        use_cpu=True,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        rloo_k=2,
        num_ppo_epochs=1,
        response_length=5,
        total_episodes=8,
        logging_steps=1,
        save_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
        seed=3,
        learning_rate=1e-3,
    )
    defaults.update(kwargs)
    return RLOOConfig(**defaults)


def _trainer(tmp_path, tokenizer, reward=None, dataset=None, **kwargs) -> RLOOTrainer:
    return RLOOTrainer(
        _config(tmp_path, **kwargs),
        tokenizer,
        tiny_model("llama"),
        tiny_model("llama"),
        reward if reward is not None else KeywordReward("e"),
        dataset if dataset is not None else toy_prompt_dataset(n=16),
    )


def test_every_trainable_parameter_moves_and_metrics_are_logged(tmp_path, tokenizer):
    reward_model = tiny_model("llama-reward")
    reward_before = {k: v.clone() for k, v in reward_model.state_dict().items()}
    trainer = RLOOTrainer(
        _config(
            tmp_path,
            gradient_accumulation_steps=2,
            num_mini_batches=2,
            num_ppo_epochs=2,
            total_episodes=32,
            num_sample_generations=2,
            num_sample_prompts=2,
            stop_token="eos",
            missing_eos_penalty=1.0,
        ),
        tokenizer,
        tiny_model("llama"),
        tiny_model("llama"),
        reward_model,
        toy_prompt_dataset(n=16),
        eval_dataset=toy_prompt_dataset("test", n=3),
    )
    policy_before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    ref_before = {n: p.detach().clone() for n, p in trainer.ref_policy.named_parameters()}
    trainer.train()

    assert trainer.state.global_step == 2  # 32 episodes / (4 * 2 * 2 per update)
    for name, param in trainer.policy.named_parameters():
        assert not torch.equal(param, policy_before[name]), f"{name} did not move"
    for name, param in trainer.ref_policy.named_parameters():
        assert torch.equal(param, ref_before[name]), f"reference {name} moved"
    for name, value in reward_model.state_dict().items():
        assert torch.equal(value, reward_before[name]), f"reward model {name} moved"

    logs = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert len(logs) == 2
    for entry in logs:
        assert set(METRICS) <= set(entry)
        assert all(torch.isfinite(torch.tensor(float(entry[k]))) for k in METRICS)
    assert [entry["episode"] for entry in logs] == [16, 32]
    # the first update samples from the reference weights: KL is zero up to the rounding difference between
    # the generation-time logprobs (KV cache) and the reference's full forward pass
    assert logs[0]["objective/kl"] == pytest.approx(0.0, abs=1e-4)

    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 1, 2, 2] and {"query", "response", "score"} <= set(rows[0])
    assert (tmp_path / "out" / "samples.csv").read_text().startswith("step,query,response,score")

    trainer.save_model(str(tmp_path / "final"))
    trainer.create_model_card(model_name="tiny-rloo", dataset_name="toy", tags=["test"])
    assert (tmp_path / "final" / "model.safetensors").exists()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "tiny-rloo" in card and "- rloo" in card and "- test" in card


def test_advantages_use_the_other_completions_of_the_same_prompt(tmp_path, tokenizer):
    generator = torch.Generator().manual_seed(0)
    calls = []

    def random_reward(completions, prompts):
        values = torch.randn(len(completions), generator=generator).tolist()
        calls.append((prompts, values))
        return values

    k = 3
    trainer = _trainer(
        tmp_path,
        tokenizer,
        random_reward,
        per_device_train_batch_size=6,
        rloo_k=k,
        kl_coef=0.0,
        total_episodes=6,
        local_rollout_forward_batch_size=4,
    )
    rollout, metrics = trainer._rollout(0)
    prompts = [p for call in calls for p in call[0]]
    scores = torch.tensor([v for call in calls for v in call[1]])
    assert len(calls) == 2  # 6 rows scored in chunks of at most 4
    num_prompts = 6 // k
    for i in range(num_prompts):
        rows = [i * k + j for j in range(k)]  # a prompt's k completions on consecutive rows
        assert len({prompts[r] for r in rows}) == 1, "completions of one prompt must share it"
        for r in rows:
            others = [scores[o] for o in rows if o != r]
            # kl_coef = 0: advantage = own score - mean score of the other k-1 completions
            expected = scores[r] - sum(others) / (k - 1)
            torch.testing.assert_close(rollout.advantages[r], expected)
    assert metrics["objective/scores"] == pytest.approx(scores.mean().item(), abs=1e-6)


def test_micro_batching_does_not_change_the_update(tmp_path, tokenizer):
    finals = []
    start = {n: p.detach().clone() for n, p in tiny_model("llama").named_parameters()}
    for per_device, accumulation in ((4, 1), (1, 4)):
        torch.manual_seed(0)
        trainer = _trainer(
            tmp_path / f"{per_device}",
            tokenizer,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=accumulation,
            total_episodes=4,
            max_grad_norm=0.0,
        )
        trainer.train()
        finals.append({n: p.detach().clone() for n, p in trainer.policy.named_parameters()})
    # Adam turns tiny gradient rounding differences into visible ones; demand agreement well below the
    # size of the update itself (learning rate 1e-3)
    for name in finals[0]:
        assert (finals[0][name] - start[name]).abs().max() > 5e-4, name
        torch.testing.assert_close(finals[0][name], finals[1][name], atol=5e-5, rtol=0)


def test_resume_from_checkpoint_continues_exactly(tmp_path, tokenizer):
    kwargs = dict(per_device_train_batch_size=2, total_episodes=8, save_strategy="steps", save_steps=2)
    full = _trainer(tmp_path / "full", tokenizer, **kwargs)
    full.train()
    checkpoint = tmp_path / "full" / "out" / "checkpoint-2"
    assert (checkpoint / "trainer_state.json").exists() and (checkpoint / "optimizer.pt").exists()

    resumed = _trainer(tmp_path / "resumed", tokenizer, **kwargs)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == full.state.global_step == 4
    for (name, a), b in zip(full.policy.named_parameters(), resumed.policy.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=f"{name} differs after resuming")
    full_logs = [h["objective/scores"] for h in full.state.log_history if "objective/scores" in h]
    resumed_logs = [h["objective/scores"] for h in resumed.state.log_history if "objective/scores" in h]
    assert resumed_logs == full_logs


@pytest.mark.parametrize(
    "dataset, kwargs, match",
    [
        (Dataset.from_dict({"prompt": []}), {}, "empty"),
        (Dataset.from_dict({"text": ["a", "b"]}), {}, "'prompt' column"),
        (
            Dataset.from_dict({"prompt": ["a b c"] * 8}),
            {"response_length": 600},
            "512-token context of the policy",
        ),
        (
            Dataset.from_dict({"prompt": ["a b c"] * 3}),
            {"per_device_train_batch_size": 8},
            "one update needs 4",
        ),
    ],
)
def test_bad_datasets_fail_before_training(tmp_path, tokenizer, dataset, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, tokenizer, dataset=dataset, **kwargs)


def test_reward_function_errors_name_the_function_at_the_step(tmp_path, tokenizer):
    def broken_reward(completions):
        return [0.0]

    trainer = _trainer(tmp_path, tokenizer, broken_reward)
    with pytest.raises(ValueError, match="broken_reward.*returned 1 scores for 4"):
        trainer.train()


@pytest.mark.slow
def test_score_rises_on_a_learnable_task(tmp_path, tokenizer):
    # reward: occurrences of the letter "e" in the completion, capped at 5; a random model scores ~2
    trainer = _trainer(
        tmp_path,
        tokenizer,
        KeywordReward("e"),
        dataset=toy_prompt_dataset(n=200),
        per_device_train_batch_size=16,
        rloo_k=4,
        response_length=6,
        learning_rate=3e-3,
        temperature=1.0,
        kl_coef=0.0,
        total_episodes=16 * 30,
        lr_scheduler_type="constant",
        seed=0,
    )
    trainer.train()
    scores = [h["objective/scores"] for h in trainer.state.log_history if "objective/scores" in h]
    assert len(scores) == 30
    before, after = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    print(f"keyword score: first 5 updates {before:.2f}, last 5 updates {after:.2f}")
    assert after > before + 1.5, scores


def test_metrics_are_logged_every_update_by_default_and_each_named_eval_set_gets_samples(tmp_path, tokenizer):
    config = RLOOConfig(  # no logging_steps: TRL 0.x's RLOO logs every update
        output_dir=str(tmp_path / "out"),
        report_to="none",
        use_cpu=True,
        per_device_train_batch_size=4,
        rloo_k=2,
        num_ppo_epochs=1,
        response_length=3,
        total_episodes=12,
        save_strategy="no",
        num_sample_generations=1,
        num_sample_prompts=2,
        disable_tqdm=True,
    )
    evals = {"short": toy_prompt_dataset("test", n=2), "other": toy_prompt_dataset("test", n=3)}
    trainer = RLOOTrainer(
        config,
        tokenizer,
        tiny_model("llama"),
        tiny_model("llama"),
        KeywordReward("e"),
        toy_prompt_dataset(n=8),
        eval_dataset=evals,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert [entry["episode"] for entry in logs] == [4, 8, 12]
    assert all(set(METRICS) <= set(entry) for entry in logs)
    for name in evals:  # one sample table per named set, at the last update
        rows = [json.loads(r) for r in (tmp_path / "out" / f"samples-{name}" / "samples.jsonl").open()]
        assert [r["step"] for r in rows] == [3, 3]
    samples = trainer.generate_completions()
    assert set(samples) == {"short", "other"} and len(samples["other"]["score"]) == 2
    with pytest.raises(ValueError, match="eval_dataset"):
        RLOOTrainer(
            config,
            tokenizer,
            tiny_model("llama"),
            tiny_model("llama"),
            KeywordReward("e"),
            toy_prompt_dataset(n=8),
            eval_dataset={},
        )


def test_rollout_metrics_count_every_row_while_another_dataloader_is_left_unfinished(tmp_path, tokenizer):
    """accelerate's gather_for_metrics cuts a gathered tensor to the last batch's remainder while a prepared
    dataloader sits on its final uneven batch (a training loop stopped at max_steps leaves one so); the
    rollout's metrics are not per-dataloader rows and must not be cut."""
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    trainer = _trainer(
        tmp_path, tokenizer, lambda completions, prompts: values[: len(completions)],
        per_device_train_batch_size=6, rloo_k=3, kl_coef=0.0, total_episodes=6,
    )  # fmt: skip
    uneven = torch.utils.data.DataLoader(list(range(3)), batch_size=2)
    loader = trainer.accelerator.prepare_data_loader(uneven)
    for batch in loader:
        if len(batch) == 1:  # the uneven last batch: stop inside it, as a loop stopped at max_steps would
            _, metrics = trainer._rollout(0)
            break
    assert metrics["objective/scores"] == pytest.approx(sum(values) / 6)
