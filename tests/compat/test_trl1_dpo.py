"""TRL 1.x's DPOTrainer, DPOConfig and DataCollatorForPreference, called as TRL 1.16 documents them.

Each test is TRL's call with only the import changed (`trl` -> `rlhfkit`); tiny local models and small
datasets built here stand in for hub names. One test per TRL 1.x behaviour; each trains (or collates) and
checks that it really did.
"""

from __future__ import annotations

import datasets
import pytest
import torch

from rlhfkit import DPOConfig, DPOTrainer  # from trl import DPOConfig, DPOTrainer
from rlhfkit.testing import tiny_model, tiny_tokenizer

WORDS = ["the", "movie", "was", "plot", "actors", "music", "story", "film"]


@pytest.fixture
def tokenizer():
    return tiny_tokenizer(padding_side="right")


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3,
        report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, max_length=256,
    )  # fmt: skip
    return DPOConfig(**{**base, **kw})


def _text_pairs(n=8):
    return [
        {
            "prompt": f"{WORDS[i % 8]} {WORDS[(i + 3) % 8]}: ",
            "chosen": "yes good and fine",
            "rejected": "no bad",
        }
        for i in range(n)
    ]


def _train_and_check_it_learned(trainer):
    model = trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved and len(moved) == len(before)
    margins = [h["rewards/margins"] for h in trainer.state.log_history if "rewards/margins" in h]
    assert margins[-1] > 0  # after one update the policy prefers chosen more than the reference does


def test_max_length_below_128(tmp_path, tokenizer):
    """TRL 1.x has no max_prompt_length: DPOConfig(max_length=64) is a whole configuration."""
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, max_length=64),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_pretokenised_prompt_chosen_rejected_ids(tmp_path, tokenizer):
    rows = [
        {
            "prompt_ids": tokenizer(r["prompt"])["input_ids"],
            "chosen_ids": [20, 21, 22, 0],
            "rejected_ids": [30, 0],
        }
        for r in _text_pairs()
    ]
    dataset = datasets.Dataset.from_list(rows)
    trainer = DPOTrainer(
        model=tiny_model("llama"), args=_args(tmp_path), train_dataset=dataset, processing_class=tokenizer
    )
    _train_and_check_it_learned(trainer)


def test_data_collator_for_preference_docstring_example():
    from rlhfkit.trainers.dpo.trainer import DataCollatorForPreference  # trl.trainer.dpo_trainer

    collator = DataCollatorForPreference(pad_token_id=0)
    examples = [
        {"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6]},
        {"prompt_ids": [7, 8], "chosen_ids": [9], "rejected_ids": [10, 11]},
    ]
    out = collator(examples)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0], [1, 2, 3, 6, 0], [7, 8, 10, 11, 0]]
    assert out["attention_mask"].tolist() == [
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0],
    ]
    assert out["completion_mask"].tolist() == [
        [0, 0, 0, 1, 1],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 1, 1, 0],
    ]


def test_data_collator_for_preference_as_the_trainers_collator(tmp_path, tokenizer):
    from rlhfkit import DataCollatorForPreference  # also a top-level name in rlhfkit

    collator = DataCollatorForPreference(
        pad_token_id=tokenizer.pad_token_id, max_length=64, pad_to_multiple_of=8
    )
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path),
        data_collator=collator,
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_implicit_prompt_standard(tmp_path, tokenizer):
    rows = [
        {"chosen": r["prompt"] + "yes good and fine", "rejected": r["prompt"] + "no bad"}
        for r in _text_pairs()
    ]
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_implicit_prompt_conversational(tmp_path, tokenizer):
    rows = []
    for r in _text_pairs():
        user = {"role": "user", "content": r["prompt"]}
        chosen = [user, {"role": "assistant", "content": "yes good"}, {"role": "user", "content": "and?"},
                  {"role": "assistant", "content": "fine"}]  # fmt: skip
        rows.append({"chosen": chosen, "rejected": [user, {"role": "assistant", "content": "no bad"}]})
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_iterable_dataset(tmp_path, tokenizer):
    dataset = datasets.Dataset.from_list(_text_pairs()).to_iterable_dataset()
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, dataset_num_proc=2),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_pad_token_and_pad_to_multiple_of(tmp_path, tokenizer):
    tokenizer.pad_token = None
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, pad_token=tokenizer.eos_token, pad_to_multiple_of=16),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    assert tokenizer.pad_token == tokenizer.eos_token
    batch = next(iter(trainer.get_train_dataloader()))
    assert all(
        v.shape[-1] % 16 == 0 for k, v in batch.items() if k.endswith("input_ids") and "prompt" not in k
    )
    _train_and_check_it_learned(trainer)


def test_use_weighting(tmp_path, tokenizer):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, use_weighting=True),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)
    # at the first step policy = reference, so unweighted DPO's loss is exactly log 2; WPO's weights move it
    assert abs(trainer.state.log_history[0]["loss"] - 0.693147) > 1e-3


def test_ld_alpha(tmp_path, tokenizer):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, ld_alpha=0.5),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_sync_ref_model(tmp_path, tokenizer):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, sync_ref_model=True, ref_model_mixup_alpha=0.6, ref_model_sync_steps=1),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    ref_before = [p.detach().clone() for p in trainer.ref_model.parameters()]
    _train_and_check_it_learned(trainer)
    assert all(not torch.equal(p, b) for p, b in zip(trainer.ref_model.parameters(), ref_before))


def test_padding_free(tmp_path, tokenizer):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, padding_free=True),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_precompute_ref_batch_size(tmp_path, tokenizer):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, precompute_ref_log_probs=True, precompute_ref_batch_size=8),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


TOOL_TEMPLATE = (
    "{% if tools %}<|system|>\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|endoftext|>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}call {{ c['function']['name'] }}{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_tool_call_conversations(tmp_path, tokenizer):
    tokenizer.chat_template = TOOL_TEMPLATE
    tool = {"type": "function", "function": {"name": "weather", "parameters": {}}}
    rows = []
    for r in _text_pairs():
        call = {"type": "function", "function": {"name": "weather", "arguments": {}}}
        rows.append(
            {
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "chosen": [{"role": "assistant", "tool_calls": [call]}],
                "rejected": [{"role": "assistant", "content": "no bad"}],
                "tools": [tool],
            }
        )
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    assert "tools: weather" in tokenizer.decode(trainer.train_dataset[0]["prompt_ids"])
    _train_and_check_it_learned(trainer)


def test_positional_model_ref_model_args(tmp_path, tokenizer):
    """TRL 1.x's positional order is (model, ref_model, args, data_collator, train_dataset, eval_dataset,
    processing_class)."""
    dataset = datasets.Dataset.from_list(_text_pairs())
    trainer = DPOTrainer(tiny_model("llama"), None, _args(tmp_path), None, dataset, dataset, tokenizer)
    assert trainer.args.max_length == 256 and trainer.beta == 0.1 and trainer.eval_dataset is not None
    _train_and_check_it_learned(trainer)


def test_train_dataset_is_required_in_the_trl1_form(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        DPOTrainer(model=tiny_model("llama"), args=_args(tmp_path), processing_class=tokenizer)
    # TRL 0.x's form (beta= and tokenizer= as keywords) keeps it optional
    legacy = DPOTrainer(model=tiny_model("llama"), beta=0.2, args=_args(tmp_path), tokenizer=tokenizer)
    assert legacy.train_dataset is None and legacy.beta == 0.2


def test_evaluate_after_training_with_precomputed_reference_still_uses_the_initial_model(tmp_path, tokenizer):
    # TRL 1.16 refuses this (its reference was the policy itself, gone after training); here the reference is
    # a frozen copy, so a dataset first seen by evaluate() after training gets the initial model's log-probs
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, precompute_ref_log_probs=True, learning_rate=5e-3, per_device_eval_batch_size=8),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    held_out = datasets.Dataset.from_list(_text_pairs(12)[8:])
    before = trainer.evaluate(eval_dataset=held_out)
    assert before["eval_rewards/chosen"] == pytest.approx(0.0, abs=1e-5)  # policy == reference
    trainer.train()
    after = trainer.evaluate(eval_dataset=held_out)
    moved = after["eval_logps/chosen"] - before["eval_logps/chosen"]
    assert abs(moved) > 1e-3
    # implicit reward beta * (log pi - log ref) with log ref the log-probs from before training
    assert after["eval_rewards/chosen"] == pytest.approx(trainer.args.beta * moved, rel=1e-3, abs=1e-5)
