"""The package's shape: stages as packages, imports only pointing down, no cycles, small modules.

The layers, bottom up (docs/development.md, "Architecture"): core -> graph -> formats -> rules -> repair ->
runtime -> audit/load -> gate -> report -> cli. A module may import its own package and any
package below it; ``if TYPE_CHECKING:`` imports are types only and never run, so they count for
the direction but not for cycles.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tieaudit"
LAYERS = ("core", "graph", "formats", "rules", "repair", "runtime", "entry", "gate", "report", "cli", "top")
ENTRY_MODULES = {"tieaudit.audit", "tieaudit.load"}
TOP_MODULES = {"tieaudit", "tieaudit.__main__"}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = ["tieaudit", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    if module in TOP_MODULES:
        return "top"
    if module in ENTRY_MODULES:
        return "entry"
    stage = module.split(".")[1]
    assert stage in LAYERS, f"{module} is in no layer: add its package to LAYERS and docs/development.md"
    return stage


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return inside


def imports(module: str) -> list[tuple[str, bool]]:
    """(imported tieaudit module, types only) for every import statement in module, lazy ones too."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    typing_only = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in MODULES else base)
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        found.extend((t, id(node) in typing_only) for t in targets if t.split(".")[0] == "tieaudit")
    return found


def test_every_import_points_down_or_within_its_own_package() -> None:
    upward = []
    for module in MODULES:
        for target, _ in imports(module):
            here, there = LAYERS.index(layer(module)), LAYERS.index(layer(target))
            if there > here:
                upward.append(f"{module} ({layer(module)}) imports {target} ({layer(target)})")
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    edges = {m: sorted({t for t, types_only in imports(m) if not types_only and t != m}) for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in edges.get(module, []):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(cycles)


def test_no_module_is_over_400_lines() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_checks_above_see_a_violation() -> None:
    """The walk resolves relative, lazy and aliased imports (else the tests above pass vacuously)."""
    assert ("tieaudit.core.records", False) in imports("tieaudit.graph.alias")
    assert any(layer(t) == "runtime" for m in ENTRY_MODULES for t, _ in imports(m))
    with pytest.raises(AssertionError):
        layer("tieaudit.nowhere.module")


def test_the_docs_architecture_tree_lists_every_package_and_entry_module() -> None:
    readme = (PACKAGE.parent / "docs" / "development.md").read_text()
    block = readme.split("\n## Architecture\n", 1)[1].split("```", 2)[1]
    listed = {m.group(1) for m in re.finditer(r"^  (\w+/|\w+\.py)", block, flags=re.MULTILINE)}
    actual = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    actual |= {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert listed == actual
    assert [s for s in LAYERS if s not in ("entry", "top")] == [
        name.rstrip("/") for name in sorted(listed, key=block.index) if name.endswith("/")
    ]


def test_parameters_after_the_third_are_keyword_only() -> None:
    """Long positional calls (run_retie(source, out, relations, keep, dry_run, ...), 14-field record
    constructors) are unreadable: a function or record with more than three takes the rest by name."""
    positional = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.vararg is None:
                names = [
                    a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")
                ]
                if len(names) > 3:
                    positional.append(f"{module}.{node.name}({', '.join(names)})")
            if isinstance(node, ast.ClassDef) and any(
                "dataclass" in ast.unparse(d) for d in node.decorator_list
            ):
                fields = [s for s in node.body if isinstance(s, ast.AnnAssign)]
                if len(fields) > 3 and not any("kw_only=True" in ast.unparse(d) for d in node.decorator_list):
                    positional.append(f"{module}.{node.name}: {len(fields)} positional fields")
    assert not positional, "\n".join(positional)


def test_every_tieaudit_import_outside_the_package_resolves() -> None:
    """Scripts, fixtures producers, benchmarks, fuzzers and tests name tieaudit's modules and names
    as they are: a name moved to another module (as export's logits_only once was) breaks
    `make fixtures` on a fresh clone before any test runs, so it is found here, by reading."""
    import importlib
    import importlib.util

    missing = []
    for folder in ("fixtures", "scripts", "bench", "fuzz", "tests"):
        for path in sorted((PACKAGE.parent / folder).rglob("*.py")):
            if "generated" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tieaudit")):
                    continue
                assert node.module is not None
                module = importlib.import_module(node.module)
                where = f"{path.relative_to(PACKAGE.parent)}: from {node.module} import"
                missing += [
                    f"{where} {alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                    and importlib.util.find_spec(f"{node.module}.{alias.name}") is None
                ]
    assert not missing, missing
