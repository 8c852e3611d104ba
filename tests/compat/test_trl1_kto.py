"""TRL 1.x's KTOTrainer, called as its documentation does, with only the import changed.

`from trl import KTOConfig, KTOTrainer` becomes `from rlhfkit import KTOConfig, KTOTrainer`; tiny local
models stand in for hub names and small in-memory datasets for `load_dataset("trl-lib/kto-mix-14k")`
(unpaired rows) and `load_dataset("trl-lib/ultrafeedback_binarized")` (pairs, unpaired by the trainer).
Each call must really train: the desirable completions' implicit reward rises above the undesirable ones'.
"""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset

from rlhfkit import KTOConfig, KTOTrainer, maybe_unpair_preference_dataset, unpair_preference_dataset
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer

WORDS = ["the", "movie", "was", "plot", "actors", "music", "story", "film"]


def _kto_mix(n: int, seed: int = 0) -> Dataset:
    """Rows shaped like trl-lib/kto-mix-14k: a chat prompt, a chat completion and a boolean label."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        good = i % 2 == 0
        question = " ".join(rng.choices(WORDS, k=3))
        rows.append(
            {
                "prompt": [{"role": "user", "content": question}],
                "completion": [{"role": "assistant", "content": "yes good" if good else "no bad"}],
                "label": good,
            }
        )
    return Dataset.from_list(rows)


def _pairs(n: int) -> Dataset:
    """Standard (plain text) preference pairs."""
    return Dataset.from_list(
        [{"prompt": f"{WORDS[i % 8]} {i}: ", "chosen": "yes good", "rejected": "no bad"} for i in range(n)]
    )


def _args(tmp_path, **kw) -> KTOConfig:
    # TRL's defaults aside from the run length, the learning rate large enough for a few steps, and the CPU
    run = dict(max_steps=6, per_device_train_batch_size=8, learning_rate=2e-3, beta=0.5, logging_steps=1)
    return KTOConfig(
        output_dir=str(tmp_path / "Qwen2-0.5B-KTO"), report_to="none", use_cpu=True, save_strategy="no",
        **{**run, **kw},
    )  # fmt: skip


def _margin(trainer: KTOTrainer) -> float:
    metrics = trainer.evaluate()
    return metrics["eval_rewards/chosen"] - metrics["eval_rewards/rejected"]


def test_documented_quickstart_trains(tmp_path):
    model = tiny_model("llama")  # AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-0.5B-Instruct")
    tokenizer = tiny_tokenizer()  # AutoTokenizer.from_pretrained("Qwen/Qwen2-0.5B-Instruct")
    train_dataset = _kto_mix(16)  # load_dataset("trl-lib/kto-mix-14k", split="train")

    training_args = _args(tmp_path)
    trainer = KTOTrainer(
        model=model, args=training_args, processing_class=tokenizer, train_dataset=train_dataset
    )
    trainer.train()

    logged = [h for h in trainer.state.log_history if "rewards/margins" in h]
    assert logged and logged[-1]["rewards/chosen"] > 0 > logged[-1]["rewards/rejected"]
    assert {"kl", "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected"} <= set(logged[-1])


def test_model_given_as_a_path_loads_its_tokenizer(tmp_path):
    trainer = KTOTrainer(
        model=str(tiny_model_path("llama")),
        args=_args(tmp_path),
        train_dataset=_kto_mix(16),
        eval_dataset=_kto_mix(8, 1),
    )
    assert trainer.processing_class is not None and next(trainer.model.parameters()).dtype == torch.float32
    trainer.train()
    assert _margin(trainer) > 0


def test_explicit_ref_model_stays_frozen(tmp_path):
    ref_model = tiny_model("llama")
    frozen = {k: v.clone() for k, v in ref_model.state_dict().items()}
    trainer = KTOTrainer(
        model=tiny_model("llama"),
        ref_model=ref_model,
        args=_args(tmp_path),
        train_dataset=_pairs(8),  # paired data: unpaired into 16 rows
        eval_dataset=_pairs(4),
        processing_class=tiny_tokenizer(),
    )
    assert len(trainer.train_dataset) == 16
    trainer.train()
    assert _margin(trainer) > 0
    assert all(torch.equal(v, frozen[k]) for k, v in ref_model.state_dict().items())


def test_peft_config_trains_lora_against_the_base(tmp_path):
    from peft import LoraConfig

    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = KTOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, learning_rate=1e-2),
        train_dataset=_kto_mix(16),
        eval_dataset=_kto_mix(8, 1),
        processing_class=tiny_tokenizer(),
        peft_config=peft_config,
    )
    trainer.train()
    assert _margin(trainer) > 0


def test_already_wrapped_peft_model_keeps_its_starting_adapter_as_reference(tmp_path):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM", init_lora_weights=False
    )
    model = get_peft_model(tiny_model("llama"), config)  # a non-zero adapter: base != policy at the start
    trainer = KTOTrainer(
        model=model,
        args=_args(tmp_path, max_steps=1),
        train_dataset=_kto_mix(8),
        processing_class=tiny_tokenizer(),
    )
    assert trainer.reference.kind == "adapter"
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    with torch.no_grad():
        _, _, rewards = trainer._loss_metrics_rewards(trainer.model, batch, "eval")
    assert torch.allclose(rewards, torch.zeros_like(rewards), atol=1e-6)  # policy == reference at step 0


def test_unpair_helpers_as_trl_exports_them():
    pairs = _pairs(2)
    rows = unpair_preference_dataset(pairs)
    assert rows.column_names == ["prompt", "completion", "label"] and rows["label"] == [
        True,
        True,
        False,
        False,
    ]
    assert maybe_unpair_preference_dataset(pairs)["completion"] == rows["completion"]
    assert maybe_unpair_preference_dataset(rows) is rows


def test_missing_train_dataset_is_named(tmp_path):
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        KTOTrainer(model=tiny_model("llama"), args=_args(tmp_path), processing_class=tiny_tokenizer())
