"""The source tree keeps its shape: files under 500 lines, functions under 80, imports in layers.

Layers, lowest first (a module may import its own subpackage and any lower layer at module level):
core < models, data < rollout, testing < agents < rewards < tasks < judges < trainers < demo < commands <
cli < __main__. Imports inside functions and under TYPE_CHECKING are not counted: they run late, so they
cannot form an import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "rlhfkit"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
LAYERS = [
    {"core"},
    {"models", "data"},
    {"rollout", "testing"},
    {"agents"},
    {"rewards"},
    {"tasks"},
    {"judges"},
    {"trainers"},
    {"demo"},
    {"commands"},
    {"cli"},
    {"__main__", ""},  # "" is the package root, `rlhfkit/__init__.py` (its names load lazily)
]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
FILES = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in FILES}


def subpackage(module: str) -> str:
    """`rlhfkit.trainers.ppo.update` -> "trainers"; the root package -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_level_imports(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported rlhfkit module, line) for each import that runs when `module` is imported."""
    found: list[tuple[str, int]] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = resolve(node)
                for alias in node.names:  # `from pkg import submodule` imports the submodule too
                    submodule = f"{target}.{alias.name}"
                    found.append((submodule if submodule in MODULES else target, node.lineno))
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body)

    visit(ast.parse(source).body)
    return [(name, line) for name, line in found if name == "rlhfkit" or name.startswith("rlhfkit.")]


def import_graph() -> dict[str, list[tuple[str, int]]]:
    return {
        module: module_level_imports(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        for module, path in MODULES.items()
    }


def test_resolves_relative_and_submodule_imports():
    source = "from . import config\nfrom .trainer import PPOTrainer\n"
    source += "if TYPE_CHECKING:\n    import rlhfkit.demo\n"
    found = module_level_imports(source, "rlhfkit.trainers.ppo", is_package=True)
    assert found == [("rlhfkit.trainers.ppo.config", 1), ("rlhfkit.trainers.ppo.trainer", 2)]
    inside_function = "def f():\n    from rlhfkit.demo import run_demo\n"
    assert module_level_imports(inside_function, "rlhfkit.core.kl", is_package=False) == []


def test_every_subpackage_has_a_layer():
    assert {subpackage(module) for module in MODULES} <= set(LAYER_OF)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_file_and_function_sizes(path: Path):
    source = path.read_text(encoding="utf-8")
    lines = len(source.splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.name} has {lines} lines (at most {MAX_FILE_LINES})"
    long = [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines in {path.name}: {long}"


def test_imports_only_go_down_the_layers():
    upward = [
        f"{MODULES[module].relative_to(SRC)}:{line} imports {target}"
        for module, targets in import_graph().items()
        for target, line in targets
        if subpackage(target) != subpackage(module)
        and LAYER_OF[subpackage(target)] >= LAYER_OF[subpackage(module)]
    ]
    assert not upward, "imports that are not to a lower layer:\n" + "\n".join(upward)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (node -> nodes it imports) as a path that ends where it starts, or None."""
    done: set[str] = set()
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, ())):
            cycle = walk(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = walk(node)
        if cycle:
            return cycle
    return None


def test_find_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_no_import_cycles_between_modules():
    graph = {module: {t for t, _ in targets if t in MODULES} for module, targets in import_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)
