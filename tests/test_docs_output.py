"""The output README.md and docs/ show is what tieaudit prints (issue 26: a real sample, kept real).

A ``console`` block holds commands (lines starting with ``$ ``), each followed by its output as a
terminal 100 columns wide shows it without colour (stdout, then stderr). A block's commands run in
order, in one folder holding the examples' files (tests/test_readme_commands.py ``example_files``),
with this checkout's tieaudit; each output must match exactly. Paths of the test's temporary folders
never appear (the commands name files relative to the folder).

TIEAUDIT_REGENERATE_DOCS=1 rewrites the blocks from what tieaudit prints now (review the diff).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Corpus
from readme_blocks import ROOT, Block, all_blocks
from test_readme_commands import a_clone, clean_env, example_files

GENERATED = {
    ROOT / "docs" / "rules.md": "generated from tieaudit/rules/texts.py, whose examples "
    "tests/test_rule_examples.py builds and runs (each in its own situation, not the examples' folder)"
}
"""Pages whose console blocks another test runs, with which."""
CONSOLE = [b for b in all_blocks() if b.language == "console" and b.page not in GENERATED]
WIDTH = "100"


def steps(block: Block) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    found: list[tuple[str, str]] = []
    for line in block.text.splitlines(keepends=True):
        if line.startswith("$ "):
            found.append((line[2:].rstrip("\n"), ""))
        else:
            assert found, f"{block.where}: output before any command"
            command, output = found[-1]
            found[-1] = (command, output + line)
    return found


def run(command: str, where: Path) -> str:
    argv = shlex.split(command)
    assert argv[0] == "tieaudit", f"a console block runs tieaudit commands only: {command}"
    env = clean_env([])
    env.update(PYTHONPATH=str(ROOT), COLUMNS=WIDTH, NO_COLOR="1", TERM="dumb", HF_HOME=str(where / ".hf"))
    done = subprocess.run(
        [sys.executable, "-m", "tieaudit", *argv[1:]], cwd=where, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert str(where) not in done.stdout + done.stderr
    return done.stdout + done.stderr


def regenerate(block: Block, outputs: list[tuple[str, str]]) -> None:
    text = block.page.read_text()
    new = "".join(f"$ {command}\n{output}" for command, output in outputs)
    old_fence = f"```console\n{block.text}```"
    assert text.count(old_fence) >= 1
    block.page.write_text(text.replace(old_fence, f"```console\n{new}```", 1))


def test_there_are_console_blocks_in_the_readme() -> None:
    readme = [b for b in CONSOLE if b.page.name == "README.md"]
    assert len(readme) >= 4
    first = readme[0]
    assert first.line < 20 and steps(first)[0][0].startswith("tieaudit check"), "a check sample near the top"


@pytest.mark.parametrize("block", CONSOLE, ids=[b.where for b in CONSOLE])
def test_every_console_block_shows_what_tieaudit_prints(block: Block, corpus: Corpus, tmp_path: Path) -> None:
    where = a_clone(tmp_path / "clone")
    example_files(corpus, where)
    outputs = [(command, run(command, where)) for command, _ in steps(block)]
    if os.environ.get("TIEAUDIT_REGENERATE_DOCS"):
        regenerate(block, outputs)
        return
    for (command, expected), (_, actual) in zip(steps(block), outputs, strict=True):
        said = f"{block.where}: $ {command}\n--- shown ---\n{expected}--- printed ---\n{actual}"
        assert actual == expected, said
        assert actual.strip(), f"{block.where}: $ {command} printed nothing"
