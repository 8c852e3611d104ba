"""One reference story for every trainer (`rlhfkit.models.reference.choose_reference`): RLOO without a
`ref_policy` for a LoRA policy, and DPO honouring a PEFT policy's frozen SFT reference adapter."""

from __future__ import annotations

import copy

import datasets
import pytest
import torch
from peft import LoraConfig, get_peft_model

from rlhfkit.models.adapters import add_reference_adapter
from rlhfkit.models.reference import Reference, choose_reference
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import forward_response, pad_left, pad_right
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer


def _lora(init_lora_weights: bool = True) -> LoraConfig:
    return LoraConfig(
        task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=init_lora_weights
    )


def _rollout_batch(tokenizer):
    queries = [torch.tensor(tokenizer(t)["input_ids"]) for t in ("a cat sat", "the film")]
    responses = [torch.tensor(tokenizer(t)["input_ids"]) for t in (" on the mat", " was good")]
    return (*pad_left(queries, tokenizer.pad_token_id), *pad_right(responses, tokenizer.pad_token_id))


def test_choose_reference_kinds():
    plain = tiny_model("llama")
    copied = choose_reference(plain)
    assert copied.kind == "model" and copied.model is not plain
    assert not copied.model.training and not any(p.requires_grad for p in copied.model.parameters())
    given = tiny_model("llama").train()
    explicit = choose_reference(plain, given)
    assert (
        explicit.model is given
        and not given.training
        and not any(p.requires_grad for p in given.parameters())
    )
    with pytest.raises(ValueError, match="must not be the policy itself"):
        choose_reference(plain, plain)

    peft_policy = get_peft_model(tiny_model("llama"), _lora())
    assert choose_reference(peft_policy).kind == "base"
    with pytest.warns(UserWarning, match="ignored for a PEFT model"):
        choose_reference(peft_policy, num_shared_layers=1)
    add_reference_adapter(peft_policy)
    adapter = choose_reference(peft_policy)
    assert adapter.kind == "adapter" and adapter.adapter_name == "reference" and adapter.model is None
    with pytest.raises(ValueError, match="lives inside a PEFT policy"):
        with Reference("base")(plain):
            pass


def test_rloo_with_a_lora_policy_needs_no_ref_policy(tmp_path):
    from rlhfkit.trainers.rloo.config import RLOOConfig
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    tokenizer = tiny_tokenizer(padding_side="left")
    base = tiny_model("llama").eval()
    policy = get_peft_model(tiny_model("llama"), _lora())
    config = RLOOConfig(
        output_dir=str(tmp_path / "out"),
        report_to="none",
        use_cpu=True,
        per_device_train_batch_size=4,
        rloo_k=2,
        num_ppo_epochs=1,
        response_length=5,
        total_episodes=8,
        logging_steps=1,
        save_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
        seed=3,
        learning_rate=1e-2,
    )
    with pytest.raises(ValueError, match="ref_policy must not be the policy itself"):
        RLOOTrainer(config, tokenizer, policy, policy, KeywordReward("e"), toy_prompt_dataset(n=16))
    trainer = RLOOTrainer(config, tokenizer, policy, None, KeywordReward("e"), toy_prompt_dataset(n=16))
    assert trainer.ref_policy is None and trainer.reference.kind == "base"  # no second copy of the weights
    lora_before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer.train()

    logs = [h for h in trainer.state.log_history if "objective/kl" in h]
    # LoRA starts at zero, so the first rollout's policy is the base: its KL to the reference is ~0
    assert logs[0]["objective/kl"] == pytest.approx(0.0, abs=1e-4)
    assert all(not torch.equal(p, lora_before[n]) for n, p in policy.named_parameters() if n in lora_before)
    batch = _rollout_batch(tokenizer)
    with torch.no_grad(), trainer.reference(trainer.policy) as reference:
        ref_logprobs = forward_response(reference, *batch).logprobs
    base_logprobs = forward_response(base, *batch).logprobs
    policy_logprobs = forward_response(trainer.policy, *batch).logprobs
    torch.testing.assert_close(ref_logprobs, base_logprobs, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(policy_logprobs, base_logprobs, atol=1e-4)  # the adapter is back on


def test_dpo_uses_the_frozen_sft_reference_adapter(tmp_path):
    from rlhfkit.trainers.dpo.config import DPOConfig
    from rlhfkit.trainers.dpo.trainer import DPOTrainer

    torch.manual_seed(0)
    sft = get_peft_model(tiny_model("llama"), _lora(init_lora_weights=False))  # a "trained" SFT LoRA
    sft_copy = copy.deepcopy(sft).eval()
    add_reference_adapter(sft)
    pairs = datasets.Dataset.from_list(
        [{"prompt": f"the film {i}: ", "chosen": "yes good", "rejected": "no bad"} for i in range(8)]
    )
    args = DPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        report_to="none",
        max_steps=2,
        per_device_train_batch_size=4,
        save_strategy="no",
        learning_rate=1e-2,
        seed=0,
        max_length=64,
        max_prompt_length=32,
    )
    trainer = DPOTrainer(model=sft, args=args, train_dataset=pairs, processing_class=tiny_tokenizer())
    assert trainer.ref_model is None and trainer.reference.kind == "adapter"
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])

    def logps(model):
        with torch.no_grad():
            return trainer.concatenated_forward(model, batch)[:2]

    with torch.no_grad(), sft_copy.disable_adapter():
        base = logps(sft_copy)
    expected = logps(sft_copy)
    trainer.train()
    reference = trainer.reference_logps(batch)
    for ref, sft_logps, base_logps in zip(reference, expected, base):
        torch.testing.assert_close(ref, sft_logps, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(ref, base_logps, atol=1e-3)
    assert not torch.allclose(logps(trainer.model)[0], expected[0], atol=1e-4)  # the policy moved on
    assert trainer.model.active_adapter == "default"
