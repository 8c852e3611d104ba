"""The demo checks its optional `demo` extra before the first stage, and names what to install."""

from __future__ import annotations

import sys

import pytest

from rlhfkit.commands import demo
from rlhfkit.demo.dependencies import MissingDemoDependencies, check_demo_dependencies, missing_modules


def _block(monkeypatch, *names: str) -> None:
    """Make `names` unimportable, as if not installed (None in sys.modules: find_spec and import both
    fail)."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def test_missing_matplotlib_stops_the_command_before_any_stage(monkeypatch, tmp_path, capsys):
    _block(monkeypatch, "matplotlib")
    started = []
    monkeypatch.setattr("rlhfkit.demo.pipeline.run_demo", lambda cfg: started.append(cfg))
    code = demo.main(["--size", "tiny", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and started == []
    assert "matplotlib" in err and "pip install 'rlhfkit[demo]'" in err and "vaderSentiment" not in err
    assert not (tmp_path / "out").exists()


def test_every_missing_module_is_named_and_only_the_task_needs_count(monkeypatch):
    _block(monkeypatch, "matplotlib", "vaderSentiment")
    assert missing_modules("sentiment") == ["vaderSentiment", "matplotlib"]
    assert missing_modules("addition") == ["matplotlib"]  # no VADER judge in a verifiable task
    with pytest.raises(MissingDemoDependencies, match=r"vaderSentiment, matplotlib.*rlhfkit\[demo\]") as err:
        check_demo_dependencies("sentiment")
    assert isinstance(err.value, ModuleNotFoundError)


def test_nothing_missing_when_the_extra_is_installed():
    pytest.importorskip("matplotlib")
    pytest.importorskip("vaderSentiment")
    assert missing_modules("sentiment") == []
    check_demo_dependencies("sentiment")  # does not raise
