"""DemoConfig presets/validation and the cached-stage runner."""

from __future__ import annotations

import json

import pytest

from rlhfkit.demo.cache import DONE_FILE, Stage, run_stage
from rlhfkit.demo.config import PRESETS, DemoConfig


def test_preset_fills_unset_sizes_and_flags_win():
    cfg = DemoConfig(size="tiny", sft_steps=7)
    assert cfg.sft_steps == 7  # given explicitly: the preset does not override it
    assert cfg.rl_updates == PRESETS["tiny"]["rl_updates"]
    assert DemoConfig().rl_updates == PRESETS["default"]["rl_updates"]


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"algo": "a2c"}, "--algo"),
        ({"size": "huge"}, "--size"),
        ({"rl_batch_size": 30, "rloo_k": 4}, "--rl_batch_size"),
        ({"rloo_k": 1}, "--rloo_k"),
        ({"algo": "ppo", "rl_batch_size": 30}, "--rl_batch_size"),
        ({"sft_steps": 0}, "--sft_steps"),
        ({"pref_eval_fraction": 0.7}, "--pref_eval_fraction"),
        ({"temperature": 0.0}, "--temperature"),
    ],
)
def test_bad_values_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        DemoConfig(**kwargs)


def test_values_rejects_unknown_field():
    with pytest.raises(KeyError):
        DemoConfig().values("seed", "sft_stepz")


def _counting_stage(name, params, calls, parents=()):
    def run(out):
        calls.append(name)
        (out / "payload.txt").write_text(json.dumps(params))
        return {"n": len(calls)}

    return Stage(name, name, params, run, parents)


def test_stage_runs_once_then_is_reused(tmp_path):
    calls = []
    first = run_stage(_counting_stage("a", {"x": 1}, calls), tmp_path, announce=lambda _: None)
    again = run_stage(_counting_stage("a", {"x": 1}, calls), tmp_path, announce=lambda _: None)
    assert calls == ["a"]
    assert not first.reused and again.reused
    assert again.summary == {"n": 1} and again.config_hash == first.config_hash
    marker = json.loads((tmp_path / "a" / DONE_FILE).read_text())
    assert marker["config_hash"] == first.config_hash and marker["params"] == {"x": 1}


def test_changed_params_fresh_and_parents_rerun(tmp_path):
    calls, quiet = [], (lambda _: None)
    parent = run_stage(_counting_stage("p", {"x": 1}, calls), tmp_path, announce=quiet)
    run_stage(_counting_stage("c", {"y": 1}, calls, [parent]), tmp_path, announce=quiet)
    run_stage(_counting_stage("c", {"y": 2}, calls, [parent]), tmp_path, announce=quiet)  # own params changed
    run_stage(_counting_stage("c", {"y": 2}, calls, [parent]), tmp_path, fresh=True, announce=quiet)
    new_parent = run_stage(_counting_stage("p", {"x": 2}, calls), tmp_path, announce=quiet)
    assert new_parent.config_hash != parent.config_hash
    run_stage(
        _counting_stage("c", {"y": 2}, calls, [new_parent]), tmp_path, announce=quiet
    )  # upstream changed
    assert calls == ["p", "c", "c", "c", "p", "c"]
    assert json.loads((tmp_path / "c" / "payload.txt").read_text()) == {"y": 2}


def test_failed_stage_leaves_nothing_to_reuse(tmp_path):
    def boom(out):
        (out / "half.txt").write_text("partial")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        run_stage(Stage("s", "s", {}, boom), tmp_path, announce=lambda _: None)
    assert not (tmp_path / "s").exists()
    calls = []
    result = run_stage(_counting_stage("s", {}, calls), tmp_path, announce=lambda _: None)
    assert calls == ["s"] and not result.reused
