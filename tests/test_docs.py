"""README.md, docs/ and the help text keep up with the command line; the CI recipes they show work."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml  # type: ignore[import-untyped]
from click.testing import CliRunner
from readme_blocks import DOCS, all_blocks

from tieaudit.cli.main import cli
from tieaudit.rules.policy import load_policy

ROOT = Path(__file__).resolve().parent.parent
DOCS_TEXT = "\n".join(page.read_text() for page in DOCS)
"""README.md and every docs/ page."""
COMMANDS = sorted(cli.commands)


def fenced_blocks(language: str) -> list[str]:
    return [b.text for b in all_blocks() if b.language == language]


def long_options(command: click.Command) -> list[str]:
    return [
        opt
        for param in command.params
        if isinstance(param, click.Option)
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("--") and opt != "--help"
    ]


def test_the_commands_are_the_ones_this_test_knows() -> None:
    assert {"inspect", "check", "retie"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_and_option_is_documented(name: str) -> None:
    assert f"tieaudit {name}" in DOCS_TEXT
    missing = [opt for opt in long_options(cli.commands[name]) if opt not in DOCS_TEXT]
    assert not missing, f"tieaudit {name}: {missing} not in README.md or docs/"


def test_the_global_options_are_documented() -> None:
    missing = [opt for opt in long_options(cli) if opt not in DOCS_TEXT]
    assert not missing, missing


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_text_with_examples(name: str) -> None:
    command = cli.commands[name]
    assert command.help and command.get_short_help_str().strip()
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0
    examples = result.output.split("Examples:", 1)
    assert len(examples) == 2, f"tieaudit {name} --help shows no examples"
    assert f"tieaudit {name} " in examples[1]
    undocumented = [p.name for p in command.params if isinstance(p, click.Option) and not p.help]
    assert not undocumented, f"tieaudit {name}: options without help: {undocumented}"


def test_the_policy_example_in_the_readme_is_a_valid_policy(tmp_path: Path) -> None:
    (example,) = [block for block in fenced_blocks("toml") if "[[path]]" in block]
    (tmp_path / "tieaudit.toml").write_text(example)
    policy = load_policy(str(tmp_path / "tieaudit.toml"))
    assert [entry.glob for entry in policy.paths] == ["models/**/*.onnx", "legacy/**"]
    legacy = policy.for_path(str(tmp_path / "legacy" / "old.pt"))
    assert legacy.severity["TIE001"] == "note" and legacy.max_wasted_bytes == 100_000_000
    assert [t.dropped for t in legacy.expected_ties] == ["output.weight"]


def test_the_pre_commit_hook(tmp_path: Path) -> None:
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "tieaudit-check" and hook["id"] in DOCS_TEXT
    # the flag is in the entry: args a user sets (README: [--fail-on, error]) replace the hook's args
    assert hook["entry"] == "tieaudit check --skip-lfs-pointers" and hook["language"] == "python"
    assert "args" not in hook and hook["pass_filenames"] is True
    assert "types_or" not in hook and "types" not in hook  # an LFS pointer is text: it must get through
    files = re.compile(hook["files"])
    for name in ("a.pt", "b.pth", "c/pytorch_model.bin", "d.safetensors", "m.onnx", "last.ckpt", "e.pth.tar"):
        assert files.search(name), name
    for name in ("model.onnx.data", "config.json", "notes.pt.txt", "data.tar"):
        assert not files.search(name), name
    readme_hook = next(b for b in fenced_blocks("yaml") if "tieaudit-check" in b)
    assert "--skip-lfs-pointers" not in readme_hook  # users need not repeat it in their args


def test_the_pre_commit_hook_skips_lfs_pointers_with_a_note(tmp_path: Path) -> None:
    """The hook's command on a staged LFS pointer: a note, exit 0; a plain check: one error line, exit 2."""
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    pointer = tmp_path / "model.safetensors"
    pointer.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{'0' * 64}\nsize 1048576\n")
    argv = [*shlex.split(hook["entry"])[1:], str(pointer)]
    done = subprocess.run(
        [sys.executable, "-m", "tieaudit", *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"tieaudit: note: {pointer}: Git LFS pointer, not the weights: run `git lfs pull` "
        "(skipped: --skip-lfs-pointers)\n"
    )
    without = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(pointer)], capture_output=True, text=True, check=False
    )
    assert without.returncode == 2
    assert (
        without.stderr
        == f"tieaudit: error: {pointer}: Git LFS pointer, not the weights: run `git lfs pull`\n"
    )


def _named_limits() -> dict[str, str]:
    """Every module-level MAX_* constant of the package -> its module."""
    import ast

    found = {}
    for path in sorted((ROOT / "tieaudit").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id.startswith("MAX_") and target.id != "MAX_SHOWN":
                    found[f"{target.id} {path.relative_to(ROOT / 'tieaudit')}"] = target.id
    return found


def test_every_named_limit_is_in_the_docs_with_its_reason() -> None:
    """docs/trust.md's limits table lists each MAX_* constant beside its module, with a reason."""
    section = (ROOT / "docs" / "trust.md").read_text()
    rows = {
        (cells[0].strip("` "), cells[2].strip("` ")): cells[3].strip()
        for line in section.splitlines()
        if line.startswith("| `")
        for cells in [line.strip("|").split("|")]
    }
    limits = _named_limits()
    assert len(limits) > 30
    for key, name in limits.items():
        module = key.split(" ", 1)[1]
        assert (name, module) in rows, f"{name} ({module}) is not in docs/trust.md's limits table"
        assert len(rows[(name, module)]) > 20, f"{name}: no reason given"


def test_the_demo_runs_to_a_passing_check(tmp_path: Path) -> None:
    """make demo's script: inspect and check find the copy, retie removes it, check then passes."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "TIE001" in run.stdout and "check of the retied file exited 0" in run.stdout
