"""SFTTrainer with TRL 1.x's options: each one changes what trains, checked against hand computations."""

from __future__ import annotations

import datasets
import pytest
import torch
import torch.nn.functional as F

from rlhfkit.data.language_modeling import DataCollatorForLanguageModeling
from rlhfkit.rollout import scoring
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.tokenizer import GENERATION_CHAT_TEMPLATE
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

X = -100
PAIRS = [
    {"prompt": "Q: hi ", "completion": "fine thanks"},
    {"prompt": "Q: name ", "completion": "bob"},
    {"prompt": "Q: where ", "completion": "in the town"},
    {"prompt": "Q: when ", "completion": "at night"},
]
DOCS = [
    "the cat sat on the mat",
    "a dog",
    "hello there friend of mine",
    "we read",
    "birds sing in the morning",
]
CHATS = [
    [{"role": "user", "content": q["prompt"]}, {"role": "assistant", "content": q["completion"]}]
    for q in PAIRS
]


@pytest.fixture
def tok():
    return tiny_tokenizer(padding_side="right")


def _trainer(tmp_path, tok, rows, model=None, **config):
    args = few_step_args(SFTConfig, tmp_path / "out", **{"per_device_train_batch_size": 2, **config})
    rows = (
        rows
        if isinstance(rows, (datasets.Dataset, datasets.IterableDataset))
        else datasets.Dataset.from_list(rows)
    )
    return SFTTrainer(model=model or tiny_model("llama"), args=args, train_dataset=rows, processing_class=tok)


def _trained_tokens(batch):
    return [[t for t in row if t != X] for row in batch["labels"].tolist()]


def test_completion_only_is_the_default_for_prompt_completion_data(tmp_path, tok):
    default = _trainer(tmp_path, tok, PAIRS[:1])
    batch = default.data_collator([default.train_dataset[0]])
    want = tok("fine thanks", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert _trained_tokens(batch) == [want]
    everything = _trainer(tmp_path, tok, PAIRS[:1], completion_only_loss=False)
    row = everything.train_dataset[0]["input_ids"]
    assert _trained_tokens(everything.data_collator([everything.train_dataset[0]])) == [row]


def test_assistant_only_loss_with_a_template_file(tmp_path, tok):
    template = tmp_path / "chat.jinja"
    template.write_text(GENERATION_CHAT_TEMPLATE)
    rows = [{"messages": [{"role": "system", "content": "be brief"}, *chat]} for chat in CHATS]
    trainer = _trainer(tmp_path, tok, rows, assistant_only_loss=True, chat_template_path=str(template))
    assert trainer.processing_class.chat_template == GENERATION_CHAT_TEMPLATE
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    replies = [tok(c[1]["content"] + tok.eos_token, add_special_tokens=False)["input_ids"] for c in CHATS[:2]]
    assert _trained_tokens(batch) == replies  # the system and user turns are -100
    trainer.train()
    # the tiny tokenizer's own template has no generation blocks; rendering the chats up to each assistant
    # message finds the same turns
    plain = _trainer(tmp_path, tiny_tokenizer(padding_side="right"), rows, assistant_only_loss=True)
    assert _trained_tokens(plain.data_collator([plain.train_dataset[i] for i in range(2)])) == replies
    template.write_text("{{ messages | length }} messages\n" + tiny_tokenizer().chat_template)
    with pytest.raises(ValueError, match=r"\{% generation %\}.*not prefix-stable"):
        _trainer(tmp_path, tok, rows, assistant_only_loss=True, chat_template_path=str(template))


def test_truncation_mode_keep_end_keeps_the_completion(tmp_path, tok):
    long = [{"prompt": "the cat sat on the mat and then " * 3, "completion": "slept"}]
    kept = _trainer(tmp_path, tok, long, max_length=6, truncation_mode="keep_end")
    full = tok(long[0]["prompt"])["input_ids"] + tok("slept", add_special_tokens=False)["input_ids"]
    assert kept.train_dataset[0]["input_ids"] == (full + [tok.eos_token_id])[-6:]
    with pytest.raises(ValueError, match="no trained token"):  # keep_start leaves only prompt tokens
        _trainer(tmp_path, tok, long, max_length=6, truncation_mode="keep_start")
    with pytest.raises(ValueError, match="truncation_mode must be 'keep_start' or 'keep_end', got 'middle'"):
        few_step_args(SFTConfig, tmp_path / "o", truncation_mode="middle")


@pytest.mark.parametrize("chunked", [False, True])
def test_bfd_packing_is_padding_free_and_gives_the_padded_loss(tmp_path, tok, monkeypatch, chunked):
    if chunked:
        monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)
    rows = [{"text": d} for d in DOCS]
    trainer = _trainer(tmp_path, tok, rows, packing=True, max_length=16)
    assert trainer.args.resolved_packing_strategy() == "bfd" and trainer.data_collator.padding_free
    lengths = [len(tok(d)["input_ids"]) + 1 for d in DOCS]  # + EOS
    assert sorted(n for row in trainer.train_dataset["seq_lengths"] for n in row) == sorted(lengths)
    assert all(sum(row) <= 16 for row in trainer.train_dataset["seq_lengths"])
    packed = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    assert "attention_mask" not in packed and packed["input_ids"].shape == (1, sum(lengths))
    prepared = _trainer(tmp_path, tok, rows, max_length=16).train_dataset
    padded = DataCollatorForLanguageModeling(tok.pad_token_id)([prepared[i] for i in range(len(DOCS))])
    model = trainer.model.eval()
    with torch.no_grad():  # restarting positions: every document sees only itself, as when padded
        torch.testing.assert_close(trainer.compute_loss(model, packed), trainer.compute_loss(model, padded))


def test_wrapped_packing_and_eval_packing(tmp_path, tok):
    rows = [{"text": d} for d in DOCS]
    args = few_step_args(SFTConfig, tmp_path / "o", packing=True, packing_strategy="wrapped", max_length=8,
                         eval_packing=False)  # fmt: skip
    data = datasets.Dataset.from_list(rows)
    trainer = SFTTrainer(
        tiny_model("llama"), args, train_dataset=data, eval_dataset=data, processing_class=tok
    )
    total = sum(len(tok(d)["input_ids"]) + 1 for d in DOCS)
    assert [len(r) for r in trainer.train_dataset["input_ids"]] == [8] * (total // 8) + [total % 8]
    assert not trainer.data_collator.padding_free  # wrapped rows are padded, attention as usual
    assert len(trainer.eval_dataset) == len(DOCS) and "seq_lengths" not in trainer.eval_dataset.column_names
    trainer.train()
    assert "eval_loss" in trainer.evaluate()


def test_padding_free_without_packing_and_pad_to_multiple_of(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, [{"text": d} for d in DOCS], padding_free=True, pad_to_multiple_of=8)
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    lengths = [len(trainer.train_dataset[i]["input_ids"]) for i in range(2)]
    width = -(-sum(lengths) // 8) * 8
    assert batch["position_ids"].tolist() == [
        list(range(lengths[0])) + list(range(lengths[1])) + [0] * (width - sum(lengths))
    ]
    trainer.train()


def test_shuffle_dataset_reorders_with_the_seed(tmp_path, tok):
    rows = [{"text": f"{d} {i}"} for i, d in enumerate(DOCS * 4)]
    plain = _trainer(tmp_path, tok, rows).train_dataset["input_ids"]
    shuffled = _trainer(tmp_path, tok, rows, shuffle_dataset=True).train_dataset["input_ids"]
    assert shuffled != plain and sorted(shuffled) == sorted(plain)
    assert _trainer(tmp_path, tok, rows, shuffle_dataset=True).train_dataset["input_ids"] == shuffled


def _hand_stats(model, batch):
    """Entropy and top-1 accuracy over label tokens, from the full logits, position by position."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    entropy, hits, count = 0.0, 0, 0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1] - 1):
            target = int(batch["labels"][b, t + 1])
            if target == X:
                continue
            p = F.softmax(logits[b, t].double(), -1)
            entropy -= float((p * p.log()).sum())
            hits += int(logits[b, t].argmax()) == target
            count += 1
    return entropy / count, hits / count


@pytest.mark.parametrize("chunked", [False, True])
def test_mean_token_accuracy_entropy_and_num_tokens(tmp_path, tok, monkeypatch, chunked):
    if chunked:
        monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)
    trainer = _trainer(tmp_path, tok, PAIRS)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    model = trainer.model.eval()
    with torch.no_grad():
        trainer.compute_loss(model, batch)
        entropy, accuracy = _hand_stats(model, batch)
    logged = trainer._metrics.pop_means("eval")
    assert logged["entropy"] == pytest.approx(entropy, rel=1e-4)
    assert logged["mean_token_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    model.train()
    trainer.train()  # 2 steps x 2 rows: every row once, so num_tokens counts all their tokens
    train_logs = [h for h in trainer.state.log_history if "loss" in h]
    assert train_logs[-1]["num_tokens"] == sum(len(r) for r in trainer.train_dataset["input_ids"])
    assert all(0 <= h["mean_token_accuracy"] <= 1 and h["entropy"] > 0 for h in train_logs)
    metrics = trainer.evaluate(datasets.Dataset.from_list(PAIRS))  # raw: prepared here
    assert {"eval_mean_token_accuracy", "eval_entropy", "eval_num_tokens"} <= set(metrics)


def test_iterable_dataset_and_conversations_train(tmp_path, tok):
    sharegpt = [[{"from": m["role"], "value": m["content"]} for m in chat] for chat in CHATS]
    stream = datasets.Dataset.from_list([{"conversations": c} for c in sharegpt]).to_iterable_dataset()
    trainer = _trainer(tmp_path, tok, stream, dataset_num_proc=2)
    first = next(iter(trainer.train_dataset))
    assert (
        first["input_ids"] == tok.apply_chat_template(CHATS[0], tokenize=True, return_dict=True)["input_ids"]
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert trainer.args.accelerator_config.dispatch_batches is False  # each process reads its own rows


@pytest.mark.parametrize("chunked", [False, True])
def test_prompt_tuning_trains_only_the_virtual_tokens(tmp_path, tok, monkeypatch, chunked):
    if chunked:  # the virtual tokens come first in the hidden states: the batch's own positions are read
        monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)
    from peft import PromptTuningConfig

    peft_config = PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    args = few_step_args(SFTConfig, tmp_path / "out", per_device_train_batch_size=2, learning_rate=1e-2)
    data = datasets.Dataset.from_list(PAIRS)
    trainer = SFTTrainer(
        tiny_model("llama"), args, train_dataset=data, processing_class=tok, peft_config=peft_config
    )
    trainable = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert list(trainable) == ["prompt_encoder.default.embedding.weight"]
    trainer.train()
    params = dict(trainer.model.named_parameters())
    assert not torch.equal(
        params["prompt_encoder.default.embedding.weight"],
        trainable["prompt_encoder.default.embedding.weight"],
    )
    assert all(torch.equal(params[n], v) for n, v in frozen.items())
    assert 0 <= trainer.state.log_history[0]["mean_token_accuracy"] <= 1


def test_constant_length_training_with_an_unpacked_eval_set(tmp_path, tok):
    rows = datasets.Dataset.from_list([{"text": d} for d in DOCS * 2])
    args = few_step_args(SFTConfig, tmp_path / "o", packing=True, max_seq_length=8, eval_packing=False)
    trainer = SFTTrainer(
        tiny_model("llama"), args, train_dataset=rows, eval_dataset=rows, processing_class=tok
    )
    assert trainer.args.resolved_packing_strategy() == "constant_length"  # TRL 0.x's spelling of the length
    assert trainer.train_dataset.column_names == ["input_ids", "position_ids", "labels"]
    assert len(trainer.eval_dataset) == len(rows)  # rows, padded by the same collator
    assert "eval_loss" in trainer.evaluate()
    with pytest.raises(ValueError, match="assistant_only_loss=True cannot be combined with packing=True"):
        few_step_args(SFTConfig, tmp_path / "o", packing=True, max_seq_length=8, assistant_only_loss=True)
    with pytest.raises(ValueError, match=r"packing_strategy must be one of \('bfd', 'bfd_split', 'wrapped'"):
        few_step_args(SFTConfig, tmp_path / "o", packing_strategy="first_fit")


def test_pad_to_multiple_of_values(tmp_path):
    def multiple(value):
        return few_step_args(SFTConfig, tmp_path / "o", pad_to_multiple_of=value).pad_to_multiple_of

    assert [multiple(v) for v in ("auto", None, 8, "16", "none")] == [None, None, 8, 16, None]
    message = "pad_to_multiple_of must be a positive integer, 'auto' or None, got"
    with pytest.raises(ValueError, match=f"{message} 0"):
        multiple(0)
    with pytest.raises(ValueError, match=f"{message} 'x'"):
        multiple("x")


def test_remove_unused_columns_keeps_what_the_collator_reads(tmp_path, tok):
    args = {
        "remove_unused_columns": True,
        "packing": True,
        "max_length": 32,
        "per_device_train_batch_size": 1,
    }
    trainer = _trainer(tmp_path, tok, PAIRS[:1], **args)
    batch = next(iter(trainer.get_train_dataloader()))
    want = trainer.data_collator([trainer.train_dataset[0]])  # every prepared column
    assert batch.keys() == want.keys() and all(torch.equal(batch[k], want[k]) for k in want)
    n_prompt = len(tok(PAIRS[0]["prompt"])["input_ids"])
    assert (batch["labels"][0, :n_prompt] == X).all() and (batch["labels"][0, n_prompt:] != X).all()


def test_padding_free_refuses_a_padding_collator(tmp_path, tok):
    args = few_step_args(SFTConfig, tmp_path / "o", packing=True, max_length=16)
    data = datasets.Dataset.from_list([{"text": d} for d in DOCS])
    padding = DataCollatorForLanguageModeling(tok.pad_token_id)
    with pytest.raises(
        ValueError, match="needs a padding-free collator, and the data_collator given is Data"
    ):
        SFTTrainer(tiny_model("llama"), args, data_collator=padding, train_dataset=data, processing_class=tok)
    free = DataCollatorForLanguageModeling(tok.pad_token_id, padding_free=True)
    trainer = SFTTrainer(
        tiny_model("llama"), args, data_collator=free, train_dataset=data, processing_class=tok
    )
    assert trainer.data_collator is free


def test_a_dataset_with_a_transform_needs_skip_prepare_dataset(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    rows = datasets.Dataset.from_dict({"text": ["hello world"]}).with_transform(lambda batch: batch)
    with pytest.raises(
        ValueError, match=r"`train_dataset` has a Dataset.with_transform\(\).*skip_prepare_dataset"
    ):
        _trainer(tmp_path, tok, rows)
