"""The RL stage's win-rate curve: the callback it builds and the points it keeps from the log."""

from __future__ import annotations

import pytest

from rlhfkit.demo.config import DemoConfig
from rlhfkit.demo.rl import _summary, _win_rate_points, win_rate_callback
from rlhfkit.tasks import prompt_split
from rlhfkit.testing import tiny_tokenizer


def test_callback_period_prompts_and_off_switch(tmp_path):
    tokenizer = tiny_tokenizer(padding_side="left")
    cfg = DemoConfig(size="tiny")  # 20 RL updates, 5 curve points
    callback = win_rate_callback(cfg, tokenizer, cfg.rl_updates, tmp_path)
    assert callback.every_n_steps == 4 and len(callback.prompts) == cfg.curve_num_prompts == 64
    assert all(prompt_split(p) == "test" for p in callback.prompts)  # held out from the RL prompts
    assert callback.sampling_params.temperature == cfg.temperature and callback.sampling_params.do_sample
    # the gold judge reads prompt + completion: the same completion wins after a positive opening
    verdicts = callback.judge.judge(["A wonderful film", "An awful film"], [[" indeed.", " indeed."]] * 2)
    assert verdicts == [-1, -1]
    assert callback.judge.scores(["A wonderful film"], [" indeed."])[0] > 0
    assert win_rate_callback(DemoConfig(size="tiny", curve_points=0), tokenizer, 20, tmp_path) is None
    with pytest.raises(ValueError, match="--curve_points"):
        DemoConfig(curve_points=-1)


def test_points_come_from_the_log_and_end_in_the_summary():
    history = [
        {"step": 1, "objective/scores": 0.1},
        {"step": 2.0, "eval/win_rate": 0.6, "eval/win_rate_low": 0.4, "eval/win_rate_high": 0.8},
        {"step": 4, "eval/win_rate": 0.7, "eval/win_rate_low": 0.5, "eval/win_rate_high": 0.85},
    ]
    points = _win_rate_points(history)
    assert points == {"step": [2, 4], "rate": [0.6, 0.7], "low": [0.4, 0.5], "high": [0.8, 0.85]}
    summary = _summary({"reward": [0.1, 0.2], "kl": [0.0, 1.0], "win_rate": points}, updates=4)
    assert (summary["curve_step_end"], summary["curve_win_rate_end"]) == (4, 0.7)
    assert "curve_win_rate_end" not in _summary(
        {"reward": [0.1], "kl": [0.0], "win_rate": _win_rate_points([])}, 4
    )
