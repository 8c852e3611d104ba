"""SFTTrainer: hand-computed cross-entropy, parameters that move, packing and completion-only labels."""

from __future__ import annotations

import math

import datasets
import pytest
import torch
import torch.nn.functional as F

from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.sft.config import SFTConfig
from rlhfkit.trainers.sft.trainer import SFTTrainer

DOCS = [
    "the cat sat on the mat",
    "a dog ran far away today",
    "hello there friend of mine",
    "rain falls on the quiet town",
    "we like to read long books at night",
    "birds sing in the morning",
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _config(tmp_path, **kw):
    return few_step_args(
        SFTConfig, tmp_path / "out", **{"per_device_train_batch_size": 2, "max_seq_length": 32, **kw}
    )


def _text_ds():
    return datasets.Dataset.from_list([{"text": d} for d in DOCS])


def test_loss_is_cross_entropy_over_completion_tokens(tmp_path, tok):
    model = tiny_model("llama").eval()
    rows = [{"prompt": "Q: hi ", "completion": "fine thanks"}, {"prompt": "Q: name ", "completion": "bob"}]
    trainer = SFTTrainer(
        model=model,
        args=_config(tmp_path, completion_only_loss=True),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tok,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
        # naive: per row, log-prob of each completion token given everything before it, averaged over tokens
        nll, count = 0.0, 0
        for row in trainer.train_dataset:
            ids = torch.tensor([row["input_ids"]])
            logp = F.log_softmax(model(input_ids=ids).logits[0], -1)
            for t in range(1, len(row["input_ids"])):
                if row["labels"][t] != -100:  # a completion token
                    nll -= logp[t - 1, row["input_ids"][t]].item()
                    count += 1
    assert count == sum(len(tok(r["completion"], add_special_tokens=False)["input_ids"]) + 1 for r in rows)
    assert loss.item() == pytest.approx(nll / count, rel=1e-4)


def test_trainable_parameters_move_with_model_path(tmp_path):
    trainer = SFTTrainer(model=str(tiny_model_path("gpt2")), args=_config(tmp_path), train_dataset=_text_ds())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    moved = [n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])]
    # GPT-2 ties lm_head to wte; every trainable tensor should have changed
    assert set(moved) == set(before)


def test_packed_training_blocks_are_full_and_lora_moves_only_adapters(tmp_path, tok):
    from peft import LoraConfig

    model = tiny_model("llama")
    trainer = SFTTrainer(
        model=model,
        args=_config(tmp_path, packing=True, max_seq_length=16),
        train_dataset=_text_ds(),
        processing_class=tok,
        peft_config=LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"]),
    )
    ds = trainer.train_dataset
    total = sum(len(tok(d)["input_ids"]) + 1 for d in DOCS)
    assert len(ds) == total // 16
    assert all(len(r["input_ids"]) == 16 and len(r["labels"]) == 16 for r in ds)
    batch = trainer.data_collator([ds[0], ds[1]])
    assert "attention_mask" not in batch and batch["position_ids"].shape == (2, 16)
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    trainer.train()
    params = dict(trainer.model.named_parameters())
    assert all(not torch.equal(params[n], v) for n, v in lora.items() if "lora_B" in n)
    assert all(torch.equal(params[n], v) for n, v in frozen.items())


def test_chat_dataset_and_formatting_func(tmp_path, tok):
    chats = [
        {"messages": [{"role": "user", "content": d}, {"role": "assistant", "content": "ok"}]}
        for d in DOCS[:2]
    ]
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path),
        processing_class=tok,
        train_dataset=datasets.Dataset.from_list(chats),
    )
    assert tok.decode(trainer.train_dataset[0]["input_ids"]) == tok.apply_chat_template(
        chats[0]["messages"], tokenize=False
    )
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path),
        processing_class=tok,
        train_dataset=datasets.Dataset.from_list([{"q": "a", "a": "b"}]),
        formatting_func=lambda r: f"{r['q']}? {r['a']}",
        dataset_text_field="unused",
    )
    assert trainer.train_dataset[0]["input_ids"] == tok("a? b")["input_ids"] + [tok.eos_token_id]


def test_bad_inputs_raise_clear_errors(tmp_path, tok):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="needs the columns"):
        SFTTrainer(
            model=model,
            args=_config(tmp_path),
            processing_class=tok,
            train_dataset=datasets.Dataset.from_list([{"body": "x"}]),
        )
    with pytest.raises(ValueError, match="empty"):
        SFTTrainer(
            model=model, args=_config(tmp_path), processing_class=tok, train_dataset=_text_ds().select([])
        )
    with pytest.raises(ValueError, match="fewer tokens than one packed block"):
        SFTTrainer(
            model=model,
            args=_config(tmp_path, packing=True, max_seq_length=512),
            processing_class=tok,
            train_dataset=_text_ds(),
        )
    with pytest.raises(ValueError, match="cannot be combined with packing"):
        _config(tmp_path, packing=True, completion_only_loss=True)
    with pytest.raises(ValueError, match="max_steps"):
        _config(tmp_path, packing=True, infinite=True, max_steps=-1)


def test_infinite_packing_and_plain_training_arguments(tmp_path, tok):
    from transformers import TrainingArguments

    from rlhfkit.data.packing import ConstantLengthDataset

    args = TrainingArguments(
        output_dir=str(tmp_path / "o"),
        use_cpu=True,
        report_to="none",
        max_steps=3,
        per_device_train_batch_size=2,
        save_strategy="no",
    )
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=args,
        train_dataset=_text_ds(),
        processing_class=tok,
        packing=True,
        infinite=True,
        max_seq_length=16,
    )
    assert isinstance(trainer.args, SFTConfig) and trainer.args.max_steps == 3  # upgraded, values kept
    assert isinstance(trainer.train_dataset, ConstantLengthDataset)
    trainer.train()  # 3 steps x 2 blocks = 6 blocks > one pass over the data (4 blocks): it cycles
    assert trainer.state.global_step == 3


def test_a_keyword_of_another_trainer_is_refused_by_name(tmp_path, tok):
    # max_length is DPO's and the reward trainer's keyword; SFT's is max_seq_length.
    # Refused before any data work.
    with pytest.raises(TypeError, match="max_length"):
        SFTTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path),
            train_dataset=_text_ds(),
            processing_class=tok,
            max_length=16,
        )
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path),
        train_dataset=_text_ds(),
        processing_class=tok,
        max_seq_length=16,
        dataset_batch_size=2,
    )
    assert (trainer.args.max_seq_length, trainer.args.dataset_batch_size) == (16, 2)
    assert max(len(row["input_ids"]) for row in trainer.train_dataset) <= 16


def test_trl1_names_max_length_pad_and_eos_tokens(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    bos, eos = tok.bos_token, tok.eos_token
    config = few_step_args(SFTConfig, tmp_path / "out", per_device_train_batch_size=2, max_length=12,
                           eos_token=bos, pad_token=eos)  # fmt: skip
    assert config.max_seq_length == 12
    model = tiny_model("llama")
    trainer = SFTTrainer(model=model, args=config, train_dataset=_text_ds(), processing_class=tok)
    ids = trainer.train_dataset["input_ids"]
    assert max(len(row) for row in ids) <= 12
    short = [row for row in ids if len(row) < 12]  # rows that were not cut end with the chosen eos token
    assert short and all(row[-1] == tok.convert_tokens_to_ids(bos) for row in short)
    assert trainer.processing_class.pad_token == eos
    with pytest.raises(ValueError, match="name one setting"):
        few_step_args(SFTConfig, tmp_path / "out", max_length=6, max_seq_length=8)
    with pytest.raises(ValueError, match="eos_token='<nope>' is not in the tokenizer's vocabulary"):
        SFTTrainer(model=model, train_dataset=_text_ds(), processing_class=tiny_tokenizer(),
                   args=few_step_args(SFTConfig, tmp_path / "out", eos_token="<nope>"))  # fmt: skip


def test_skip_prepare_dataset_uses_the_tokenised_rows_as_given(tmp_path, tok):
    rows = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7, 8], [9, 10, 11]]})
    config = _config(tmp_path, dataset_kwargs={"skip_prepare_dataset": True}, max_steps=1)
    trainer = SFTTrainer(model=tiny_model("llama"), args=config, train_dataset=rows, processing_class=tok)
    assert trainer.train_dataset["input_ids"] == [[5, 6, 7, 8], [9, 10, 11]]
    trainer.train()
    assert trainer.state.global_step == 1


def test_dft_loss_weights_each_token_by_its_probability(tmp_path, tok):
    model = tiny_model("llama").eval()
    rows = [{"prompt": "Q: hi ", "completion": "fine thanks"}, {"prompt": "Q: name ", "completion": "bob"}]
    trainer = SFTTrainer(
        model=model,
        args=_config(tmp_path, completion_only_loss=True, loss_type="dft"),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tok,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    loss = trainer.compute_loss(model, batch)
    # by hand: -p log p of every completion token, averaged over them
    total, count = 0.0, 0
    with torch.no_grad():
        for row in trainer.train_dataset:
            logp = F.log_softmax(model(input_ids=torch.tensor([row["input_ids"]])).logits[0], -1)
            for t in range(1, len(row["input_ids"])):
                if row["labels"][t] != -100:  # a completion token
                    lp = logp[t - 1, row["input_ids"][t]].item()
                    total -= math.exp(lp) * lp
                    count += 1
    assert loss.item() == pytest.approx(total / count, rel=1e-4)
    loss.backward()  # the weight p is a constant of the backward pass
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="loss_type must be 'nll' or 'dft'"):
        _config(tmp_path, loss_type="dpo")
