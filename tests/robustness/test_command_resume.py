"""Every training command resumes through one path: `--resume_from_checkpoint` is honoured by grpo, sft and
dpo as it is by rloo and ppo; a path that does not exist or holds no intact checkpoint is a one-line error
(exit 2) before anything is loaded; resuming with changed sizes, learning rate or seed warns, and a
max_steps below the checkpoint's step is an error; abbreviated flags are refused."""

from __future__ import annotations

import json
import warnings

import pytest

from rlhfkit.commands import dpo, grpo, ppo, rloo, sft
from rlhfkit.commands._args import ModelArguments, ScriptArguments, parse_args
from rlhfkit.testing import tiny_model_path
from rlhfkit.trainers.common.checkpointing import latest_checkpoint

GRPO_RUN = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
            "--report_to", "none", "--use_cpu", "--logging_steps", "1", "--disable_tqdm", "true",
            "--dataset_name", "keyword"]  # fmt: skip
HF_RUN = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--use_cpu", "--report_to", "none",
          "--disable_tqdm", "true", "--save_strategy", "no"]  # fmt: skip


def _data(tmp_path, name: str) -> str:
    if name == "dpo":
        rows = [{"prompt": f"Q{i}: ", "chosen": "yes good", "rejected": "no bad"} for i in range(8)]
    else:
        rows = [{"text": f"the cat sat on mat number {i}"} for i in range(8)]
    path = tmp_path / f"{name}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def _argv(name: str, tmp_path, out) -> list[str]:
    model = ["--model_name_or_path", str(tiny_model_path("llama")), "--output_dir", str(out)]
    if name == "grpo":
        return [*model, *GRPO_RUN, "--max_steps", "2", "--save_strategy", "no"]
    if name == "rloo":
        return [*model, "--dataset_name", "keyword", "--total_episodes", "8", "--use_cpu", "--report_to",
                "none", "--save_strategy", "no"]  # fmt: skip
    if name == "ppo":
        return ["--output_dir", str(out), "--steps", "1", "--batch_size", "4", "--mini_batch_size", "2"]
    return [*model, "--dataset_name", _data(tmp_path, name), *HF_RUN]


COMMANDS = {"grpo": grpo.main, "sft": sft.main, "dpo": dpo.main, "rloo": rloo.main, "ppo": ppo.main}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_missing_resume_path_is_a_one_line_error_before_training(name, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the resume path was checked")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_loading)
    argv = [*_argv(name, tmp_path, out), "--resume_from_checkpoint", str(tmp_path / "no-such")]
    code = COMMANDS[name](argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "no-such" in err and "does not exist" in err
    assert not (out / "model.safetensors").exists()


@pytest.mark.parametrize("name", ["grpo", "sft"])
def test_a_folder_without_a_checkpoint_is_a_one_line_error(name, tmp_path, capsys):
    empty = tmp_path / "finished-model"  # a folder of files, but no checkpoint
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    code = COMMANDS[name]([*_argv(name, tmp_path, tmp_path / "out"), "--resume_from_checkpoint", str(empty)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "holds no checkpoint" in err, err


def _counting_reward(tmp_path, monkeypatch, module: str) -> list:
    (tmp_path / f"{module}.py").write_text(
        "CALLS = []\n"
        "def reward(completions, **columns):\n"
        "    CALLS.append(len(completions))\n"
        "    return [float('e' in c) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import importlib

    return importlib.import_module(module).CALLS


def test_grpo_command_resumes_from_the_output_folder(tmp_path, capsys, monkeypatch):
    calls = _counting_reward(tmp_path, monkeypatch, "resume_counting_reward")
    out = tmp_path / "out"
    base = ["--model_name_or_path", str(tiny_model_path("llama")), "--output_dir", str(out), *GRPO_RUN,
            "--reward_funcs", "resume_counting_reward.reward", "--save_strategy", "steps",
            "--save_steps", "2"]  # fmt: skip
    assert grpo.main([*base, "--max_steps", "2"]) == 0
    first = len(calls)
    assert latest_checkpoint(out).name == "checkpoint-2"
    capsys.readouterr()
    assert grpo.main([*base, "--max_steps", "3", "--resume_from_checkpoint", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["updates"] == 3
    assert len(calls) - first == first // 2  # one update more, not three from scratch
    assert latest_checkpoint(out).name == "checkpoint-3"  # the last step is saved too
    # `true` means the newest intact checkpoint of --output_dir
    calls.clear()
    assert grpo.main([*base, "--max_steps", "4", "--resume_from_checkpoint", "true"]) == 0
    assert len(calls) == first // 2


def test_resuming_with_changed_settings_warns_and_a_lower_max_steps_is_an_error(tmp_path, capsys,
                                                                                 monkeypatch):  # fmt: skip
    _counting_reward(tmp_path, monkeypatch, "resume_settings_reward")
    out = tmp_path / "out"
    base = ["--model_name_or_path", str(tiny_model_path("llama")), "--output_dir", str(out), *GRPO_RUN,
            "--reward_funcs", "resume_settings_reward.reward", "--save_strategy", "steps",
            "--save_steps", "2"]  # fmt: skip
    assert grpo.main([*base, "--max_steps", "2"]) == 0
    capsys.readouterr()

    code = grpo.main([*base, "--max_steps", "1", "--resume_from_checkpoint", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--max_steps 1" in err and "step 2" in err

    changed = ["--learning_rate", "0.002", "--seed", "7", "--gradient_accumulation_steps", "2",
               "--per_device_train_batch_size", "4"]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert grpo.main([*base, "--max_steps", "3", *changed, "--resume_from_checkpoint", str(out)]) == 0
    messages = [str(w.message) for w in caught]
    for flag, old, new in [("--learning_rate", "1e-06", "0.002"), ("--seed", "42", "7"),
                           ("--gradient_accumulation_steps", "1", "2"),
                           ("--per_device_train_batch_size", "8", "4")]:  # fmt: skip
        found = [m for m in messages if m.startswith(f"resuming with {flag} ")]
        assert len(found) == 1, messages
        assert "\n" not in found[0] and old in found[0] and new in found[0], found[0]


def test_abbreviated_flags_are_refused(tmp_path, capsys):
    from rlhfkit.trainers.grpo.config import GRPOConfig

    with pytest.raises(SystemExit) as exit_info:
        parse_args((ScriptArguments, GRPOConfig, ModelArguments),
                   ["--learning_rat", "0.1", "--output_dir", str(tmp_path)], "rlhfkit grpo", "")  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--learning_rat" in err and "--learning_rate" in err


def _drop_manifest(folder) -> None:
    from rlhfkit.trainers.common.checkpoint_manifest import MANIFEST_FILE

    (folder / MANIFEST_FILE).unlink()


@pytest.mark.parametrize("name", ["sft", "ppo"])
def test_a_checkpoint_without_manifest_needs_the_trust_flag(name, tmp_path, capsys):
    out = tmp_path / "out"
    argv = _argv(name, tmp_path, out)
    if name == "ppo":
        first, resumed = [*argv, "--save_steps", "1"], [*argv[:-6], "--steps", "2", *argv[-4:]]
    else:
        save = ["--save_strategy", "steps", "--save_steps", "2"]
        first, resumed = [*argv[:-2], *save], [*argv[:-2], *save, "--max_steps", "3"]
    assert COMMANDS[name](first) == 0
    checkpoint = latest_checkpoint(out)
    _drop_manifest(checkpoint)
    capsys.readouterr()

    code = COMMANDS[name]([*resumed, "--resume_from_checkpoint", str(checkpoint)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "no manifest.json" in err and "--trust_unverified_checkpoint" in err

    with pytest.warns(UserWarning, match=rf"unverified checkpoint .*{checkpoint.name}"):
        code = COMMANDS[name]([*resumed, "--resume_from_checkpoint", str(checkpoint),
                               "--trust_unverified_checkpoint"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    if name == "ppo":
        assert summary["steps"] == 2  # one step more than the checkpoint's
    else:
        assert latest_checkpoint(out).name == "checkpoint-3"


def test_ppo_command_warns_when_resumed_with_changed_settings(tmp_path, capsys):
    out = tmp_path / "out"
    argv = _argv("ppo", tmp_path, out)
    assert ppo.main([*argv, "--save_steps", "1"]) == 0
    longer = [*argv[:-6], "--steps", "2", *argv[-4:]]
    changed = ["--learning_rate", "0.002", "--seed", "7", "--mini_batch_size", "4"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ppo.main([*longer, *changed, "--resume_from_checkpoint", str(out)]) == 0
    messages = [str(w.message) for w in caught if str(w.message).startswith("resuming with")]
    assert len(messages) == 3, messages
    for flag, old, new in [("--learning_rate", "0.001", "0.002"), ("--seed", "0", "7"),
                           ("--mini_batch_size", "2", "4")]:  # fmt: skip
        (found,) = [m for m in messages if m.startswith(f"resuming with {flag} ")]
        assert f"{flag} {new}," in found and f"{flag} {old}:" in found, found
