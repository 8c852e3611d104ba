"""WinRateCallback: the policy against its frozen starting point, judged every N steps, on GRPO and PPO."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlhfkit import PPOConfig, PPOTrainer
from rlhfkit.judges import RuleJudge
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import SamplingParams
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer, tiny_value_head_model
from rlhfkit.trainers.common.win_rate import WinRateCallback
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer

KEYS = ("eval/win_rate", "eval/win_rate_low", "eval/win_rate_high")
PROMPTS = [f"Tell me about topic {i}:" for i in range(16)]


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _grpo(tmp_path, tokenizer, **kwargs) -> GRPOTrainer:
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=4, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    dataset = kwargs.pop("dataset", None) or toy_prompt_dataset(n=16)
    return GRPOTrainer(
        tiny_model("llama"),
        count_e,
        args=GRPOConfig(**{**defaults, **kwargs}),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def _judge() -> RuleJudge:
    return RuleJudge.of_texts(KeywordReward("e"))


def test_logs_win_rate_with_its_interval_every_n_steps_and_the_reference_stays_frozen(tmp_path, tokenizer):
    trainer = _grpo(tmp_path, tokenizer)
    callback = WinRateCallback(
        _judge(), PROMPTS, trainer=trainer, every_n_steps=2, num_prompts=6, max_new_tokens=4
    )
    trainer.add_callback(callback)
    start = {k: v.clone() for k, v in trainer.model.named_parameters()}
    trainer.train()

    logged = [h for h in trainer.state.log_history if "eval/win_rate" in h]
    assert [h["step"] for h in logged] == [2, 4]
    # every update's own metrics line is still logged, those at the win-rate steps included
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2, 3, 4]
    for entry in logged:
        assert (
            0.0 <= entry["eval/win_rate_low"] <= entry["eval/win_rate"] <= entry["eval/win_rate_high"] <= 1.0
        )
    for name, param in callback.reference.model.named_parameters():  # the snapshot of the start, untouched
        assert torch.equal(param, start[name]), name
    assert any(not torch.equal(p, start[n]) for n, p in trainer.model.named_parameters())
    rows = [json.loads(r) for r in (tmp_path / "out" / "samples.jsonl").open()]
    pairs = [r for r in rows if r["table"] == "win_rate"]
    assert [r["step"] for r in pairs] == [2] * 6 + [4] * 6 and [r["query"] for r in pairs[:6]] == PROMPTS[:6]
    for r in pairs:  # the judge's verdict agrees with the rule it applies, and the row's score is its share
        own, ref = r["response"].count("e"), r["reference_response"].count("e")
        assert r["judgement"] == ("win" if own > ref else "loss" if own < ref else "tie")
        assert r["score"] == {"win": 1.0, "loss": 0.0, "tie": 0.5}[r["judgement"]]
    last = [r["score"] for r in pairs[6:]]
    assert logged[-1]["eval/win_rate"] == pytest.approx(sum(last) / len(last))


def test_the_callback_does_not_change_training(tmp_path, tokenizer):
    # sampling with its own seed inside a forked RNG: the trained weights are those of a run without it
    plain = _grpo(tmp_path / "plain", tokenizer, max_steps=2)
    plain.train()
    watched = _grpo(tmp_path / "watched", tokenizer, max_steps=2)
    sampled = SamplingParams(max_new_tokens=4, do_sample=True, temperature=1.0)
    watched.add_callback(
        WinRateCallback(_judge(), PROMPTS[:4], trainer=watched, every_n_steps=1, sampling_params=sampled)
    )
    watched.train()
    for (name, a), b in zip(plain.model.named_parameters(), watched.model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)


@pytest.mark.slow
def test_a_policy_trained_toward_the_judges_preference_wins(tmp_path, tokenizer):
    # reward and judge both count "e": after training, the policy's completions beat the start's
    trainer = _grpo(
        tmp_path, tokenizer, dataset=toy_prompt_dataset(n=200), per_device_train_batch_size=16,
        max_completion_length=6, learning_rate=3e-3, max_steps=25, lr_scheduler_type="constant", seed=0,
    )  # fmt: skip
    sampled = SamplingParams(max_new_tokens=6, do_sample=True, temperature=1.0)
    prompts = toy_prompt_dataset("test", n=32)["prompt"]
    trainer.add_callback(
        WinRateCallback(_judge(), prompts, trainer=trainer, every_n_steps=25, sampling_params=sampled)
    )
    trainer.train()
    (final,) = [h for h in trainer.state.log_history if "eval/win_rate" in h]
    print(
        f"win rate after 25 updates: {final['eval/win_rate']:.2f} [{final['eval/win_rate_low']:.2f}, "
        f"{final['eval/win_rate_high']:.2f}]"
    )
    assert final["eval/win_rate"] > 0.5 and final["eval/win_rate_high"] > final["eval/win_rate_low"]


def test_ppo_users_merge_on_ppo_step_into_log_stats(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_value_head_model("llama", summary_dropout_prob=0.0)
    config = PPOConfig(
        batch_size=4,
        mini_batch_size=2,
        ppo_epochs=1,
        learning_rate=1e-2,
        seed=0,
        log_with="tensorboard",
        project_kwargs={"logging_dir": str(tmp_path / "tb")},
    )
    trainer = PPOTrainer(config, copy.deepcopy(model), tokenizer=tokenizer)
    callback = WinRateCallback(
        _judge(),
        PROMPTS[:4],
        trainer=trainer,
        every_n_steps=2,
        max_new_tokens=4,
        output_dir=str(tmp_path / "ppo"),
    )
    queries = [torch.tensor(tokenizer(p)["input_ids"]) for p in PROMPTS[:4]]
    merged = []
    for _ in range(2):
        responses = trainer.generate(queries, return_prompt=False, max_new_tokens=4, do_sample=True)
        scores = [torch.tensor(float(t)) for t in count_e(tokenizer.batch_decode(responses))]
        stats = trainer.step(queries, responses, scores)
        stats.update(callback.on_ppo_step(trainer))
        merged.append(trainer.log_stats(stats, {"query": PROMPTS[:4], "response": ["x"] * 4}, scores))
    assert not set(KEYS) & set(merged[0])  # step 1 is not due
    assert merged[1]["eval/win_rate_low"] <= merged[1]["eval/win_rate"] <= merged[1]["eval/win_rate_high"]
    for (name, param), start in zip(callback.reference.model.named_parameters(), model.parameters()):
        assert torch.equal(param, start), name
    rows = [json.loads(r) for r in (tmp_path / "ppo" / "samples.jsonl").open()]
    assert [r["step"] for r in rows] == [2] * 4 and {r["table"] for r in rows} == {"win_rate"}
    trainer.accelerator.end_training()  # the pairs also went to the accelerate TensorBoard tracker, as text
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tag, texts = "samples/win_rate/text_summary", []
    for events in (tmp_path / "tb").rglob(
        "events.out.tfevents.*"
    ):  # accelerate keeps hparams in a file of their own
        accumulator = EventAccumulator(str(events), size_guidance={"tensors": 0}).Reload()
        texts += accumulator.Tensors(tag) if tag in accumulator.Tags()["tensors"] else []
    assert [t.step for t in texts] == [2] and "reference_response" in texts[0].tensor_proto.string_val[
        0
    ].decode()


def test_bad_arguments_fail_before_any_work(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="every_n_steps"):
        WinRateCallback(_judge(), PROMPTS, every_n_steps=0)
    with pytest.raises(ValueError, match="prompts is empty"):
        WinRateCallback(_judge(), [])
    with pytest.raises(TypeError, match="single str"):
        WinRateCallback(_judge(), "one prompt")
    with pytest.raises(ValueError, match="prompts is required"):
        WinRateCallback(_judge())
    with pytest.raises(TypeError, match="judge"):
        WinRateCallback(lambda p, c: [0], PROMPTS)
    trainer = _grpo(tmp_path, tokenizer, max_steps=1)
    trainer.add_callback(WinRateCallback(_judge(), PROMPTS))  # no trainer to log through
    with pytest.raises(ValueError, match="trainer=trainer"):
        trainer.train()


def test_works_in_the_hf_trainer_loop_of_sft(tmp_path):
    import datasets

    from rlhfkit.testing.training_args import few_step_args
    from rlhfkit.trainers.sft.config import SFTConfig
    from rlhfkit.trainers.sft.trainer import SFTTrainer

    docs = ["the cat sat on the mat", "a dog ran far away today", "hello there friend", "rain on the town"]
    args = few_step_args(
        SFTConfig, tmp_path / "out", per_device_train_batch_size=2, max_seq_length=32, max_steps=2
    )
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=args,
        processing_class=tiny_tokenizer(padding_side="right"),
        train_dataset=datasets.Dataset.from_list([{"text": d} for d in docs]),
    )
    trainer.add_callback(
        WinRateCallback(_judge(), PROMPTS[:3], trainer=trainer, every_n_steps=1, max_new_tokens=3)
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "eval/win_rate" in h]
    assert [h["step"] for h in logged] == [1, 2] and all(set(KEYS) <= set(h) for h in logged)


def test_a_peft_policy_is_judged_against_its_adapter_disabled_base(tmp_path, tokenizer):
    from peft import LoraConfig

    trainer = GRPOTrainer(
        tiny_model("llama"), count_e, args=GRPOConfig(
            output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
            num_generations=4, max_completion_length=4, max_steps=2, save_strategy="no", disable_tqdm=True,
            learning_rate=1e-2,
        ),
        train_dataset=toy_prompt_dataset(n=16), processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"),
    )  # fmt: skip
    callback = WinRateCallback(_judge(), PROMPTS[:4], trainer=trainer, every_n_steps=2, max_new_tokens=4)
    trainer.add_callback(callback)
    trainer.train()
    assert callback.reference.kind == "base" and callback.reference.model is None  # no copy of the weights
    (entry,) = [h for h in trainer.state.log_history if "eval/win_rate" in h]
    assert entry["eval/win_rate_low"] <= entry["eval/win_rate"] <= entry["eval/win_rate_high"]
    rows = [json.loads(r) for r in (tmp_path / "out" / "samples.jsonl").open()]
    assert any(
        r["reference_response"] != r["response"] for r in rows
    )  # the base differs from the trained policy
