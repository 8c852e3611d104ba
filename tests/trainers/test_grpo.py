"""GRPOTrainer on tiny offline models: no reference with beta=0, reward functions see every column and may
abstain, conversational prompts, PEFT, dynamic sampling, the sampling/training logprob gap, reuse of a
generation batch with its old logprobs, exact resume, and a reward that rises on a learnable task."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

import rlhfkit.trainers.grpo.trainer as grpo_module
from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer

METRICS = (
    "reward", "reward_std", "rewards/count_e/mean", "rewards/count_e/std", "frac_reward_zero_std",
    "completions/mean_length", "completions/clipped_ratio", "completions/mean_terminated_length", "loss",
    "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
    "clip_ratio/high_max", "sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
    "lr", "num_tokens",
)  # fmt: skip


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _config(tmp_path, **kwargs) -> GRPOConfig:
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    return GRPOConfig(**{**defaults, **kwargs})


def _trainer(tmp_path, tokenizer, reward=count_e, dataset=None, model=None, **kwargs) -> GRPOTrainer:
    return GRPOTrainer(
        model if model is not None else tiny_model("llama"),
        reward,
        args=_config(tmp_path, **kwargs),
        train_dataset=dataset if dataset is not None else toy_prompt_dataset(n=16),
        processing_class=tokenizer,
    )


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_beta_zero_builds_no_reference_and_every_parameter_moves(tmp_path, tokenizer, monkeypatch):
    def no_copy(*args, **kwargs):
        raise AssertionError("beta=0 must not build a reference model")

    monkeypatch.setattr("rlhfkit.models.reference.create_reference_model", no_copy)
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.named_parameters()}
    trainer = _trainer(tmp_path, tokenizer, model=model)
    assert trainer.reference is None
    trainer.train()
    for name, param in model.named_parameters():
        assert not torch.equal(before[name], param), f"{name} did not move"
    logs = trainer.state.log_history[0]
    assert set(METRICS) <= set(logs), set(METRICS) - set(logs)
    assert "kl" not in logs  # no KL term without a reference
    tokens = _logged(trainer, "num_tokens")
    assert 8 * 5 < tokens[0] < tokens[1]  # prompt + completion tokens so far, cumulative
    trainer.create_model_card(dataset_name="toy")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "group relative policy optimisation (GRPO)" in card and "- grpo" in card and "`toy`" in card


def test_beta_builds_a_frozen_reference_and_logs_kl(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, beta=0.1, max_steps=2)
    assert trainer.reference.kind == "model"
    ref_before = {k: v.clone() for k, v in trainer.reference.model.state_dict().items()}
    trainer.train()
    assert all(torch.equal(ref_before[k], v) for k, v in trainer.reference.model.state_dict().items())
    kl = _logged(trainer, "kl")
    assert kl[0] == 0.0 and kl[1] > 0  # the policy equals its reference before the first update only


def test_reward_functions_get_every_column_and_none_is_skipped(tmp_path, tokenizer):
    seen = {}

    def by_target(prompts, completions, completion_ids, target, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, target=target, other=kwargs)
        return [None if t == "skip" else float(len(c)) for c, t in zip(completions, target)]

    def only_first(prompts, completions, target, **kwargs):
        return [1.0 if t == "first" else None for t in target]

    prompts = ["the film was", "a story about"] * 4
    dataset = Dataset.from_dict({"prompt": prompts, "target": ["first", "skip"] * 4, "extra": list(range(8))})
    trainer = _trainer(tmp_path, tokenizer, reward=[by_target, only_first], dataset=dataset, max_steps=1)
    trainer.train()
    # each prompt's group of 4 on consecutive rows, its columns repeated alongside
    assert seen["prompts"] == [p for p in seen["prompts"][::4] for _ in range(4)]
    assert seen["target"] == [t for t in seen["target"][::4] for _ in range(4)]
    assert set(seen["other"]) == {"extra", "query"} if "query" in seen["other"] else {"extra"}
    assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in seen["ids"]] == seen["completions"]
    buffer = trainer._buffer
    skip_rows = torch.tensor([t == "skip" for t in seen["target"]])
    # "skip" rows: no function applies -> NaN score, advantage 0; "first" rows: both functions are summed
    assert buffer.scores[skip_rows].isnan().all()
    assert (buffer.advantages[skip_rows] == 0).all()
    lengths = torch.tensor([float(len(c)) for c in seen["completions"]])
    torch.testing.assert_close(buffer.scores[~skip_rows], lengths[~skip_rows] + 1.0)
    logs = trainer.state.log_history[0]
    assert logs["rewards/only_first/mean"] == 1.0  # the mean over the rows it applies to
    assert logs["reward"] == pytest.approx(float(lengths[~skip_rows].mean()) + 1.0, rel=1e-5)


def test_conversational_prompts_use_the_chat_template(tmp_path, tokenizer):
    seen = {}

    def reply_length(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [float(len(c[0]["content"])) for c in completions]

    messages = [[{"role": "user", "content": text}] for text in ["the film was", "a story about"] * 4]
    trainer = _trainer(
        tmp_path, tokenizer, reward=reply_length, dataset=Dataset.from_dict({"prompt": messages}), max_steps=1
    )
    trainer.train()
    assert seen["prompts"][0] == messages[trainer.prompts.schedule.indices(0)[0]]
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in seen["completions"])
    rendered = tokenizer.decode(trainer._buffer.query_ids[0], skip_special_tokens=False)
    assert "<|assistant|>" in rendered  # add_generation_prompt


def test_peft_policy_uses_its_base_as_reference(tmp_path, tokenizer):
    from peft import LoraConfig

    trainer = GRPOTrainer(
        tiny_model("llama"),
        count_e,
        args=_config(tmp_path, beta=0.1, max_steps=1),
        train_dataset=toy_prompt_dataset(n=16),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"),
    )
    assert trainer.reference.kind == "base"
    before = {k: v.clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    moved = {k for k, v in trainer.model.named_parameters() if not torch.equal(before[k], v)}
    assert moved and all("lora_" in k for k in moved)


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path, tokenizer):
    # prompts starting with "same" always get reward 1: their groups carry no signal and are dropped
    def reward(prompts, completions, **kwargs):
        return [1.0 if p.startswith("same") else float(c.count("e")) for p, c in zip(prompts, completions)]

    prompts = ["same one", "same two", "the film was", "a story about"] * 4
    trainer = _trainer(tmp_path, tokenizer, reward=reward, dataset=Dataset.from_dict({"prompt": prompts}),
                       dynamic_sampling=True, max_sampling_rounds=6, max_steps=1, seed=0)  # fmt: skip
    trainer.train()
    buffer, logs = trainer._buffer, trainer.state.log_history[0]
    assert len(buffer) == 8  # full: 2 groups of 4
    groups = buffer.scores.reshape(-1, 4)
    assert (groups.max(1).values > groups.min(1).values).all()
    assert logs["sampling/dropped_groups"] >= 1 and logs["sampling/rounds"] >= 2
    assert logs["frac_reward_zero_std"] == 0.0


def test_sampling_and_training_logprobs_agree(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, temperature=0.7, max_steps=2)
    trainer.train()
    assert max(_logged(trainer, "sampling/sampling_logp_difference/max")) < 1e-4


@pytest.mark.parametrize("reuse", [{"num_iterations": 2}, {"steps_per_generation": 4}])
def test_a_reused_batch_trains_against_its_old_logprobs(tmp_path, tokenizer, monkeypatch, reuse):
    # num_iterations=2: both updates pass over the same rows; steps_per_generation=4 (2 x accumulation):
    # the second update takes the second half of the batch, after the first changed the policy
    calls = []
    real = grpo_module.policy_loss

    def spy(loss_type, logprobs, old_logprobs, *args, **kwargs):
        calls.append((logprobs.detach().clone(), old_logprobs.clone(), args[1].clone()))
        return real(loss_type, logprobs, old_logprobs, *args, **kwargs)

    monkeypatch.setattr(grpo_module, "policy_loss", spy)
    trainer = _trainer(tmp_path, tokenizer, max_steps=2, per_device_train_batch_size=4,
                       gradient_accumulation_steps=2, epsilon=0.05, **reuse)  # fmt: skip
    generated = []
    real_generate = trainer._generate
    monkeypatch.setattr(trainer, "_generate", lambda: generated.append(1) or real_generate())
    trainer.train()
    assert len(generated) == 1 and len(calls) == 4  # one generation, two updates of two micro-batches
    (new0, old0, mask0), (_, _, _), (new2, old2, mask2), _ = calls
    assert torch.equal(new0, old0)  # first pass: on-policy, ratio exactly 1
    ratio = torch.exp(new2 - old2)[mask2.bool()]
    assert (ratio - 1).abs().max() > 1e-3  # second pass: the policy moved away from the stored logprobs
    assert "sampling/sampling_logp_difference/mean" in trainer.state.log_history[0]
    assert "sampling/sampling_logp_difference/mean" not in trainer.state.log_history[1]


def test_top_entropy_quantile_trains_on_the_most_uncertain_tokens(tmp_path, tokenizer, monkeypatch):
    masks = []
    real = grpo_module.policy_loss

    def spy(*args, **kwargs):
        masks.append((kwargs["entropy_mask"], args[4].bool()))
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo_module, "policy_loss", spy)
    _trainer(tmp_path, tokenizer, top_entropy_quantile=0.25, max_steps=1).train()
    ((keep, loss_mask),) = masks
    assert not (keep & ~loss_mask).any()
    assert 0.2 <= keep.sum() / loss_mask.sum() <= 0.35  # a quarter of the loss tokens (ties kept)


def test_resume_mid_generation_continues_exactly(tmp_path, tokenizer):
    # num_iterations=2: checkpoint-1 falls between the two passes over a generation batch, so the
    # resumed run must reload that batch (not sample a new one)
    kwargs = dict(num_iterations=2, max_steps=3, save_strategy="steps", save_steps=1, beta=0.05)
    full = _trainer(tmp_path / "full", tokenizer, **kwargs)
    full.train()
    checkpoint = tmp_path / "full" / "out" / "checkpoint-1"
    resumed = _trainer(tmp_path / "resumed", tokenizer, **kwargs)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=f"{name} differs after resuming")
    assert _logged(resumed, "reward") == _logged(full, "reward")
    assert _logged(resumed, "num_tokens") == _logged(full, "num_tokens")
    # the health alarms' history came back with the checkpoint: the same as the uninterrupted run's at step 3
    assert (checkpoint / "health_monitor.json").is_file()
    assert resumed.health.state_dict() == full.health.state_dict()
    assert [step for step, _ in resumed.health.state_dict()["series"]["reward"]["first"]] == [1, 2, 3]


def test_soft_overlong_penalty_counts_completion_tokens(tmp_path, tokenizer):
    from rlhfkit.rewards import soft_overlong_penalty

    # free up to 6 - 4 = 2 tokens, then -1/4 per token: completions of 5 tokens (no eos reached) score -0.75
    trainer = _trainer(
        tmp_path, tokenizer, reward=soft_overlong_penalty(6, 4), max_completion_length=5, max_steps=1
    )
    trainer.train()
    lengths = trainer._buffer.response_mask.sum(1).float()
    torch.testing.assert_close(trainer._buffer.scores, ((2 - lengths) / 4).clamp(-1, 0))
    assert trainer.state.log_history[0]["rewards/soft_overlong_penalty/mean"] == pytest.approx(-0.75)


def test_masked_truncated_completions_give_no_update(tmp_path, tokenizer):
    # 3 tokens are too few for the tiny model to reach eos: every completion is cut, none is trained on
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.named_parameters()}
    trainer = _trainer(tmp_path, tokenizer, model=model, max_completion_length=3,
                       mask_truncated_completions=True, max_steps=1, top_entropy_quantile=0.2)  # fmt: skip
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["completions/clipped_ratio"] == 1.0 and not trainer._buffer.loss_mask.any()
    assert logs["loss"] == 0.0 and logs["skipped_nonfinite_steps"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters())


def test_sync_ref_model_mixes_the_reference_toward_the_policy(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, beta=0.1, sync_ref_model=True, ref_model_sync_steps=1,
                       ref_model_mixup_alpha=0.25, max_steps=1)  # fmt: skip
    ref_before = {k: v.clone() for k, v in trainer.reference.model.named_parameters()}
    trainer.train()
    for (name, ref), policy in zip(trainer.reference.model.named_parameters(), trainer.model.parameters()):
        torch.testing.assert_close(ref, 0.25 * policy.detach() + 0.75 * ref_before[name], msg=name)


def test_log_completions_prints_and_saves_a_table(tmp_path, tokenizer, capsys):
    trainer = _trainer(tmp_path, tokenizer, log_completions=True, num_completions_to_print=3, max_steps=1)
    trainer.train()
    assert "completions, update 0" in capsys.readouterr().out
    rows = (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    assert len(rows) == 3


def test_model_and_reward_model_given_as_local_paths(tmp_path):
    from rlhfkit.testing import tiny_model_path

    trainer = GRPOTrainer(
        str(tiny_model_path("llama")),
        [str(tiny_model_path("llama-reward")), count_e],
        args=_config(tmp_path, max_steps=1, reward_weights=[0.5, 1.0]),
        train_dataset=toy_prompt_dataset(n=16),
    )
    assert trainer.processing_class is not None and trainer.reward_func_names == ["llama-reward", "count_e"]
    trainer.train()
    logs = trainer.state.log_history[0]
    expected = 0.5 * logs["rewards/llama-reward/mean"] + logs["rewards/count_e/mean"]
    assert logs["reward"] == pytest.approx(expected, rel=1e-5)


def test_bad_reward_funcs_and_datasets_fail_before_training(tmp_path, tokenizer):
    with pytest.raises(TypeError, match="reward_funcs must hold"):
        _trainer(tmp_path, tokenizer, reward=[count_e, 3])
    with pytest.raises(ValueError, match="one generation batch needs 2"):
        _trainer(tmp_path, tokenizer, dataset=Dataset.from_dict({"prompt": ["a b"]}))
    with pytest.raises(ValueError, match="'prompt' column"):
        _trainer(tmp_path, tokenizer, dataset=Dataset.from_dict({"text": ["a b"] * 4}))


@pytest.mark.slow
def test_reward_rises_on_a_learnable_task(tmp_path, tokenizer):
    # reward: occurrences of "e" in the completion, capped at 5; a random model scores ~2
    trainer = _trainer(
        tmp_path, tokenizer, dataset=toy_prompt_dataset(n=200), per_device_train_batch_size=16,
        max_completion_length=6, learning_rate=3e-3, max_steps=25, lr_scheduler_type="constant", seed=0,
    )  # fmt: skip
    trainer.train()
    rewards = _logged(trainer, "reward")
    before, after = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"keyword reward: first 5 updates {before:.2f}, last 5 updates {after:.2f}")
    assert after > before + 1.0, rewards


def test_ref_model_dtype_holds_a_half_size_reference_close_to_the_full_one(tmp_path, tokenizer):
    full = _trainer(tmp_path, tokenizer, beta=0.1)
    half = _trainer(tmp_path, tokenizer, beta=0.1, ref_model_dtype="bfloat16")
    assert {p.dtype for p in half.reference.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in half.model.parameters()} == {torch.float32}  # the policy is left alone
    bytes_of = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    assert bytes_of(half.reference.model) * 2 == bytes_of(full.reference.model)
    batch = full._generate()[0]
    exact, rounded = full._reference_logprobs(batch), half._reference_logprobs(batch)
    mask = batch.response_mask
    assert rounded.dtype == torch.float32
    gap = (exact - rounded).abs()[mask].max().item()
    assert 0 < gap < 0.1, gap  # rounded weights: close, not equal
    half.train()
    assert all(torch.isfinite(torch.tensor(_logged(half, "kl"))))


def test_ref_model_dtype_is_checked(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="ref_model_dtype must be one of"):
        _config(tmp_path, ref_model_dtype="int8")


def test_the_last_log_entry_is_the_run_summary(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, max_steps=2)
    trainer.train()
    last = trainer.state.log_history[-1]
    assert {"train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second"} <= set(last)
    losses = _logged(trainer, "loss")
    assert len(losses) == 2 and last["train_loss"] == pytest.approx(sum(losses) / 2)
    assert "reward" not in last and "train_loss" not in trainer.state.log_history[-2]


def test_chat_template_kwargs_reach_the_chat_template(tmp_path):
    tokenizer = tiny_tokenizer(padding_side="left")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if think %}<think>{% endif %}"
    )
    messages = [[{"role": "user", "content": text}] for text in ["the film was", "a story about"] * 4]
    dataset = Dataset.from_dict({"prompt": messages})
    plain = _trainer(tmp_path, tokenizer, dataset=dataset)
    thinking = _trainer(tmp_path, tokenizer, dataset=dataset, chat_template_kwargs={"think": True})
    plain_ids, thinking_ids = plain.train_dataset["input_ids"][0], thinking.train_dataset["input_ids"][0]
    assert len(thinking_ids) > len(plain_ids) and thinking_ids[: len(plain_ids)] == plain_ids


def test_evaluate_scores_num_generations_eval_completions_of_every_prompt(tmp_path, tokenizer):
    rows_seen = []

    def counting(completions, **kwargs):
        rows_seen.append(len(completions))
        return count_e(completions)

    evaluation = toy_prompt_dataset("test", n=5)
    trainer = _trainer(tmp_path, tokenizer, reward=counting, num_generations_eval=3,
                       per_device_eval_batch_size=6)  # fmt: skip
    trainer.eval_dataset = None
    with pytest.raises(ValueError, match="needs an eval_dataset"):
        trainer.evaluate()
    metrics = trainer.evaluate(evaluation)
    assert sum(rows_seen) == 5 * 3 and max(rows_seen) <= 6  # 2 prompts x 3 completions a call at most
    assert {"eval_reward", "eval_reward_std", "eval_rewards/counting/mean", "eval_completions/mean_length",
            "eval_runtime"} <= set(metrics)  # fmt: skip
    assert (
        0 <= metrics["eval_reward"] <= 5
        and trainer.state.log_history[-1]["eval_reward"] == metrics["eval_reward"]
    )
    named = trainer.evaluate({"a": evaluation, "b": toy_prompt_dataset("test", n=2)})
    assert "eval_a_reward" in named and "eval_b_completions/mean_length" in named


def test_eval_strategy_steps_evaluates_during_training(tmp_path, tokenizer):
    trainer = GRPOTrainer(
        tiny_model("llama"), count_e,
        args=_config(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1, num_generations_eval=2),
        train_dataset=toy_prompt_dataset(n=16), eval_dataset=toy_prompt_dataset("test", n=4),
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    assert len([h for h in trainer.state.log_history if "eval_reward" in h]) == 2


def test_log_unique_prompts_keeps_one_completion_per_prompt(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, log_completions=True, log_unique_prompts=True, max_steps=1)
    trainer.train()
    rows = (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    assert len(rows) == 8 // 4  # 8 completions, 4 per prompt


@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_false_keeps_the_policy_dropout(tmp_path, tokenizer, disable):
    model = tiny_model("gpt2")
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    for module in dropouts:  # the tiny GPT-2 is built without dropout: give it some to keep or remove
        module.p = 0.1
    assert dropouts
    trainer = _trainer(tmp_path, tokenizer, model=model, disable_dropout=disable)
    kept = {m.p for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout)}
    assert kept == ({0.0} if disable else {0.1})
