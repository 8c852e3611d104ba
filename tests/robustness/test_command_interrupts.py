"""An interrupted command does not look like a finished one, and a busy output folder is refused up front.

* SIGINT/SIGTERM: the trainer saves a checkpoint and stops; the command exits 130 (SIGINT) or 143
  (SIGTERM), writes no final model, prints no summary, and prints one line naming the checkpoint and the
  exact `--resume_from_checkpoint` flag.
* Another live run holding the output folder's lock: a one-line error naming the folder and the pid, exit
  2, before any model is loaded; the trainers take the lock when train() starts, whatever save_strategy.
* SIGKILL during or after a checkpoint write of `rlhfkit grpo`, then `--resume_from_checkpoint`: the final
  weights equal an uninterrupted run's bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.commands import grpo, sft
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.trainers.common.checkpointing import LOCK_FILE, CheckpointLockError, latest_checkpoint

GRPO_RUN = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
            "--report_to", "none", "--use_cpu", "--logging_steps", "1", "--disable_tqdm", "true",
            "--dataset_name", "keyword"]  # fmt: skip
SIGNALS = {"SIGINT": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143)}


def _signalling_reward(tmp_path, monkeypatch, module: str, signum: int, at_call: int) -> None:
    """A reward function (importable as `<module>.reward`) that signals this process at its `at_call`-th
    call."""
    (tmp_path / f"{module}.py").write_text(
        "import os\n"
        "CALLS = []\n"
        "def reward(completions, **columns):\n"
        "    CALLS.append(1)\n"
        f"    if len(CALLS) == {at_call}:\n"
        f"        os.kill(os.getpid(), {int(signum)})\n"
        "    return [float('e' in c) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)


def _assert_interrupted(code, captured, out, expected_code, step):
    checkpoint = out / f"checkpoint-{step}"
    assert code == expected_code, captured.err[-3000:]
    assert not (out / "model.safetensors").exists()  # no "final" model for an unfinished run
    assert "\"output_dir\"" not in captured.out  # no JSON summary
    lines = [line for line in captured.err.splitlines() if "--resume_from_checkpoint" in line]
    assert len(lines) == 1, captured.err[-3000:]
    assert lines[0].endswith(f"--resume_from_checkpoint {checkpoint}")
    assert latest_checkpoint(out) == checkpoint


@pytest.mark.parametrize("name", list(SIGNALS))
def test_grpo_command_stopped_by_a_signal_exits_non_zero(name, tmp_path, capsys, monkeypatch):
    signum, expected = SIGNALS[name]
    _signalling_reward(tmp_path, monkeypatch, f"signalling_reward_{name.lower()}", signum, at_call=2)
    out = tmp_path / "out"
    code = grpo.main(["--model_name_or_path", str(tiny_model_path("llama")), "--output_dir", str(out),
                      *GRPO_RUN, "--max_steps", "5", "--save_strategy", "no",
                      "--reward_funcs", f"signalling_reward_{name.lower()}.reward"])  # fmt: skip
    _assert_interrupted(code, capsys.readouterr(), out, expected, step=2)


def test_sft_command_stopped_by_sigterm_exits_143(tmp_path, capsys, monkeypatch):
    from rlhfkit.trainers.sft.trainer import SFTTrainer

    steps = []
    original = SFTTrainer.training_step

    def training_step(self, *args, **kwargs):
        steps.append(1)
        if len(steps) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "training_step", training_step)
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"the cat sat on mat {i}"}) for i in range(8)))
    out = tmp_path / "out"
    code = sft.main(["--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(data),
                     "--output_dir", str(out), "--max_steps", "4", "--per_device_train_batch_size", "2",
                     "--use_cpu", "--report_to", "none", "--disable_tqdm", "true"])  # fmt: skip
    _assert_interrupted(code, capsys.readouterr(), out, 143, step=1)


@pytest.fixture
def busy_folder(tmp_path):
    """An output folder whose lock a live process (not this one) holds: (folder, that pid)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    folder = tmp_path / "busy"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
    yield folder, sleeper.pid
    sleeper.kill()
    sleeper.wait()


@pytest.mark.parametrize("save_strategy", ["no", "steps"])
def test_a_busy_output_folder_is_a_one_line_error_before_loading(busy_folder, save_strategy, capsys,
                                                                  monkeypatch):  # fmt: skip
    folder, pid = busy_folder

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the output folder's lock was taken")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_loading)
    code = grpo.main(["--model_name_or_path", str(tiny_model_path("llama")), "--output_dir", str(folder),
                      *GRPO_RUN, "--max_steps", "2", "--save_strategy", save_strategy])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and str(folder) in err and f"pid {pid}" in err


def test_online_trainers_take_the_lock_when_train_starts(busy_folder):
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    folder, pid = busy_folder
    config = GRPOConfig(output_dir=str(folder), report_to="none", use_cpu=True, per_device_train_batch_size=4,
                        num_generations=2, max_completion_length=4, max_steps=2, save_strategy="no",
                        disable_tqdm=True)  # fmt: skip
    trainer = GRPOTrainer(tiny_model("llama"), lambda completions, **kw: [0.0] * len(completions),
                          args=config, train_dataset=toy_prompt_dataset(n=8),
                          processing_class=tiny_tokenizer(padding_side="left"))  # fmt: skip
    with pytest.raises(CheckpointLockError, match=f"pid {pid}"):
        trainer.train()
    assert trainer.state.global_step == 0


# ------------------------------------------------------------------ SIGKILL, then resume, end to end


def _grpo_cli(out, *extra) -> list[str]:
    return [sys.executable, "-m", "rlhfkit", "grpo", "--model_name_or_path", str(tiny_model_path("llama")),
            "--output_dir", str(out), *GRPO_RUN, "--max_steps", "6", "--save_strategy", "steps",
            "--save_steps", "2", "--learning_rate", "0.01", "--beta", "0.05",
            "--reward_funcs", "kill_test_reward.reward", *extra]  # fmt: skip


KILL_TEST_REWARD = (
    "def reward(completions, **columns):\n    return [float(sum(map(ord, c)) % 7) for c in completions]\n"
)


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def _kill_during_a_checkpoint_write(out) -> subprocess.Popen:
    """Start the run and SIGKILL it as soon as the staging folder of checkpoint-4 appears (mid-write), or,
    if that write was too quick to see, as soon as checkpoint-4 is published."""
    proc = subprocess.Popen(
        _grpo_cli(out), env=_env(), cwd=out.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if any(out.glob(".checkpoint-4.tmp-*")) or (out / "checkpoint-4").exists():
            proc.kill()
            break
        time.sleep(0.002)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-3000:]
    return proc


@pytest.mark.slow
def test_grpo_command_killed_during_a_checkpoint_write_resumes_to_the_same_weights(tmp_path):
    (tmp_path / "kill_test_reward.py").write_text(KILL_TEST_REWARD)  # rewards that vary: the weights move
    full = subprocess.run(_grpo_cli(tmp_path / "full"), env=_env(), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert full.returncode == 0, full.stderr[-3000:]
    assert full.stdout.count("{'reward'") == 6

    cut = tmp_path / "cut"
    _kill_during_a_checkpoint_write(cut)
    assert not (cut / "model.safetensors").exists()
    step = int(latest_checkpoint(cut).name.split("-")[1])
    assert step in (2, 4)

    resumed = subprocess.run(_grpo_cli(cut, "--resume_from_checkpoint", str(cut)), env=_env(), cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("{'reward'") == 6 - step  # continued from the checkpoint, not restarted
    expected = load_file(str(tmp_path / "full" / "model.safetensors"))
    got = load_file(str(cut / "model.safetensors"))
    initial = load_file(str(tiny_model_path("llama") / "model.safetensors"))
    assert expected.keys() == got.keys()
    assert any(not torch.equal(expected[k], initial[k]) for k in expected if k in initial)  # it trained
    for key in expected:  # bit for bit: same seed, same data order, CPU
        assert torch.equal(expected[key], got[key]), key
