"""`rlhfkit tiny-models` builds the requested models and prints where they are."""

from __future__ import annotations

import pytest

from rlhfkit.commands.tiny_models import main
from rlhfkit.testing import cache_root


def test_builds_requested_names_and_prints_paths(tmp_path, capsys):
    assert main(["--cache_dir", str(tmp_path), "--names", "gpt2", "t5"]) == 0
    out = capsys.readouterr().out
    root = cache_root(tmp_path)
    for name in ("tokenizer", "gpt2", "t5"):
        assert str(root / name) in out
        assert (root / name).is_dir()
    assert not (root / "llama").exists()


def test_unknown_name_fails_before_building(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(["--cache_dir", str(tmp_path), "--names", "gpt2", "gpt5"])
    assert err.value.code == 2
    assert "gpt5" in capsys.readouterr().err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
