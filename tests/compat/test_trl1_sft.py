"""TRL 1.x's SFTTrainer / SFTConfig, called the way TRL 1.16 documents them, only the import changed.

One test per TRL 1.x behaviour: `from trl import ...` becomes `from rlhfkit import ...`; tiny local models
and small datasets built here stand in for hub names. Each test checks what the option does, not only
that the call is accepted.
"""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from rlhfkit import SFTConfig, SFTTrainer
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.tokenizer import GENERATION_CHAT_TEMPLATE

PAIRS = [
    {"prompt": "The sky is", "completion": " blue."},
    {"prompt": "The grass is", "completion": " green."},
    {"prompt": "The sun is", "completion": " bright."},
    {"prompt": "The night is", "completion": " dark."},
]
MESSAGES = [
    {
        "messages": [
            {"role": "system", "content": "answer briefly"},
            {"role": "user", "content": p["prompt"]},
            {"role": "assistant", "content": p["completion"]},
        ]
    }
    for p in PAIRS
]
TEXT = [{"text": t} for t in ["the cat sat on the mat", "a dog", "hello there friend of mine", "we read"]]


@pytest.fixture
def tokenizer():
    return tiny_tokenizer(padding_side="right")


def _args(tmp_path, **kwargs):
    base = {
        "output_dir": str(tmp_path / "out"), "report_to": "none", "use_cpu": True, "max_steps": 2,
        "logging_steps": 1, "per_device_train_batch_size": 2, "save_strategy": "no", "learning_rate": 1e-3,
    }  # fmt: skip
    return SFTConfig(**{**base, **kwargs})


def _labels(trainer, n=2):
    rows = list(trainer.train_dataset)[:n]
    return trainer.data_collator(rows)["labels"]


def test_completion_only_loss_is_on_by_default_for_prompt_completion(tmp_path, tokenizer):
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path),
        train_dataset=datasets.Dataset.from_list(PAIRS),
        processing_class=tokenizer,
    )
    labels = _labels(trainer, 1)[0]
    prompt_len = len(tokenizer("The sky is")["input_ids"])
    assert (labels[:prompt_len] == -100).all() and (labels[prompt_len:] != -100).all()


def test_assistant_only_loss(tmp_path, tokenizer):
    tokenizer.chat_template = GENERATION_CHAT_TEMPLATE
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, assistant_only_loss=True),
        train_dataset=datasets.Dataset.from_list(MESSAGES),
        processing_class=tokenizer,
    )
    labels = _labels(trainer, 1)[0]
    trained = tokenizer.decode(labels[labels != -100])
    assert trained == " blue.<|endoftext|>"
    trainer.train()


def test_truncation_mode_keep_end(tmp_path, tokenizer):
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, max_length=4, truncation_mode="keep_end"),
        train_dataset=datasets.Dataset.from_list(TEXT),
        processing_class=tokenizer,
    )
    ids = tokenizer("the cat sat on the mat")["input_ids"] + [tokenizer.eos_token_id]
    assert trainer.train_dataset[0]["input_ids"] == ids[-4:]


def test_data_collator_for_language_modeling():
    from rlhfkit import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(pad_token_id=0)
    out = collator([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 5, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["labels"].tolist() == [[1, 2, 3], [4, 5, -100]]
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    out = collator(
        [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5], "labels": [-100, 5]}]
    )
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert out["labels"].tolist() == [[-100, 2, 3, -100, 5]]


def test_mean_token_accuracy_entropy_and_num_tokens_are_logged(tmp_path, tokenizer):
    dataset = datasets.Dataset.from_list(PAIRS)
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert 0 <= logged["mean_token_accuracy"] <= 1 and logged["entropy"] > 0 and logged["num_tokens"] > 0
    metrics = trainer.evaluate()
    assert 0 <= metrics["eval_mean_token_accuracy"] <= 1 and metrics["eval_entropy"] > 0


def test_packing_strategy_bfd_is_padding_free(tmp_path, tokenizer):
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, packing=True, packing_strategy="bfd", max_length=16),
        train_dataset=datasets.Dataset.from_list(TEXT),
        processing_class=tokenizer,
    )
    assert all(sum(row["seq_lengths"]) <= 16 for row in trainer.train_dataset)
    batch = trainer.data_collator(list(trainer.train_dataset)[:2])
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    trainer.train()


def test_padding_free_and_pad_to_multiple_of(tmp_path, tokenizer):
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, padding_free=True, pad_to_multiple_of=8),
        train_dataset=datasets.Dataset.from_list(TEXT),
        processing_class=tokenizer,
    )
    batch = trainer.data_collator(list(trainer.train_dataset)[:2])
    assert batch["input_ids"].shape[0] == 1 and batch["input_ids"].shape[1] % 8 == 0
    assert batch["position_ids"][0, 0] == 0 and (batch["position_ids"][0] == 0).sum() >= 2
    trainer.train()


def test_eval_packing_and_shuffle_dataset(tmp_path, tokenizer):
    dataset = datasets.Dataset.from_list(TEXT * 3)
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, packing=True, max_length=32, eval_packing=False, shuffle_dataset=True),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
    )
    assert len(trainer.eval_dataset) == len(dataset)  # not packed
    assert len(trainer.train_dataset) < len(dataset)  # packed
    assert "eval_loss" in trainer.evaluate()


def test_iterable_dataset(tmp_path, tokenizer):
    stream = datasets.Dataset.from_list(TEXT).to_iterable_dataset()
    trainer = SFTTrainer(
        model=tiny_model("llama"), args=_args(tmp_path), train_dataset=stream, processing_class=tokenizer
    )
    trainer.train()
    assert trainer.state.global_step == 2


def test_conversations_column(tmp_path, tokenizer):
    rows = [
        {"conversations": [{"from": m["role"], "value": m["content"]} for m in r["messages"]]}
        for r in MESSAGES
    ]
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    rendered = tokenizer.apply_chat_template(MESSAGES[0]["messages"], tokenize=False)
    assert tokenizer.decode(trainer.train_dataset[0]["input_ids"]) == rendered
    trainer.train()


def test_chat_template_path(tmp_path, tokenizer):
    template = tmp_path / "template.jinja"
    template.write_text(GENERATION_CHAT_TEMPLATE)
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, chat_template_path=str(template), assistant_only_loss=True),
        train_dataset=datasets.Dataset.from_list(MESSAGES),
        processing_class=tokenizer,
    )
    assert trainer.processing_class.chat_template == GENERATION_CHAT_TEMPLATE
    trainer.train()


def test_chat_template_path_names_a_model_in_the_hub_cache(tmp_path, tokenizer, monkeypatch):
    """TRL's own tests pass `chat_template_path="Qwen/Qwen3-4B"`: a model name, read here from the local hub
    cache (a snapshot folder named by refs/main), never downloaded."""
    from huggingface_hub import constants

    source = tiny_tokenizer(padding_side="right")
    source.chat_template = GENERATION_CHAT_TEMPLATE
    repo = tmp_path / "hub" / "models--Org--chat-model"
    source.save_pretrained(repo / "snapshots" / ("0" * 40))
    tiny_model("llama").config.save_pretrained(repo / "snapshots" / ("0" * 40))  # a model's snapshot has one
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, chat_template_path="Org/chat-model", assistant_only_loss=True),
        train_dataset=datasets.Dataset.from_list(MESSAGES),
        processing_class=tokenizer,
    )
    assert trainer.processing_class.chat_template == GENERATION_CHAT_TEMPLATE
    with pytest.raises(
        ValueError, match="chat_template_path 'Org/missing' is not a local file, folder or cached"
    ):
        SFTTrainer(
            model=tiny_model("llama"),
            args=_args(tmp_path, chat_template_path="Org/missing"),
            train_dataset=datasets.Dataset.from_list(MESSAGES),
            processing_class=tokenizer,
        )


CUSTOM_TOKENIZER = """from transformers import PreTrainedTokenizerFast


class CustomTokenizerFast(PreTrainedTokenizerFast):
    pass
"""


def test_trust_remote_code_also_covers_the_tokenizer_code_in_the_model_folder(tmp_path):
    """A model given by path brings its tokenizer, whose class may be code in the folder (tokenizer_config's
    `auto_map`): `trust_remote_code` lets it run there too, not only for the model."""
    folder = tmp_path / "custom"
    tiny_model("llama").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    (folder / "tokenization_custom.py").write_text(CUSTOM_TOKENIZER)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(
        tokenizer_class="CustomTokenizerFast",
        auto_map={"AutoTokenizer": [None, "tokenization_custom.CustomTokenizerFast"]},
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    data = datasets.Dataset.from_list(TEXT)
    with pytest.raises(ValueError, match="custom code"):
        SFTTrainer(model=str(folder), args=_args(tmp_path), train_dataset=data)
    trainer = SFTTrainer(model=str(folder), args=_args(tmp_path, trust_remote_code=True), train_dataset=data)
    assert type(trainer.processing_class).__name__ == "CustomTokenizerFast"


def test_prompt_tuning(tmp_path, tokenizer):
    from peft import PromptTuningConfig

    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, learning_rate=1e-2),
        train_dataset=datasets.Dataset.from_list(PAIRS),
        processing_class=tokenizer,
        peft_config=PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
    )
    before = trainer.model.prompt_encoder.default.embedding.weight.detach().clone()
    trainer.train()
    assert not torch.equal(trainer.model.prompt_encoder.default.embedding.weight, before)
    assert 0 <= trainer.state.log_history[0]["mean_token_accuracy"] <= 1


def test_train_dataset_is_required_in_the_trl1_form(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        SFTTrainer(model=tiny_model("llama"), args=_args(tmp_path), processing_class=tokenizer)


def test_padding_free_without_packing_still_truncates_each_example_to_max_length(tmp_path, tokenizer):
    # TRL 1.16 refuses padding_free + max_length without packing; here each example is cut to max_length when
    # it is prepared, so the concatenated row holds at most batch size * max_length tokens, as a padded one
    long_text = [{"text": " ".join(["word"] * 40)}, {"text": " ".join(["other"] * 30)}]
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, padding_free=True, max_length=8, max_steps=1),
        train_dataset=datasets.Dataset.from_list(long_text),
        processing_class=tokenizer,
    )
    assert [len(ids) for ids in trainer.train_dataset["input_ids"]] == [8, 8]
    batch = trainer.data_collator(list(trainer.train_dataset))
    assert batch["position_ids"].tolist() == [list(range(8)) * 2]
    trainer.train()


def test_skip_prepare_dataset_masks_without_labels_still_mask_the_loss(tmp_path, tokenizer):
    # TRL 1.16 refuses such rows because its collator ignores the masks; this collator applies them
    rows = datasets.Dataset.from_list([{"input_ids": [5, 6, 7, 8], "assistant_masks": [0, 0, 1, 1]}] * 2)
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_args(tmp_path, dataset_kwargs={"skip_prepare_dataset": True}, max_steps=1),
        train_dataset=rows,
        processing_class=tokenizer,
    )
    batch = next(iter(trainer.get_train_dataloader()))  # the columns the trainer keeps reach the collator
    assert batch["labels"].tolist() == [[-100, -100, 7, 8]] * 2
    trainer.train()
