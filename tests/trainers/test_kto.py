"""KTOTrainer: data preparation, the loss against the core maths, learning, the reference, bad inputs."""

from __future__ import annotations

import logging
import random

import datasets
import pytest
import torch

from rlhfkit.core.kto import kto_loss
from rlhfkit.data.unpaired import DataCollatorForUnpairedPreference, prepare_kto_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.kto import KTOConfig, KTOTrainer

WORDS = ["the", "movie", "was", "plot", "actors", "music", "story", "film"]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _config(tmp_path, **kw):
    return few_step_args(KTOConfig, tmp_path / "out", **{"max_length": 64, **kw})


def _unpaired(n, seed=0, labels=None):
    """Learnable labels: 'yes good' completions are desirable, 'no bad' ones undesirable, alternating."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        good = labels[i] if labels is not None else i % 2 == 0
        prompt = " ".join(rng.choices(WORDS, k=3)) + ": "
        rows.append({"prompt": prompt, "completion": "yes good" if good else "no bad", "label": good})
    return datasets.Dataset.from_list(rows)


# --- data ------------------------------------------------------------------------------------------------


def test_paired_rows_are_unpaired_and_kl_completions_rotate_within_blocks(tok):
    pairs = datasets.Dataset.from_list(
        [{"prompt": f"q{i} ", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)]
    )
    data = prepare_kto_dataset(pairs, tok, max_length=64, kl_block_size=2)
    assert len(data) == 6
    assert data["label"] == [True, True, True, False, False, False]  # chosen block, then rejected block
    completions = data["completion_ids"]
    # one tokenisation of prompt + completion, split where it leaves the prompt's own tokens: the
    # prompt's trailing space joins the completion's first word, as in the whole text
    whole = tok("q0 good 0" + tok.eos_token)["input_ids"]
    assert data["prompt_ids"][0] + completions[0] == whole
    assert tok.decode(completions[0]) == " good 0" + tok.eos_token
    assert data["prompt_ids"][3] == data["prompt_ids"][0]  # the rejected row of pair 0 keeps its prompt
    # blocks of 2 rows: (0, 1) -> KL completions (1, 0); (2, 3) -> (3, 2); (4, 5) -> (5, 4)
    assert data["KL_completion_ids"] == [completions[i] for i in (1, 0, 3, 2, 5, 4)]


def test_conversational_rows_and_implicit_prompt(tok):
    chat = datasets.Dataset.from_list(
        [
            {
                "chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "good day"}],
                "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "go away"}],
            }
        ]
        * 2
    )
    data = prepare_kto_dataset(chat, tok, max_length=None, kl_block_size=None)
    assert data["label"] == [True, True, False, False] and "KL_completion_ids" not in data.column_names
    prompt_text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert data["prompt_ids"][0] == tok(prompt_text, add_special_tokens=False)["input_ids"]
    assert tok.decode(data["completion_ids"][0]).startswith("good day")


def test_streaming_dataset_is_refused_by_name(tok):
    stream = _unpaired(4).to_iterable_dataset()
    with pytest.raises(ValueError, match="`train_dataset` must be a map-style datasets.Dataset"):
        prepare_kto_dataset(stream, tok, max_length=64, kl_block_size=2)


def test_rows_whose_prompt_fills_max_length_are_dropped(tok, caplog):
    rows = _unpaired(4).to_list()
    rows[1]["prompt"] = " ".join(["movie"] * 40)
    with caplog.at_level(logging.WARNING):
        data = prepare_kto_dataset(datasets.Dataset.from_list(rows), tok, max_length=16, kl_block_size=None)
    assert len(data) == 3 and "dropped 1 rows" in caplog.text


def test_collator_joins_pads_and_truncates():
    collate = DataCollatorForUnpairedPreference(pad_token_id=0, max_length=4)
    batch = collate(
        [
            {"prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "KL_completion_ids": [6], "label": True},
            {"prompt_ids": [7], "completion_ids": [8], "KL_completion_ids": [4, 5], "label": False},
        ]
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4], [7, 8, 0, 0]]  # cut to 4 from the right
    assert batch["completion_mask"].tolist() == [[0, 0, 0, 1], [0, 1, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["KL_input_ids"].tolist() == [[1, 2, 3, 6], [7, 4, 5, 0]]
    assert batch["label"].tolist() == [True, False]


# --- the loss ----------------------------------------------------------------------------------------------


def test_step_loss_matches_core_maths_from_separate_forwards(tmp_path, tok):
    trainer = KTOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, beta=0.3),
        train_dataset=_unpaired(4),
        processing_class=tok,
    )
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.model.eval()
    loss, metrics, rewards = trainer._loss_metrics_rewards(trainer.model, batch, "train")

    def summed_logps(model, prefix):
        # a naive per-row forward: the completion tokens' log-probs, summed
        out = []
        for ids, mask, keep in zip(
            batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"], batch[f"{prefix}completion_mask"]
        ):
            n = int(mask.sum())
            logits = model(input_ids=ids[None, :n]).logits[0, :-1]
            logps = logits.log_softmax(-1).gather(1, ids[1:n, None])[:, 0]
            out.append((logps * keep[1:n]).sum())
        return torch.stack(out)

    with torch.no_grad():
        policy, kl_policy = summed_logps(trainer.model, ""), summed_logps(trainer.model, "KL_")
        ref, kl_ref = summed_logps(trainer.ref_model, ""), summed_logps(trainer.ref_model, "KL_")
    z = (kl_policy - kl_ref).mean().clamp(min=0)
    expected, expected_rewards = kto_loss(policy, ref, batch["label"], z, beta=0.3)
    assert loss.item() == pytest.approx(expected.mean().item(), abs=1e-5)
    assert torch.allclose(rewards, expected_rewards, atol=1e-5)
    assert metrics["kl"] == pytest.approx(z.item(), abs=1e-6)
    # at the start policy == reference: every reward and z is 0, every loss 1 - sigmoid(0) = 0.5
    assert loss.item() == pytest.approx(0.5, abs=1e-5)


def test_learning_raises_desirable_and_lowers_undesirable_logps(tmp_path, tok):
    data = _unpaired(16)
    trainer = KTOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, max_steps=8, learning_rate=2e-3, beta=0.5, per_device_train_batch_size=8),
        train_dataset=data,
        eval_dataset=data,
        processing_class=tok,
    )
    frozen = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert (
        after["eval_rewards/chosen"] > 0 > after["eval_rewards/rejected"]
    )  # beta * log(pi / ref) moved apart
    assert after["eval_logps/chosen"] > before["eval_logps/chosen"]
    assert after["eval_logps/rejected"] < before["eval_logps/rejected"]
    assert after["eval_loss"] < before["eval_loss"]
    logged = [h for h in trainer.state.log_history if "rewards/margins" in h]
    assert logged and {"kl", "logps/chosen", "logits/rejected", "num_tokens"} <= set(logged[-1])
    # the reference did not move
    for name, value in trainer.ref_model.state_dict().items():
        assert torch.equal(value, frozen[name]), name


def test_apo_zero_unpaired_and_precomputed_reference_train_without_kl_rows(tmp_path, tok):
    trainer = KTOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, loss_type="apo_zero_unpaired", precompute_ref_log_probs=True, max_steps=3),
        train_dataset=_unpaired(8),
        processing_class=tok,
    )
    assert "KL_completion_ids" not in trainer.train_dataset.column_names
    trainer.train()
    assert (
        "ref_logps" in trainer.train_dataset.column_names
        and "ref_KL_logps" not in trainer.train_dataset.column_names
    )
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert all(h["kl"] == 0.0 for h in trainer.state.log_history if "kl" in h)


def test_peft_policy_reference_is_the_base_and_only_adapters_train(tmp_path, tok):
    from peft import LoraConfig

    trainer = KTOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path),
        train_dataset=_unpaired(8),
        processing_class=tok,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    assert trainer.ref_model is None and trainer.reference.kind == "base"
    base = {n: p.clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    lora_b = {n: p.clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    params = dict(trainer.model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in base.items())
    assert any(not torch.equal(params[n], v) for n, v in lora_b.items())


# --- bad inputs -------------------------------------------------------------------------------------------


def test_all_desirable_data_trains_with_a_warning(tmp_path, tok, caplog):
    with caplog.at_level(logging.WARNING):
        trainer = KTOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path),
            train_dataset=_unpaired(8, labels=[True] * 8),
            processing_class=tok,
        )
    assert "every row of train_dataset is desirable" in caplog.text
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/chosen" in h]
    assert logged and not any("rewards/rejected" in h for h in trainer.state.log_history)


def test_unbalanced_weights_warn_with_the_recommended_range(tmp_path, tok, caplog):
    with caplog.at_level(logging.WARNING):
        KTOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path),
            train_dataset=_unpaired(8, labels=[True, False, False, False] * 2),
            processing_class=tok,
        )
    assert "desirable_weight in [3.0, 4.0]" in caplog.text


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [{"prompt": "a", "completion": "b"}],
            "has completions but no 'label' column",
        ),
        (
            [{"prompt": "a", "completion": "b", "label": "yes"}],
            "'label' column of `train_dataset` must hold booleans",
        ),
        ([{"chosen": "b", "rejected": "c"}], "without a 'prompt' column must hold chats"),
    ],
)
def test_bad_data_is_named(tmp_path, tok, rows, message):
    with pytest.raises(ValueError, match=message):
        KTOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path),
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=tok,
        )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"loss_type": "sigmoid"}, r"loss_type must be one of \['apo_zero_unpaired', 'kto'\], got 'sigmoid'"),
        ({"beta": 0.0}, "beta must be > 0"),
        ({"desirable_weight": -1.0}, "desirable_weight must be > 0"),
        ({"per_device_train_batch_size": 1}, "per_device_train_batch_size must be at least 2"),
        ({"train_sampling_strategy": "random"}, "train_sampling_strategy must be 'sequential'"),
        ({"sync_ref_model": True, "precompute_ref_log_probs": True}, "exclude each other"),
        ({"max_length": 0}, "max_length must be a positive integer"),
    ],
)
def test_config_errors_name_the_field(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **fields)


def test_apo_zero_unpaired_allows_random_order_and_batch_of_one(tmp_path):
    config = _config(
        tmp_path,
        loss_type="apo_zero_unpaired",
        train_sampling_strategy="random",
        per_device_train_batch_size=1,
    )
    assert config.train_sampling_strategy == "random"


def test_tokenizer_without_pad_and_eos_is_named(tmp_path):
    tok = tiny_tokenizer()
    tok.pad_token, tok.eos_token = None, None
    with pytest.raises(ValueError, match="the tokenizer has neither a pad nor an eos token"):
        KTOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path),
            train_dataset=_unpaired(4),
            processing_class=tok,
        )


def test_ref_model_must_not_be_the_policy(tmp_path, tok):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="`ref_model` must not be the policy itself"):
        KTOTrainer(
            model=model,
            ref_model=model,
            args=_config(tmp_path),
            train_dataset=_unpaired(4),
            processing_class=tok,
        )


# --- reference options, evaluation, the chunked path ---------------------------------------------------


def test_sync_ref_model_mixes_the_reference_toward_the_policy(tmp_path, tok):
    trainer = KTOTrainer(
        model=tiny_model("llama"),
        ref_model=tiny_model("llama"),
        args=_config(
            tmp_path, max_steps=1, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.25
        ),
        train_dataset=_unpaired(4),
        processing_class=tok,
    )
    start = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    policy = dict(trainer.model.named_parameters())
    moved = 0
    for name, ref_param in trainer.ref_model.named_parameters():
        expected = 0.25 * policy[name].detach() + 0.75 * start[name]  # ref <- alpha policy + (1 - alpha) ref
        assert torch.allclose(ref_param, expected, atol=1e-6), name
        moved += not torch.equal(ref_param, start[name])
    assert moved  # the policy took a step, so the reference followed


def test_sync_ref_model_needs_a_separate_reference(tmp_path, tok):
    from peft import LoraConfig

    with pytest.raises(ValueError, match="sync_ref_model needs a separate reference model"):
        KTOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path, sync_ref_model=True),
            train_dataset=_unpaired(4),
            processing_class=tok,
            peft_config=LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"),
        )


def _first_step_log(tmp_path, tok, **fields):
    trainer = KTOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, **fields),
        train_dataset=_unpaired(8),
        processing_class=tok,
    )
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h], trainer


def test_precomputed_reference_gives_the_same_steps(tmp_path, tok):
    live, _ = _first_step_log(tmp_path / "live", tok)
    precomputed, trainer = _first_step_log(
        tmp_path / "pre", tok, precompute_ref_log_probs=True, precompute_ref_batch_size=3
    )
    assert {"ref_logps", "ref_KL_logps"} <= set(trainer.train_dataset.column_names)
    for a, b in zip(live, precomputed, strict=True):
        for key in ("loss", "kl", "rewards/chosen", "rewards/rejected"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key


def test_chunked_head_gives_the_same_loss(tmp_path, tok, chunk_calls):
    # chunk_calls routes every forward through the chunked lm-head path; compare with full logits
    from rlhfkit.rollout import scoring

    trainer = KTOTrainer(
        model=tiny_model("llama"),
        ref_model=tiny_model("llama"),
        args=_config(tmp_path),
        train_dataset=_unpaired(4),
        processing_class=tok,
    )
    with torch.no_grad():
        for p in trainer.ref_model.parameters():
            p.mul_(0.9)  # a reference unlike the policy: non-zero rewards and z
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    chunked_loss, chunked_metrics, _ = trainer._loss_metrics_rewards(trainer.model, batch, "train")
    assert chunk_calls  # the chunked path ran
    scoring.CHUNKED_HEAD_MIN_LOGITS = 10**12  # monkeypatched by the fixture, restored after the test
    full_loss, full_metrics, _ = trainer._loss_metrics_rewards(trainer.model, batch, "train")
    assert chunked_loss.item() == pytest.approx(full_loss.item(), abs=1e-5)
    for key in ("kl", "rewards/chosen", "logps/rejected", "logits/chosen"):
        assert chunked_metrics[key] == pytest.approx(full_metrics[key], abs=1e-4), key


def test_evaluate_takes_a_raw_dataset_and_compute_metrics_gets_rewards_and_labels(tmp_path, tok):
    seen = {}

    def compute_metrics(prediction):
        seen["rewards"], seen["labels"] = prediction.predictions, prediction.label_ids
        return {"rows": len(prediction.label_ids)}

    trainer = KTOTrainer(
        model=tiny_model("llama"), args=_config(tmp_path), train_dataset=_unpaired(4), processing_class=tok,
        compute_metrics=compute_metrics,
    )  # fmt: skip
    metrics = trainer.evaluate(_unpaired(6, seed=3))
    assert metrics["eval_rows"] == 6 and "eval_kl" in metrics
    assert seen["labels"].tolist() == [1.0, 0.0] * 3 and seen["rewards"].shape == (6,)


def test_config_defaults_are_trl_1x_and_parse_from_flags(tmp_path):
    from transformers import HfArgumentParser

    (config,) = HfArgumentParser(KTOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--report_to", "none", "--loss_type", "apo_zero_unpaired",
         "--desirable_weight", "1.33", "--precompute_ref_log_probs"]
    )  # fmt: skip
    assert (config.loss_type, config.desirable_weight, config.precompute_ref_log_probs) == (
        "apo_zero_unpaired", 1.33, True,
    )  # fmt: skip
    default = KTOConfig(output_dir=str(tmp_path), report_to="none")
    assert (default.beta, default.loss_type, default.max_length, default.learning_rate) == (
        0.1,
        "kto",
        1024,
        1e-6,
    )
    assert (default.logging_steps, default.train_sampling_strategy, default.disable_dropout) == (
        10,
        "sequential",
        True,
    )
    assert (default.desirable_weight, default.undesirable_weight, default.ref_model_sync_steps) == (
        1.0,
        1.0,
        512,
    )
