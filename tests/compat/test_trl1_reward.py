"""TRL 1.x's RewardTrainer, RewardConfig and DataCollatorForPreference, called as TRL 1.16 documents them.

Each test is TRL's call with only the import changed (`trl` -> `rlhfkit`); tiny local models and small
datasets built here stand in for hub names. One test per TRL 1.x behaviour; each trains (or collates) and
checks that it really did.
"""

from __future__ import annotations

import datasets
import pytest
import torch

from rlhfkit import RewardConfig, RewardTrainer  # from trl import RewardConfig, RewardTrainer
from rlhfkit.testing import tiny_model, tiny_tokenizer

WORDS = ["the", "movie", "was", "plot", "actors", "music", "story", "film"]


@pytest.fixture
def tokenizer():
    return tiny_tokenizer(padding_side="right")


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3,
        report_to="none", use_cpu=True, save_strategy="no", logging_steps=1,
    )  # fmt: skip
    return RewardConfig(**{**base, **kw})


def _text_pairs(n=8):
    return [
        {"chosen": f"{WORDS[i % 8]} {WORDS[(i + 3) % 8]} excellent", "rejected": f"{WORDS[i % 8]} terrible"}
        for i in range(n)
    ]


def _train_and_check_it_learned(trainer):
    model = trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved and len(moved) == len(before)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < losses[0]


def test_pretokenised_chosen_ids_rejected_ids(tmp_path, tokenizer):
    rows = [
        {
            "chosen_ids": tokenizer(r["chosen"])["input_ids"],
            "rejected_ids": tokenizer(r["rejected"])["input_ids"],
        }
        for r in _text_pairs()
    ]
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=_args(tmp_path),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_data_collator_for_preference_docstring_example():
    from rlhfkit.trainers.reward_model.trainer import DataCollatorForPreference  # trl.trainer.reward_trainer

    collator = DataCollatorForPreference(pad_token_id=0)
    examples = [
        {"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5], "margin": 0.5},
        {"chosen_ids": [6, 7], "rejected_ids": [8], "margin": 0.0},
    ]
    out = collator(examples)
    assert out["input_ids"].tolist() == [[1, 2, 3], [6, 7, 0], [4, 5, 0], [8, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0]]
    assert torch.equal(out["margin"], torch.tensor([0.5, 0.0]))


def test_data_collator_for_preference_as_the_trainers_collator(tmp_path, tokenizer):
    from rlhfkit.trainers.reward_model.trainer import DataCollatorForPreference

    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=_args(tmp_path),
        data_collator=DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_tokenizer_without_pad_token_uses_eos(tmp_path, tokenizer):
    tokenizer.pad_token = None
    model = tiny_model("llama-reward")
    trainer = RewardTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    assert tokenizer.pad_token == tokenizer.eos_token
    assert model.config.pad_token_id == tokenizer.eos_token_id
    _train_and_check_it_learned(trainer)


def test_pad_token_and_eos_token(tmp_path, tokenizer):
    model = tiny_model("llama-reward")
    trainer = RewardTrainer(
        model=model,
        args=_args(tmp_path, pad_token="<|assistant|>", eos_token="<|pad|>"),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    assert tokenizer.pad_token == "<|assistant|>" and tokenizer.eos_token == "<|pad|>"
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    _train_and_check_it_learned(trainer)


def test_pad_to_multiple_of(tmp_path, tokenizer):
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=_args(tmp_path, pad_to_multiple_of=16),
        train_dataset=datasets.Dataset.from_list(_text_pairs()),
        processing_class=tokenizer,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    assert all(
        v.shape[-1] % 16 == 0 for k, v in batch.items() if k.startswith(("input_ids", "attention_mask"))
    )
    _train_and_check_it_learned(trainer)


def test_iterable_dataset(tmp_path, tokenizer):
    dataset = datasets.Dataset.from_list(_text_pairs()).to_iterable_dataset()
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=_args(tmp_path, dataset_num_proc=2),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    _train_and_check_it_learned(trainer)


def test_chat_template_path_renders_the_pairs(tmp_path, tokenizer):
    template = "{% for m in messages %}{{ m['role'] }} says {{ m['content'] }}\n{% endfor %}"
    (tmp_path / "chat.jinja").write_text(template)
    user = {"role": "user", "content": "the movie"}
    pair = {
        "chosen": [user, {"role": "assistant", "content": "was excellent"}],
        "rejected": [user, {"role": "assistant", "content": "was terrible"}],
    }
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=_args(tmp_path, chat_template_path=str(tmp_path / "chat.jinja")),
        train_dataset=datasets.Dataset.from_list([pair] * 8),
        processing_class=tokenizer,
    )
    assert trainer.processing_class.chat_template == template
    expected = tokenizer("user says the movie\nassistant says was excellent\n", add_special_tokens=False)
    assert trainer.train_dataset[0]["chosen_ids"][: len(expected["input_ids"])] == expected["input_ids"]


def test_train_dataset_is_required_in_the_trl1_form(tmp_path, tokenizer):
    from transformers import TrainingArguments

    with pytest.raises(ValueError, match="`train_dataset` is required"):
        RewardTrainer(model=tiny_model("llama-reward"), args=_args(tmp_path), processing_class=tokenizer)
    # TRL 0.x's form (a plain TrainingArguments, tokenizer=) keeps it optional, as its documentation says
    plain = TrainingArguments(output_dir=str(tmp_path / "plain"), report_to="none", use_cpu=True)
    legacy = RewardTrainer(model=tiny_model("llama-reward"), args=plain, tokenizer=tokenizer)
    assert legacy.train_dataset is None
