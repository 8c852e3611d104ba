"""The architecture figure names real files, and docs/architecture.md names the same ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _figure_module():
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "docs/figures/architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_in_the_figure_exists():
    assert _figure_module().missing_files() == []


def test_the_page_names_every_file_of_the_figure():
    page = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    figure = _figure_module()
    for _, _, path in figure.STAGES:
        assert path.removeprefix("src/rlhfkit/") in page, path


def test_the_figure_draws(tmp_path):
    out = _figure_module().draw(tmp_path / "architecture.png")
    assert out.stat().st_size > 10_000


def test_readme_layout_lists_every_subpackage():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("## Layout") :].split("```")[1]
    listed = {line.split()[0].removeprefix("src/rlhfkit/") for line in block.splitlines() if line.strip()}
    packages = {p.name for p in (ROOT / "src/rlhfkit").iterdir() if (p / "__init__.py").exists()}
    assert listed == packages


def test_test_files_have_unique_basenames():
    # test folders have no __init__.py, so pytest imports test modules by basename: two alike break collection
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
