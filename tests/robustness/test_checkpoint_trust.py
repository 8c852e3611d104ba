"""A checkpoint folder without its manifest is refused on every resume path (its files cannot be checked),
unless the caller passes `trust_unverified_checkpoint=True`; then it loads with a warning. A file the
manifest lists (the optimizer, the random state) missing is named."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file
from workers.hf_fixtures import build

from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.common.checkpointing import (
    MANIFEST_FILE,
    CheckpointError,
    checkpoint_to_resume,
    latest_checkpoint,
    load_training_checkpoint,
    resolve_checkpoint,
    save_training_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)

UNVERIFIED = r"no manifest\.json.*trust_unverified_checkpoint=True"


def _save(root, step):
    def write(folder):
        save_file({"w": torch.full((8,), float(step))}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))

    return write_checkpoint(root / f"checkpoint-{step}", write, step)


def test_a_folder_without_manifest_is_refused_unless_trusted(tmp_path):
    _save(tmp_path, 1)
    bare = _save(tmp_path, 2)
    (bare / MANIFEST_FILE).unlink()
    resume = lambda path, **kw: checkpoint_to_resume(tmp_path, str(path), **kw)  # noqa: E731
    for check in (verify_checkpoint, resolve_checkpoint, resume):
        with pytest.raises(CheckpointError, match=rf"{bare.name}'.*{UNVERIFIED}"):
            check(bare)
        with pytest.warns(UserWarning, match=rf"unverified checkpoint .*{bare.name}"):
            assert check(bare, trust_unverified_checkpoint=True) == bare
    # the newest intact one is taken when the newest has no manifest; trusted, the newest
    with pytest.warns(UserWarning, match=rf"skipping damaged checkpoint .*{bare.name}.*no manifest"):
        assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    with pytest.warns(UserWarning, match="unverified checkpoint"):
        assert checkpoint_to_resume(tmp_path, True, trust_unverified_checkpoint=True) == bare
    # a trusted folder still gets the parse checks
    (bare / "model.safetensors").write_bytes(b"garbage")
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="corrupt or truncated"):
        verify_checkpoint(bare, trust_unverified_checkpoint=True)


def test_training_checkpoint_without_manifest(tmp_path):
    """PPO's and DDPO's `load_training_checkpoint`."""
    folder = save_training_checkpoint(tmp_path / "checkpoint-1", 1, {"w": torch.ones(4)}, {})
    (folder / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match=UNVERIFIED):
        load_training_checkpoint(folder, {})
    with pytest.warns(UserWarning, match="unverified checkpoint"):
        loaded, state = load_training_checkpoint(folder, {}, trust_unverified_checkpoint=True)
    assert loaded == folder and state["step"] == 1


def test_hf_trainer_refuses_garbage_weights_without_manifest(tmp_path):
    kw = dict(per_device=2, max_steps=2, save_strategy="steps", save_steps=2)
    build("sft", str(tmp_path / "run"), **kw).train()
    folder = tmp_path / "run" / "checkpoint-2"
    (folder / MANIFEST_FILE).unlink()
    resumed = build("sft", str(tmp_path / "run"), **{**kw, "max_steps": 3})
    with pytest.raises(CheckpointError, match=rf"checkpoint-2'.*{UNVERIFIED}"):
        resumed.train(resume_from_checkpoint=str(folder))
    assert resumed.state.global_step == 0
    with pytest.warns(UserWarning, match="unverified checkpoint"):
        resumed.train(resume_from_checkpoint=str(folder), trust_unverified_checkpoint=True)
    assert resumed.state.global_step == 3


@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pth", "scheduler.pt"])
def test_a_missing_optimizer_or_rng_file_is_named(tmp_path, name):
    kw = dict(per_device=2, max_steps=2, save_strategy="steps", save_steps=2)
    build("sft", str(tmp_path / "run"), **kw).train()
    folder = tmp_path / "run" / "checkpoint-2"
    assert name in json.loads((folder / MANIFEST_FILE).read_text())["files"]
    (folder / name).unlink()
    resumed = build("sft", str(tmp_path / "run"), **{**kw, "max_steps": 3})
    with pytest.raises(CheckpointError, match=rf"{name}' is missing \(listed in manifest\.json\)"):
        resumed.train(resume_from_checkpoint=str(folder))
    with pytest.raises(CheckpointError, match=rf"{name}' is missing"):  # trusting does not skip the manifest
        resumed.train(resume_from_checkpoint=str(folder), trust_unverified_checkpoint=True)


def test_online_trainer_refuses_then_trusts(tmp_path):
    """GRPO (the online loop: GRPO, RLOO): garbage weights without a manifest never reach the sampler."""
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    def trainer(out, steps):
        args = GRPOConfig(
            output_dir=str(out), report_to="none", use_cpu=True, per_device_train_batch_size=8,
            num_generations=4, max_completion_length=4, max_steps=steps, save_strategy="steps",
            save_steps=1, disable_tqdm=True, seed=3, learning_rate=1e-3, beta=0.0,
        )  # fmt: skip
        return GRPOTrainer(
            tiny_model("llama"), lambda completions, **kw: [float(len(c)) for c in completions], args=args,
            train_dataset=toy_prompt_dataset(n=16), processing_class=tiny_tokenizer(padding_side="left"),
        )  # fmt: skip

    trainer(tmp_path / "run", 1).train()
    folder = tmp_path / "run" / "checkpoint-1"
    copy = tmp_path / "copy" / "checkpoint-1"
    shutil.copytree(folder, copy)
    (copy / MANIFEST_FILE).unlink()
    resumed = trainer(tmp_path / "resumed", 2)
    with pytest.raises(CheckpointError, match=rf"checkpoint-1'.*{UNVERIFIED}"):
        resumed.train(resume_from_checkpoint=str(copy))
    with pytest.warns(UserWarning, match="unverified checkpoint"):
        resumed.train(resume_from_checkpoint=str(copy), trust_unverified_checkpoint=True)
    assert resumed.state.global_step == 2
