"""The fenced blocks of README.md and docs/*.md, and the command lines of their ``sh`` blocks (for
tests/test_readme_commands.py and tests/test_docs_output.py).

The pages show hosted addresses the tests cannot reach: ``PLACEHOLDER_URL`` stands for wherever
tieaudit is hosted, and the tests put the ``file://`` URL of a bare clone of this repository in its
place (``hosted_repository``): the repository as a user's pip, pre-commit or Actions fetches it,
without tags (the published repository has none).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
"""Every page the docs test runs: README.md first, then docs/ by name."""
PLACEHOLDER_URL = "https://github.com/OWNER/tieaudit"


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int
    """The line of the opening fence in its page."""
    page: Path = README

    @property
    def where(self) -> str:
        """page:line, as a test names the block."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    text: str
    """As written, continuation lines joined, the trailing comment removed."""
    comment: str
    line: int

    @property
    def expected_exit(self) -> set[int]:
        """The exit the comment states (`# ... exit 1 ...`); else 0 or 1 for a gate (`tieaudit check`,
        `tieaudit runtime`: 1 is findings), 0 for anything else (an install, retie, completion)."""
        stated = re.search(r"\bexit (\d+)\b", self.comment)
        if stated:
            return {int(stated.group(1))}
        return {0, 1} if re.search(r"\btieaudit (check|runtime)\b", self.text) else {0}


def blocks(page: Path = README) -> list[Block]:
    text = page.read_text()
    fences = re.finditer(r"^```([\w-]*)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    return [Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, page) for m in fences]


def all_blocks() -> list[Block]:
    """The blocks of every page of DOCS, in order."""
    return [block for page in DOCS for block in blocks(page)]


def split_comment(line: str) -> tuple[str, str]:
    """`cmd  # note` -> ("cmd", "note"); a # inside quotes or a word is not a comment."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def commands(block: Block) -> list[Command]:
    found: list[Command] = []
    pending, start = "", 0
    for offset, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        if not pending:
            start = offset
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        text, comment = split_comment(pending + raw)
        pending = ""
        if text.strip():
            found.append(Command(" ".join(text.split()), comment, start))
    return found


def local(text: str, hosted: Path) -> str:
    """The command with the hosted address replaced by the bare clone's (``hosted_repository``).
    git+file:// needs a host for pip < 24 (PEP 508 parsing): localhost works with every pip and git."""
    return text.replace(PLACEHOLDER_URL, f"file://localhost{hosted.as_posix()}")


def installs_tieaudit(command: str) -> bool:
    """`pip install .`, `pip install 'tieaudit @ git+...'`, `python -m pip install ...tieaudit...`."""
    if not re.search(r"\bpip install\b", command):
        return False
    return "tieaudit" in command or re.search(r"""(?:^|\s)['"]?\.(?:\[|['"]|\s|$)""", command) is not None


def git(*args: str, where: Path = ROOT) -> str:
    done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def tags(where: Path = ROOT) -> list[str]:
    return git("tag", "--list", where=where).split()


DEFAULT_BRANCH = "main"
"""The branch the recipes follow (and whose commit they pin): the repository's default branch."""


def hosted_repository(where: Path) -> Path:
    """A bare clone of this repository as published: its branches, no tags (the published repository
    carries none, so no recipe may need one). Nothing is added to it: a checkout without the default
    branch (a detached HEAD alone) fails here, saying so, rather than being given one."""
    bare = where / "tieaudit.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--no-tags", str(ROOT), str(bare)], check=True)
    for tag in tags(bare):  # --no-tags still copies a tag HEAD's branch points at in some git versions
        subprocess.run(["git", "-C", str(bare), "tag", "--delete", tag], capture_output=True, check=True)
    assert not tags(bare)
    head = git("rev-parse", "--verify", "--quiet", f"refs/heads/{DEFAULT_BRANCH}^{{commit}}", where=bare)
    assert head, f"this checkout has no {DEFAULT_BRANCH} branch, which the recipes install from"
    subprocess.run(
        ["git", "-C", str(bare), "symbolic-ref", "HEAD", f"refs/heads/{DEFAULT_BRANCH}"], check=True
    )
    return bare
