"""`rlhfkit ddpo` end to end through a subprocess, with a tiny budget; the example's reward."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rlhfkit.commands.ddpo import REWARDS, jpeg_size_kb


def _run(args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "rlhfkit", "ddpo", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


@pytest.mark.slow
def test_command_trains_checkpoints_and_saves_lora(tmp_path):
    out = _run(
        [
            "--num_epochs",
            "2",
            "--sample_num_steps",
            "2",
            "--sample_batch_size",
            "2",
            "--sample_num_batches_per_epoch",
            "1",
            "--train_batch_size",
            "2",
            "--mixed_precision",
            "no",
            "--reward",
            "incompressibility",
            "--logdir",
            str(tmp_path / "logs"),
            "--output_dir",
            str(tmp_path / "out"),
            "--log_with",
            "tensorboard",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "epoch 0: mean incompressibility reward" in out.stdout and "epoch 1:" in out.stdout
    assert (tmp_path / "out" / "pytorch_lora_weights.safetensors").is_file()
    assert sorted(p.name for p in (tmp_path / "logs" / "checkpoints").glob("checkpoint*")) == [
        "checkpoint-1",
        "checkpoint-2",
    ]
    assert list((tmp_path / "logs" / "trl").rglob("events.out.tfevents*"))  # tensorboard got the scalars


def test_command_reports_bad_flags_clearly(capsys):
    from rlhfkit.commands.ddpo import main

    assert main(["--reward", "sharpness", "--mixed_precision", "no"]) == 2
    assert "--reward must be one of compressibility" in capsys.readouterr().err
    # checked while parsing, before any model is loaded
    assert (
        main(
            [
                "--sample_batch_size",
                "3",
                "--sample_num_batches_per_epoch",
                "1",
                "--train_batch_size",
                "2",
                "--mixed_precision",
                "no",
            ]
        )
        == 2
    )
    assert "not divisible by 2" in capsys.readouterr().err
    assert main(["--pretrained_model", "/no/such/model", "--mixed_precision", "no"]) == 2
    assert "is not a local folder" in capsys.readouterr().err


def test_jpeg_rewards_rank_flat_images_as_compressible():
    flat = torch.full((1, 3, 32, 32), 0.5)
    noisy = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    sizes = jpeg_size_kb(torch.cat([flat, noisy]))
    assert sizes[0] < sizes[1]  # noise does not compress
    scores, _ = REWARDS["compressibility"](torch.cat([flat, noisy]), ["a", "b"], [{}, {}])
    assert scores[0] > scores[1]
    scores, _ = REWARDS["incompressibility"](torch.cat([flat, noisy]), ["a", "b"], [{}, {}])
    assert scores[1] > scores[0]


@pytest.mark.slow
def test_two_runs_with_one_seed_give_identical_lora_weights(tmp_path):
    # The LoRA A matrices are drawn when the pipeline is built; the command seeds before that. Without it,
    # two runs agree on epoch 0 (LoRA B starts at zero) and then diverge.
    from safetensors.torch import load_file

    from rlhfkit.commands.ddpo import main

    flags = ["--num_epochs", "3", "--sample_num_steps", "2", "--sample_batch_size", "2",
             "--sample_num_batches_per_epoch", "1", "--train_batch_size", "2", "--seed", "0",
             "--mixed_precision", "no"]  # fmt: skip
    for run in ("a", "b"):
        logdir, out = tmp_path / run / "logs", tmp_path / run / "out"
        assert main([*flags, "--logdir", str(logdir), "--output_dir", str(out)]) == 0
    a = load_file(str(tmp_path / "a" / "out" / "pytorch_lora_weights.safetensors"))
    b = load_file(str(tmp_path / "b" / "out" / "pytorch_lora_weights.safetensors"))
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_from_checkpoint_alias_and_the_trust_flag(tmp_path, capsys):
    """`--resume_from_checkpoint` is the other commands' name for `--resume_from`; a checkpoint without
    its manifest needs `--trust_unverified_checkpoint`."""
    from rlhfkit.commands.ddpo import main
    from rlhfkit.trainers.common.checkpoint_manifest import MANIFEST_FILE

    flags = ["--sample_num_steps", "2", "--sample_batch_size", "2", "--sample_num_batches_per_epoch", "1",
             "--train_batch_size", "2", "--mixed_precision", "no",
             "--logdir", str(tmp_path / "logs")]  # fmt: skip
    assert main([*flags, "--num_epochs", "1"]) == 0
    checkpoint = tmp_path / "logs" / "checkpoints" / "checkpoint-1"
    (checkpoint / MANIFEST_FILE).unlink()
    capsys.readouterr()
    resumed = [*flags, "--num_epochs", "2", "--resume_from_checkpoint", str(checkpoint)]
    assert main(resumed) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no manifest.json" in err and "--trust_unverified_checkpoint" in err
    with pytest.warns(UserWarning, match="unverified checkpoint .*checkpoint-1"):
        assert main([*resumed, "--trust_unverified_checkpoint"]) == 0
    out = capsys.readouterr().out
    assert "epoch 1:" in out and "epoch 0:" not in out  # only the epoch after the checkpoint's ran
    assert main([*resumed, "--resume_from", str(tmp_path / "elsewhere")]) == 2
    assert "not two folders" in capsys.readouterr().err
