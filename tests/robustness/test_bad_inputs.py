"""The bad-input catalogue (docs/bad_inputs.md): each bad input to a public entry point or command fails
early with an error that names the argument and says what was expected."""

from __future__ import annotations

import copy
import json

import datasets
import pytest
import torch

from rlhfkit import core
from rlhfkit.testing import tiny_model, tiny_tokenizer, tiny_value_head_model
from rlhfkit.trainers.common.checkpointing import latest_checkpoint, validate_checkpoint
from rlhfkit.trainers.common.config import exact_div


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="left")


def _pairs(n=4):
    return datasets.Dataset.from_list([{"prompt": "a b ", "chosen": "good", "rejected": "bad"}] * n)


def _prompts(texts):
    return datasets.Dataset.from_dict({"prompt": texts})


# ------------------------------------------------------------------ core functions and plumbing

CORE_CASES = [
    ("mismatched lengths", lambda: core.dpo_loss(*(torch.zeros(n) for n in (2, 2, 3, 2))), ValueError,
     r"shape"),
    ("unknown loss type", lambda: core.dpo_loss(*(torch.zeros(2),) * 4, loss_type="x"), ValueError,
     "loss_type"),
    ("non-positive beta", lambda: core.dpo_loss(*(torch.zeros(2),) * 4, beta=0), ValueError,
     "beta must be > 0"),
    ("k does not divide", lambda: core.rloo_advantages(torch.zeros(5), 2), ValueError,
     "not divisible by rloo_k"),
    ("k below 2", lambda: core.rloo_advantages(torch.zeros(4), 1), ValueError, "rloo_k must be >= 2"),
    ("unknown KL kind", lambda: core.kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "x"), ValueError,
     "KL kind"),
    ("mask shape", lambda: core.masked_mean(torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool)),
     ValueError, "mask shape"),
    ("GAE shapes", lambda: core.compute_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1, 1),
     ValueError, "same"),
    ("empty response", lambda: core.compute_token_rewards(
        torch.zeros(2), torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.bool), 0.1),
     ValueError, "length >= 1"),
    ("zero divisor", lambda: exact_div(8, 0, "num_mini_batches"), ValueError,
     "num_mini_batches must be a positive"),
    ("non-divisible batch", lambda: exact_div(6, 4, "batch_size"), ValueError, "6 is not divisible by 4"),
]  # fmt: skip


@pytest.mark.parametrize("call, error, match", [c[1:] for c in CORE_CASES], ids=[c[0] for c in CORE_CASES])
def test_core(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------------------------ configs


def _cfg(name, **kw):
    import importlib

    module = {
        "RLOOConfig": "rloo.config",
        "RewardConfig": "reward_model.config",
        "SFTConfig": "sft.config",
        "DPOConfig": "dpo.config",
        "KTOConfig": "kto.config",
    }[name]
    cls = getattr(importlib.import_module(f"rlhfkit.trainers.{module}"), name)
    return cls(output_dir="unused", report_to="none", use_cpu=True, **kw)


CONFIG_CASES = [
    ("RLOOConfig", {"rloo_k": 1}, ValueError, "rloo_k must be >= 2"),
    ("RLOOConfig", {"cliprange": "0.2"}, TypeError, r"RLOOConfig.cliprange must be float, got str"),
    ("RLOOConfig", {"num_mini_batches": 0}, ValueError, "num_mini_batches must be a positive integer"),
    ("RLOOConfig", {"per_device_train_batch_size": 3}, ValueError, "must be a multiple of rloo_k"),
    ("RLOOConfig", {"max_consecutive_nonfinite_steps": 0}, ValueError, "max_consecutive_nonfinite_steps"),
    ("RewardConfig", {"max_length": 1}, ValueError, "max_length must be >= 2"),
    ("RewardConfig", {"max_length": "64"}, TypeError, "RewardConfig.max_length must be int or None"),
    ("SFTConfig", {"num_of_sequences": 0}, ValueError, "num_of_sequences must be >= 1"),
    ("SFTConfig", {"packing": "yes"}, TypeError, "SFTConfig.packing must be bool"),
    ("DPOConfig", {"beta": 0.0}, ValueError, "beta must be > 0"),
    ("DPOConfig", {"loss_type": "nope"}, ValueError, "loss_type must be one of"),
    ("DPOConfig", {"max_length": 8, "max_prompt_length": 16}, ValueError, "max_prompt_length"),
    ("KTOConfig", {"per_device_train_batch_size": 1}, ValueError, "per_device_train_batch_size must be at"),
    ("KTOConfig", {"train_sampling_strategy": "random"}, ValueError, "train_sampling_strategy must be 'seq"),
]


@pytest.mark.parametrize("name, kwargs, error, match", CONFIG_CASES, ids=lambda v: str(v)[:40])
def test_config(name, kwargs, error, match):
    with pytest.raises(error, match=match):
        _cfg(name, **kwargs)


# ------------------------------------------------------------------ trainers


def _rloo(tok, out, dataset=None, policy=None, reward=None, tokenizer=None, **kw):
    from rlhfkit.rewards import KeywordReward
    from rlhfkit.trainers.rloo.config import RLOOConfig
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    cfg = dict(output_dir=str(out), report_to="none", use_cpu=True, per_device_train_batch_size=2,
               response_length=4, total_episodes=4, num_sample_generations=0, disable_tqdm=True)  # fmt: skip
    cfg.update(kw)
    return RLOOTrainer(
        RLOOConfig(**cfg),
        tokenizer if tokenizer is not None else tok,
        policy if policy is not None else tiny_model("llama"),
        tiny_model("llama"),
        reward if reward is not None else KeywordReward("e"),
        dataset if dataset is not None else _prompts(["a b c"] * 8),
    )


def _no_pad(tok):
    t = copy.deepcopy(tok)
    t.pad_token = None
    return t


def _no_pad_no_eos(tok):
    t = _no_pad(tok)
    t.eos_token = None
    return t


TRAINER_CASES = [
    ("RLOO config of wrong type", lambda tok, out: __import__("rlhfkit").RLOOTrainer(
        {"lr": 1}, tok, None, None, None, None), TypeError, "config must be an RLOOConfig"),
    ("RLOO policy as a path", lambda tok, out: _rloo(tok, out, policy="some/model"), TypeError,
     "policy must be a loaded model"),
    ("RLOO dataset is a list", lambda tok, out: _rloo(tok, out, dataset=["a", "b"]), TypeError,
     "train_dataset must be a datasets.Dataset"),
    ("RLOO empty dataset", lambda tok, out: _rloo(tok, out, dataset=_prompts([])), ValueError, "empty"),
    ("RLOO missing column", lambda tok, out: _rloo(tok, out, dataset=datasets.Dataset.from_dict(
        {"text": ["a"]})), ValueError, "'prompt' column"),
    ("RLOO prompt longer than context", lambda tok, out: _rloo(tok, out, response_length=600), ValueError,
     "context"),
    ("RLOO batch larger than dataset", lambda tok, out: _rloo(tok, out, dataset=_prompts(["a b"]),
     per_device_train_batch_size=4), ValueError, "one update needs"),
    ("RLOO tokenizer without pad", lambda tok, out: _rloo(tok, out, tokenizer=_no_pad(tok)), ValueError,
     "pad token"),
    ("RLOO reward of wrong type", lambda tok, out: _rloo(tok, out, reward=3), TypeError,
     "reward_model must be"),
    ("Reward zero batch size", lambda tok, out: _reward(tok, out, per_device_train_batch_size=0), ValueError,
     "per_device_train_batch_size must be a positive integer"),
    ("Reward missing columns", lambda tok, out: _reward(tok, out, dataset=datasets.Dataset.from_list(
        [{"chosen": "a"}])), ValueError, r"needs the columns"),
    ("Reward empty dataset", lambda tok, out: _reward(tok, out, dataset=_pairs().select([])), ValueError,
     "is empty"),
    ("Reward model path missing", lambda tok, out: _reward(tok, out, model="/no/such/model"), ValueError,
     "not a local folder"),
    ("SFT missing columns", lambda tok, out: _sft(tok, out, dataset=datasets.Dataset.from_list(
        [{"foo": "a"}])), ValueError, "needs the columns"),
    ("SFT zero accumulation", lambda tok, out: _sft(tok, out, gradient_accumulation_steps=0), ValueError,
     "gradient_accumulation_steps must be a positive integer"),
    ("DPO missing column", lambda tok, out: _dpo(tok, out, dataset=datasets.Dataset.from_list(
        [{"prompt": "a", "chosen": "b"}])), ValueError, "needs the columns"),
    ("SFT tokenizer without pad and eos", lambda tok, out: _sft(_no_pad_no_eos(tok), out), ValueError,
     "neither a pad nor an eos token"),
    ("DPO tokenizer without pad and eos", lambda tok, out: _dpo(_no_pad_no_eos(tok), out), ValueError,
     "neither a pad nor an eos token"),
    ("DPO reference is the policy", lambda tok, out: _dpo(tok, out, same_ref=True), ValueError,
     "must not be the policy"),
    ("KTO missing label", lambda tok, out: _kto(tok, out, rows=[{"prompt": "a", "completion": "b"}]),
     ValueError, "no 'label' column"),
    ("KTO label not boolean", lambda tok, out: _kto(tok, out, rows=[{"prompt": "a", "completion": "b",
                                                                      "label": "yes"}]),
     ValueError, "must hold booleans"),
    ("KTO tokenizer without pad and eos", lambda tok, out: _kto(_no_pad_no_eos(tok), out), ValueError,
     "neither a pad nor an eos token"),
]  # fmt: skip


def _reward(tok, out, dataset=None, model=None, **kw):
    from rlhfkit.trainers.reward_model.config import RewardConfig
    from rlhfkit.trainers.reward_model.trainer import RewardTrainer

    args = RewardConfig(output_dir=str(out), report_to="none", use_cpu=True, max_steps=1, **kw)
    return RewardTrainer(
        model=model if model is not None else tiny_model("llama-reward"),
        args=args,
        train_dataset=dataset if dataset is not None else _pairs(),
        processing_class=tok,
    )


def _sft(tok, out, dataset=None, **kw):
    from rlhfkit.trainers.sft.config import SFTConfig
    from rlhfkit.trainers.sft.trainer import SFTTrainer

    args = SFTConfig(output_dir=str(out), report_to="none", use_cpu=True, max_steps=1, **kw)
    dataset = dataset if dataset is not None else datasets.Dataset.from_list([{"text": "a b"}] * 4)
    return SFTTrainer(model=tiny_model("llama"), args=args, train_dataset=dataset, processing_class=tok)


def _dpo(tok, out, dataset=None, same_ref=False, **kw):
    from rlhfkit.trainers.dpo.config import DPOConfig
    from rlhfkit.trainers.dpo.trainer import DPOTrainer

    args = DPOConfig(output_dir=str(out), report_to="none", use_cpu=True, max_steps=1, **kw)
    model = tiny_model("llama")
    return DPOTrainer(
        model=model,
        ref_model=model if same_ref else None,
        args=args,
        train_dataset=dataset if dataset is not None else _pairs(),
        processing_class=tok,
    )


def _kto(tok, out, rows=None):
    from rlhfkit.trainers.kto import KTOConfig, KTOTrainer

    args = KTOConfig(output_dir=str(out), report_to="none", use_cpu=True, max_steps=1)
    rows = rows or [{"prompt": "a b", "completion": "c", "label": i % 2 == 0} for i in range(4)]
    train = datasets.Dataset.from_list(rows)
    return KTOTrainer(model=tiny_model("llama"), args=args, train_dataset=train, processing_class=tok)


@pytest.mark.parametrize(
    "build, error, match", [c[1:] for c in TRAINER_CASES], ids=[c[0] for c in TRAINER_CASES]
)
def test_trainer(build, error, match, tok, tmp_path):
    with pytest.raises(error, match=match):
        build(tok, tmp_path)


# ------------------------------------------------------------------ checkpoints


def test_missing_empty_and_corrupt_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        validate_checkpoint(tmp_path / "checkpoint-9")
    (tmp_path / "checkpoint-1").mkdir()
    with pytest.raises(ValueError, match="is empty"):
        validate_checkpoint(tmp_path / "checkpoint-1")
    for name, content in (
        ("trainer_state.json", b'{"global_step": 3'),  # truncated JSON
        ("model.safetensors", b"\x00\x01garbage"),
        ("optimizer.pt", b"PK\x03\x04truncated zip"),
    ):
        folder = tmp_path / f"bad-{name}"
        folder.mkdir()
        (folder / name).write_bytes(content)
        with pytest.raises(ValueError, match=rf"checkpoint file .*{name}' is corrupt or truncated"):
            validate_checkpoint(folder)
    good = tmp_path / "good"
    good.mkdir()
    (good / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    torch.save({"x": torch.zeros(2)}, good / "optimizer.pt")
    assert validate_checkpoint(good) == good
    with pytest.warns(UserWarning, match="skipping damaged checkpoint .*checkpoint-1"):
        assert latest_checkpoint(tmp_path) is None  # the only checkpoint-* folder is empty


def test_trainers_refuse_corrupt_checkpoint_before_loading(tok, tmp_path):
    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"xx")
    rloo = _rloo(tok, tmp_path / "out")
    with pytest.raises(ValueError, match="checkpoint-2' has no manifest.json"):  # nothing can be verified
        rloo.train(resume_from_checkpoint=str(ckpt))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="model.safetensors' is corrupt"):
        rloo.train(resume_from_checkpoint=str(ckpt), trust_unverified_checkpoint=True)
    trainer = _reward(tiny_tokenizer(padding_side="right"), tmp_path / "out2")
    with pytest.raises(ValueError, match="checkpoint-2' has no manifest.json"):
        trainer.train(resume_from_checkpoint=str(ckpt))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="model.safetensors' is corrupt"):
        trainer.train(resume_from_checkpoint=str(ckpt), trust_unverified_checkpoint=True)
    with pytest.raises(ValueError, match="holds no intact checkpoint"):
        trainer.train(resume_from_checkpoint=True)


# ------------------------------------------------------------------ commands


@pytest.mark.parametrize(
    "argv, match",
    [
        (["bogus"], "unknown command 'bogus'"),
        (["rloo", "--dataset_name", "/no/such.jsonl", "--output_dir", "{tmp}"], "is not a local path"),
        (["sft", "--model_name_or_path", "/no/such/model", "--dataset_name", "{data}",
          "--output_dir", "{tmp}"], "not a local folder"),
        (["reward", "--dataset_name", "{data}", "--output_dir", "{tmp}"], "model_name_or_path is required"),
    ],
)  # fmt: skip
def test_command(argv, match, tmp_path, capsys):
    from rlhfkit.cli import main

    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n")
    argv = [a.format(tmp=tmp_path / "out", data=data) for a in argv]
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_command_config_file_errors(tmp_path):
    from rlhfkit.cli import main

    with pytest.raises(SystemExit, match="does not exist"):
        main(["dpo", "--config", str(tmp_path / "missing.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("not_a_flag: 3\n")
    with pytest.raises(SystemExit, match="unknown keys .*not_a_flag"):
        main(["dpo", "--config", str(bad)])


def test_ppo_and_ddpo_refuse_corrupt_checkpoints(tmp_path):

    from rlhfkit import PPOConfig, PPOTrainer

    ppo_ckpt = tmp_path / "ppo"
    ppo_ckpt.mkdir()
    (ppo_ckpt / "model.safetensors").write_bytes(b"\x10\x00")
    (ppo_ckpt / "trainer_state.json").write_bytes(b"{")
    model = tiny_value_head_model("llama")
    trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=2), model, tokenizer=tiny_tokenizer())
    with pytest.raises(ValueError, match="ppo' has no manifest.json"):
        trainer.load_checkpoint(str(ppo_ckpt))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="model.safetensors' is corrupt"):
        trainer.load_checkpoint(str(ppo_ckpt), trust_unverified_checkpoint=True)

    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
    from rlhfkit.testing.diffusion import tiny_sd_pipeline_path
    from rlhfkit.trainers.ddpo.config import DDPOConfig
    from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

    ddpo_ckpt = tmp_path / "ddpo" / "checkpoint-1"
    ddpo_ckpt.mkdir(parents=True)
    (ddpo_ckpt / "trainer_state.json").write_text('{"epoch": 0')
    config = DDPOConfig(
        mixed_precision="no",
        logdir=str(tmp_path / "logs"),
        resume_from=str(tmp_path / "ddpo"),
        sample_batch_size=2,
        train_batch_size=2,
        sample_num_batches_per_epoch=1,
    )
    pipe = DefaultDDPOStableDiffusionPipeline(str(tiny_sd_pipeline_path()))
    with pytest.raises(ValueError, match="checkpoint-1' has no manifest.json"):
        DDPOTrainer(config, lambda images, prompts, meta: images.mean((1, 2, 3)), lambda: ("a cat", {}), pipe)
