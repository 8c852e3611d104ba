"""GRPOConfig options of TRL 1.16 beyond the loss maths: multi_objective_aggregation,
off_policy_mask_threshold, cast_lm_head_to_fp32, pad_to_multiple_of and cache_implementation, each shown
changing what trains (or how)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


def count_a(completions, **kwargs):
    return KeywordReward("a")(completions)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _trainer(tmp_path, tokenizer, reward=count_e, model=None, **kwargs) -> GRPOTrainer:
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    args = GRPOConfig(**{**defaults, **kwargs})
    model = model if model is not None else tiny_model("llama")
    dataset = toy_prompt_dataset(n=16)
    return GRPOTrainer(model, reward, args=args, train_dataset=dataset, processing_class=tokenizer)


# ---------------------------------------------------------------- multi_objective_aggregation
def test_normalize_then_sum_weighs_each_reward_by_its_spread_not_its_scale(tmp_path, tokenizer):
    # one group of four: reward 0 in hundreds, reward 1 in units
    per_source = torch.tensor([[100.0, 0.0, 100.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    summed = _trainer(tmp_path, tokenizer, reward=[count_e, count_a], num_generations=4)
    decoupled = _trainer(
        tmp_path, tokenizer, reward=[count_e, count_a], multi_objective_aggregation="normalize_then_sum"
    )
    batch = None  # neither aggregation reads the batch itself
    plain, _ = summed._advantages(batch, per_source.sum(0), per_source)
    gdpo = decoupled._advantages(batch, per_source.sum(0), per_source)[0].tolist()
    # summed rewards 100, 1, 101, 0: the large reward decides every sign
    assert (plain > 0).tolist() == [True, False, True, False]
    # each normalised to -/+ c in the group (c the same up to the std's 1e-4 epsilon): sums 0, 0, 2c, -2c
    assert gdpo[0] == pytest.approx(0.0, abs=1e-3) and gdpo[1] == pytest.approx(0.0, abs=1e-3)
    assert gdpo[2] > 0 > gdpo[3] and gdpo[2] == pytest.approx(-gdpo[3], rel=1e-3)


def test_normalize_then_sum_trains_on_batch_standardised_advantages(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, reward=[count_e, count_a], reward_weights=[1.0, 2.0],
                       multi_objective_aggregation="normalize_then_sum")  # fmt: skip
    trainer.train()
    advantages = trainer._buffer.advantages
    assert advantages.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert advantages.std().item() == pytest.approx(1.0, abs=1e-3)  # (x - mean) / (std + 1e-4)


def test_multi_objective_aggregation_is_checked(tmp_path):
    with pytest.raises(ValueError, match="multi_objective_aggregation must be one of sum_then_normalize, "):
        GRPOConfig(output_dir=str(tmp_path), multi_objective_aggregation="sum")


# ---------------------------------------------------------------- loss types sapo, vespo, luspo
@pytest.mark.parametrize("loss_type", ["sapo", "vespo", "luspo"])
def test_new_loss_types_train_with_their_options(tmp_path, tokenizer, monkeypatch, loss_type):
    import rlhfkit.trainers.grpo.trainer as grpo_module

    seen, real = [], grpo_module.policy_loss
    monkeypatch.setattr(
        grpo_module, "policy_loss", lambda *a, **k: seen.append(k["loss_options"]) or real(*a, **k)
    )
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.named_parameters()}
    options = dict(sapo_temperature_pos=0.5, vespo_k_neg=4.0, num_iterations=2)  # off-policy on pass 2
    level = "sequence" if loss_type == "luspo" else "token"
    _trainer(
        tmp_path, tokenizer, model=model, loss_type=loss_type, importance_sampling_level=level, **options
    ).train()
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())
    expected = {
        "sapo": {"sapo_temperature_pos": 0.5, "sapo_temperature_neg": 1.05},
        "vespo": {"vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 4.0, "vespo_lambda_neg": 2.0},
        "luspo": {},
    }[loss_type]
    assert seen and all(options == expected for options in seen)


def test_loss_types_meant_for_the_other_level_warn(tmp_path):
    with pytest.warns(UserWarning, match="'luspo' is meant with importance_sampling_level='sequence'"):
        GRPOConfig(output_dir=str(tmp_path), loss_type="luspo")
    with pytest.warns(UserWarning, match="'vespo' forms its own sequence-level weight"):
        GRPOConfig(output_dir=str(tmp_path), loss_type="vespo", importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="sapo_temperature_neg must be > 0"):
        GRPOConfig(output_dir=str(tmp_path), sapo_temperature_neg=0.0)


# ---------------------------------------------------------------- off_policy_mask_threshold
def test_off_policy_mask_drops_drifted_negative_completions_on_a_reused_batch(
    tmp_path, tokenizer, monkeypatch
):
    import rlhfkit.trainers.grpo.trainer as grpo_module

    seen, real = [], grpo_module.policy_loss
    monkeypatch.setattr(
        grpo_module, "policy_loss", lambda *a, **k: seen.append((a[3], k["sequence_mask"])) or real(*a, **k)
    )
    # a large step, then a second pass over the same completions: their sampling policy is now stale
    trainer = _trainer(tmp_path, tokenizer, max_steps=2, num_iterations=2, learning_rate=0.05,
                       off_policy_mask_threshold=1e-3)  # fmt: skip
    trainer.train()
    (first_adv, first), (second_adv, second) = seen
    assert first.all()  # first pass: sampling and training logprobs agree (drift ~1e-7)
    assert not second.all()  # second pass: drifted completions are dropped ...
    assert (second_adv[~second] < 0).all()  # ... only those with a negative advantage
    assert torch.equal(first_adv, second_adv)


def test_off_policy_mask_is_off_by_default_and_checked(tmp_path, tokenizer):
    assert _trainer(tmp_path, tokenizer)._off_policy_mask(torch.zeros(1, 1), None) is None
    with pytest.raises(ValueError, match="off_policy_mask_threshold must be >= 0 or None"):
        GRPOConfig(output_dir=str(tmp_path), off_policy_mask_threshold=-0.5)


# ---------------------------------------------------------------- cast_lm_head_to_fp32
@pytest.mark.parametrize("name", ["llama", "qwen2"])  # untied and tied embeddings
def test_cast_lm_head_to_fp32_gives_float32_logits_from_a_bfloat16_model(tmp_path, tokenizer, name):
    from rlhfkit.core.masking import position_ids_from_mask
    from rlhfkit.rollout import forward_response
    from rlhfkit.trainers.grpo.setup import Float32Head

    model = tiny_model(name).to(torch.bfloat16)
    keys = set(model.state_dict())
    trainer = _trainer(tmp_path, tokenizer, model=model, cast_lm_head_to_fp32=True, beta=0.1, max_steps=1)
    policy, reference = trainer.model, trainer.reference.model
    for module in (policy, reference):
        head = module.get_output_embeddings()
        assert type(head) is Float32Head and head.weight.dtype == torch.float32
        assert module.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16  # the rest unchanged
    assert set(policy.state_dict()) == keys  # saved checkpoints keep their names
    batch, _ = trainer._rollout(0)
    out = forward_response(policy, *trainer._rollout_tensors(batch))
    # the logprobs are those of float32 logits over the bfloat16 hidden states
    ids = torch.cat([batch.query_ids, batch.responses], 1)
    mask = torch.cat([batch.query_mask, batch.response_mask], 1).long()
    positions = position_ids_from_mask(mask)
    hidden = policy.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
    assert hidden.dtype == torch.bfloat16
    logits = hidden.float() @ policy.get_output_embeddings().weight.T
    width = batch.responses.shape[1]
    expected = torch.log_softmax(logits[:, -width - 1 : -1], -1).gather(-1, batch.responses[..., None])[
        ..., 0
    ]
    real = batch.response_mask.bool()
    torch.testing.assert_close(out.logprobs[real], expected[real], atol=1e-4, rtol=1e-4)
    trainer.train()
    assert trainer.state.global_step == 1


def test_cast_lm_head_to_fp32_refuses_an_adapter_on_the_head(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model("llama"), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    with pytest.raises(ValueError, match="cast_lm_head_to_fp32 needs a plain nn.Linear output projection"):
        _trainer(tmp_path, tokenizer, model=model, cast_lm_head_to_fp32=True)


# ---------------------------------------------------------------- pad_to_multiple_of, cache_implementation
def test_pad_to_multiple_of_pads_the_batch_without_changing_what_trains(tmp_path, tokenizer):
    plain = _trainer(tmp_path, tokenizer, max_steps=1)
    plain.train()
    padded = _trainer(tmp_path, tokenizer, max_steps=1, pad_to_multiple_of=8)
    padded.train()  # same seed: the same completions
    batch, reference = padded._buffer, plain._buffer
    assert batch.query_ids.shape[1] % 8 == 0 and batch.responses.shape[1] % 8 == 0
    assert batch.responses.shape[1] > reference.responses.shape[1]  # 5 generated tokens at most -> 8
    assert (batch.query_ids[:, 0] == tokenizer.pad_token_id).all()  # prompts padded on the left
    torch.testing.assert_close(batch.advantages, reference.advantages)
    for a, b in zip(padded.model.parameters(), plain.model.parameters()):  # the same update
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(
    "value, expected", [("auto", None), ("none", None), ("16", 16), (64, 64), (None, None)]
)
def test_pad_to_multiple_of_takes_tr_ls_spellings(tmp_path, value, expected):
    assert GRPOConfig(output_dir=str(tmp_path), pad_to_multiple_of=value).pad_to_multiple_of == expected


@pytest.mark.parametrize("value", [0, "x", -8])
def test_pad_to_multiple_of_rejects_the_rest(tmp_path, value):
    with pytest.raises(ValueError, match="pad_to_multiple_of must be a positive integer, 'auto' or None"):
        GRPOConfig(output_dir=str(tmp_path), pad_to_multiple_of=value)


def test_cache_implementation_reaches_generate(tmp_path, tokenizer, monkeypatch):
    from transformers import GenerationMixin

    seen, real = [], GenerationMixin.generate

    def generate(self, *args, **kwargs):
        seen.append(kwargs["generation_config"].cache_implementation)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", generate)
    trainer = _trainer(tmp_path, tokenizer, cache_implementation="static", max_steps=1)
    assert trainer.sampling_params.extra["cache_implementation"] == "static"
    trainer.train()
    assert seen and set(seen) == {"static"}  # the decode loop handed sampling to generate
    kept = _trainer(
        tmp_path,
        tokenizer,
        cache_implementation="static",
        generation_kwargs={"cache_implementation": "dynamic"},
    )
    assert kept.sampling_params.extra["cache_implementation"] == "dynamic"  # generation_kwargs win


def test_rloo_current_form_pads_and_passes_the_cache_implementation(tmp_path, tokenizer):
    from rlhfkit import RLOOConfig, RLOOTrainer

    args = RLOOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=5, max_steps=1, save_strategy="no",
                      disable_tqdm=True, pad_to_multiple_of="8", cache_implementation="static")  # fmt: skip
    trainer = RLOOTrainer(model=tiny_model("llama"), reward_funcs=count_e, args=args,
                          train_dataset=toy_prompt_dataset(n=16), processing_class=tokenizer)  # fmt: skip
    assert (
        trainer.args.form == "current" and trainer.sampling_params.extra["cache_implementation"] == "static"
    )
    trainer.train()
    assert trainer._buffer.query_ids.shape[1] % 8 == 0 and trainer._buffer.responses.shape[1] == 8
