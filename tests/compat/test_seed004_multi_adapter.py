"""Seed 004 (multi-adapter RL, in Chinese): its code, with only `trl` -> `rlhfkit`.

`huggyllama/llama-7b` becomes the tiny llama folder and the Hub reward adapter
`trl-lib/llama-7b-hh-rm-adapter` a local LoRA sequence-classification adapter on the same base (stage 2
of the seed: same architecture and weights). `compute_reward_score` returns per-token scores
(B, T, num_labels), as TRL's does; TRL's examples read the score at the last position, `[:, -1, 0]`.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig

from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer


@pytest.fixture(scope="module")
def rm_adapter_id(tmp_path_factory):
    """A reward adapter as RewardTrainer with peft saves it: a LoRA on the SEQ_CLS model, score head saved."""
    from peft import TaskType, get_peft_model

    torch.manual_seed(1)
    reward = get_peft_model(
        tiny_model("llama-reward"),
        LoraConfig(
            task_type=TaskType.SEQ_CLS, r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        ),
    )
    folder = tmp_path_factory.mktemp("llama-7b-hh-rm-adapter")
    reward.save_pretrained(folder)
    return str(folder)


def seed_model(rm_adapter_id, **extra):
    from rlhfkit import AutoModelForCausalLMWithValueHead

    model_name = str(tiny_model_path("llama"))  # "huggyllama/llama-7b"

    # PPO adapter
    lora_config = LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.05,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with pytest.warns(UserWarning, match="no value head found"):  # a plain LM: fresh value head
        model = AutoModelForCausalLMWithValueHead.from_pretrained(
            model_name,
            peft_config=lora_config,
            reward_adapter=rm_adapter_id,
            **extra,
        )
    return model, lora_config


def make_trainer(model):
    from rlhfkit import PPOConfig, PPOTrainer

    config = PPOConfig(batch_size=2, mini_batch_size=1, ppo_epochs=1, learning_rate=1e-2)  # sizes shrunk
    return PPOTrainer(
        model=model,
        config=config,
        tokenizer=tiny_tokenizer(),
    )


def test_quickstart_scores_are_per_token_and_train_only_the_policy_adapter(rm_adapter_id):
    model, _ = seed_model(rm_adapter_id)
    trainer = make_trainer(model)
    tokenizer = tiny_tokenizer()  # pads on the left: the last position is every row's last real token
    texts = ["the film was good", "a dull and long film about nothing"]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)

    rewards = trainer.model.compute_reward_score(**inputs)

    batch_size, length = inputs["input_ids"].shape
    assert rewards.shape == (batch_size, length, 1) and rewards.dtype == torch.float32  # (B, T, num_labels)
    assert not rewards.requires_grad and trainer.model.pretrained_model.active_adapter == "default"
    scores = rewards[:, -1, 0]  # TRL's examples: the score at the last token
    torch.testing.assert_close(scores, trainer.model.sequence_reward_score(**inputs))

    # one PPO step on those rewards moves the policy adapter and value head, never the reward adapter
    queries = [torch.tensor(tokenizer.encode(t)) for t in ("the film was", "a dull")]
    responses = [torch.tensor(tokenizer.encode(t)) for t in (" good", " and long film")]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.step(queries, responses, list(scores))
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert any(".default." in n for n in changed) and any(n.startswith("v_head") for n in changed)
    assert not any("reward_adapter" in n or n.startswith("score.") for n in changed)
    torch.testing.assert_close(trainer.model.compute_reward_score(**inputs), rewards)  # the reward is fixed


def test_ppo_adapter_name_is_reactivated_after_scoring(rm_adapter_id):
    model, lora_config = seed_model(rm_adapter_id)
    model.pretrained_model.add_adapter("policy_1", lora_config)  # a second policy on the same base
    trainer = make_trainer(model)
    inputs = tiny_tokenizer()(["a good film", "it rained"], return_tensors="pt", padding=True)

    adapter_name_policy_1 = "policy_1"
    rewards = trainer.model.compute_reward_score(**inputs, ppo_adapter_name=adapter_name_policy_1)

    assert trainer.model.pretrained_model.active_adapter == "policy_1"
    torch.testing.assert_close(rewards, trainer.model.compute_reward_score(**inputs))  # same reward adapter
    assert trainer.model.pretrained_model.active_adapter == "default"


@pytest.mark.parametrize("flag", ["load_in_8bit", "load_in_4bit"])
def test_quantized_base_keeps_float32_adapters(rm_adapter_id, flag):
    pytest.importorskip("bitsandbytes")
    from rlhfkit.models.quantization import is_quantized

    model, _ = seed_model(rm_adapter_id, **{flag: True})
    trainer = make_trainer(model)
    assert is_quantized(trainer.model.pretrained_model.get_base_model())
    assert {p.dtype for n, p in trainer.model.named_parameters() if "lora_" in n} == {torch.float32}
    inputs = tiny_tokenizer()(["a good film"], return_tensors="pt")
    rewards = trainer.model.compute_reward_score(**inputs)
    assert rewards.shape == (1, inputs["input_ids"].shape[1], 1) and torch.isfinite(rewards).all()
