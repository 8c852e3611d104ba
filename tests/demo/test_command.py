"""`rlhfkit demo` argument handling: bad flags fail fast with a message naming the flag."""

from __future__ import annotations

from rlhfkit.commands import demo


def test_bad_algo_is_a_clear_error(tmp_path, capsys):
    code = demo.main(["--algo", "a2c", "--output_dir", str(tmp_path / "out")])
    assert code == 2
    assert "--algo must be one of rloo, ppo, ppo-multi-adapter, dpo" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing was started


def test_flags_reach_the_config(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr("rlhfkit.demo.run_demo", lambda cfg: seen.setdefault("cfg", cfg))
    assert (
        demo.main(["--size", "tiny", "--seed", "3", "--rl_updates", "5", "--output_dir", str(tmp_path)]) == 0
    )
    cfg = seen["cfg"]
    assert (cfg.size, cfg.seed, cfg.rl_updates, cfg.output_dir) == ("tiny", 3, 5, str(tmp_path))
    assert cfg.sft_steps is not None  # filled from the tiny preset
