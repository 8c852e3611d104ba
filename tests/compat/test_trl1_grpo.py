"""TRL 1.16's GRPOConfig fields and GRPOTrainer inputs, called as TRL's documentation writes them, with only
the import changed from `trl` to `rlhfkit`: one test per behaviour. Tiny local models stand in for hub names
(`model=` a local path, so the tokenizer loads from it as in TRL); each test checks that the option does
what TRL says, not just that it is accepted."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from datasets import Dataset

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.testing import tiny_model_path


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def reward_e(completions, **kwargs):
    return [float(completion.count("e")) for completion in completions]


def _prompts(n=8):
    return Dataset.from_dict({"prompt": [f"The story number {i} begins" for i in range(n)]})


def _config(tmp_path, **kwargs):
    common = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6, max_steps=2, report_to="none", logging_steps=1, use_cpu=True,
        learning_rate=1e-3, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    return GRPOConfig(**{**common, **kwargs})


def _train(tmp_path, reward_funcs=reward_len, train_dataset=None, **kwargs):
    trainer = GRPOTrainer(
        model=str(tiny_model_path("llama")),
        reward_funcs=reward_funcs,
        args=_config(tmp_path, **kwargs),
        train_dataset=train_dataset if train_dataset is not None else _prompts(),
    )
    trainer.train()
    return trainer


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_iterable_dataset_with_max_steps(tmp_path):
    stream = _prompts().to_iterable_dataset()
    trainer = _train(tmp_path, train_dataset=stream, max_steps=3)
    assert trainer.state.global_step == 3
    assert len(_logged(trainer, "reward")) >= 3


def test_entropy_coef_adds_an_entropy_bonus(tmp_path):
    trainer = _train(tmp_path, entropy_coef=0.01)
    assert _logged(trainer, "entropy_coef") == [0.01, 0.01]
    for loss, policy_loss in zip(_logged(trainer, "loss"), _logged(trainer, "policy_loss")):
        assert loss < policy_loss  # loss = policy_loss - 0.01 * mean entropy


def test_adaptive_entropy_moves_the_coefficient_toward_the_target(tmp_path):
    trainer = _train(
        tmp_path, use_adaptive_entropy=True, entropy_coef=0.0, entropy_target=50.0, entropy_coef_delta=0.005,
        entropy_coef_min=0.0, entropy_coef_max=1.0, max_steps=3,
    )  # fmt: skip
    assert _logged(trainer, "entropy_coef") == pytest.approx([0.005, 0.01, 0.015])


def test_multi_objective_aggregation_normalize_then_sum(tmp_path):
    def reward_big(completions, **kwargs):  # a reward on a far larger scale than reward_e
        return [1000.0 * len(completion) for completion in completions]

    trainer = _train(
        tmp_path,
        reward_funcs=[reward_e, reward_big],
        multi_objective_aggregation="normalize_then_sum",
        max_steps=1,
    )
    summed = _train(
        tmp_path, reward_funcs=[reward_e, reward_big], max_steps=1
    )  # same completions (same seed)
    gdpo, plain = trainer._buffer.advantages, summed._buffer.advantages
    # GDPO standardises the weighted sum of group-normalised rewards over the whole batch
    assert gdpo.mean().item() == pytest.approx(0.0, abs=1e-5) and gdpo.std().item() == pytest.approx(
        1.0, abs=1e-3
    )
    assert not torch.allclose(gdpo, plain)  # reward_e counts as much as reward_big, not 1000 times less


@pytest.mark.parametrize(
    "loss_options",
    [
        {"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05},
        {
            "loss_type": "vespo",
            "vespo_k_pos": 2.0,
            "vespo_lambda_pos": 3.0,
            "vespo_k_neg": 3.0,
            "vespo_lambda_neg": 2.0,
        },
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    ],
    ids=lambda options: options["loss_type"],
)
def test_loss_types_sapo_vespo_luspo(tmp_path, loss_options):
    trainer = GRPOTrainer(
        model=str(tiny_model_path("llama")),
        reward_funcs=reward_len,
        args=_config(tmp_path, num_iterations=2, **loss_options),
        train_dataset=_prompts(),
    )
    before = {name: param.clone() for name, param in trainer.model.named_parameters()}
    trainer.train()
    assert all(math.isfinite(loss) for loss in _logged(trainer, "loss"))
    moved = [not torch.equal(before[name], param) for name, param in trainer.model.named_parameters()]
    assert all(moved)


def test_off_policy_mask_threshold(tmp_path):
    # a large first step makes the second pass over the same completions off-policy
    options = dict(num_iterations=2, learning_rate=0.05, max_steps=2)
    masked = _train(tmp_path, off_policy_mask_threshold=1e-3, **options)
    plain = _train(tmp_path, **options)
    assert _logged(masked, "loss")[0] == pytest.approx(
        _logged(plain, "loss")[0]
    )  # on-policy: nothing dropped
    drifted = [not torch.equal(a, b) for a, b in zip(masked.model.parameters(), plain.model.parameters())]
    assert any(drifted)  # the second pass left drifted negative completions out


def test_cast_lm_head_to_fp32(tmp_path):
    trainer = _train(
        tmp_path, cast_lm_head_to_fp32=True, model_init_kwargs={"dtype": "bfloat16"}, max_steps=1
    )
    assert trainer.model.lm_head.weight.dtype == torch.float32
    assert trainer.model.model.embed_tokens.weight.dtype == torch.bfloat16
    hidden = torch.randn(1, 2, trainer.model.config.hidden_size, dtype=torch.bfloat16)
    assert trainer.model.lm_head(hidden).dtype == torch.float32


def test_pad_to_multiple_of(tmp_path):
    trainer = _train(tmp_path, pad_to_multiple_of=16, max_steps=1)
    assert trainer._buffer.query_ids.shape[1] % 16 == 0 and trainer._buffer.responses.shape[1] == 16


def test_cache_implementation(tmp_path, monkeypatch):
    from transformers import GenerationMixin

    seen, generate = [], GenerationMixin.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs["generation_config"].cache_implementation)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    _train(tmp_path, cache_implementation="static", max_steps=1)
    assert seen and set(seen) == {"static"}


def test_reward_tokenizer_with_a_pad_token_outside_its_vocabulary_pads_with_eos(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from rlhfkit.testing import tiny_tokenizer

    reward_tokenizer = tiny_tokenizer()
    reward_tokenizer.pad_token = "<|not_in_this_vocabulary|>"  # TRL's test names a Llama-3 pad token
    assert reward_tokenizer.pad_token_id is None
    trainer = GRPOTrainer(
        model=str(tiny_model_path("llama")),
        reward_funcs=AutoModelForSequenceClassification.from_pretrained(tiny_model_path("llama-reward")),
        args=_config(tmp_path, max_steps=1),
        train_dataset=_prompts(),
        reward_processing_classes=reward_tokenizer,
    )
    assert reward_tokenizer.pad_token_id == reward_tokenizer.eos_token_id
    trainer.train()
    assert all(math.isfinite(reward) for reward in _logged(trainer, "reward"))


def test_iterable_eval_set_gets_a_single_worker_loader_and_train_keeps_its_workers(tmp_path):
    trainer = GRPOTrainer(
        model=str(tiny_model_path("llama")),
        reward_funcs=reward_len,
        args=_config(tmp_path, dataloader_num_workers=2, per_device_eval_batch_size=4),
        train_dataset=_prompts(),
        eval_dataset=_prompts(4).to_iterable_dataset(),
    )
    assert trainer.get_eval_dataloader().num_workers == 0
    assert trainer.args.dataloader_num_workers == 2  # only that loader: the setting is put back
    assert trainer.get_train_dataloader().num_workers == 2


def test_every_reward_none_warns_before_the_guard_stops_training(tmp_path):
    from rlhfkit.core.warnings import NonFiniteStepWarning
    from rlhfkit.trainers.common.guards import NonFiniteError

    def always_none(completions, **kwargs):
        return [None] * len(completions)

    stopped = pytest.raises(NonFiniteError, match="no usable reward")
    with warnings.catch_warnings(record=True) as caught, stopped:
        warnings.simplefilter("always")
        _train(tmp_path, reward_funcs=always_none, max_steps=4, max_consecutive_nonfinite_steps=2)
    messages = [str(w.message) for w in caught]
    first_none = next(i for i, m in enumerate(messages) if "every reward function returned None" in m)
    first_skip = next(i for i, w in enumerate(caught) if issubclass(w.category, NonFiniteStepWarning))
    assert first_none < first_skip  # the rows without a reward are named before the step is skipped
    assert "for 4 of 4 rows" in messages[first_none]  # one prompt, 4 completions
