"""README.md's fenced blocks and the command lines of its ``sh`` blocks (for tests/test_readme_commands.py).

The README shows hosted addresses the tests cannot reach: ``PLACEHOLDER_URL`` stands for wherever
tieaudit is hosted, and the tests put the ``file://`` URL of a bare clone of this repository in its
place (``hosted_repository``): the release as a user's pip or pre-commit fetches it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PLACEHOLDER_URL = "https://github.com/OWNER/tieaudit"


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int
    """The line of the opening fence in README.md."""


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


def blocks(text: str | None = None) -> list[Block]:
    text = README.read_text() if text is None else text
    fences = re.finditer(r"^```([\w-]*)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    return [Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in fences]


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


def is_release_tag(rev: str, where: Path = ROOT) -> bool:
    """An annotated tag (what `git tag -a` makes, what a release is) naming a commit."""
    return bool(git("rev-parse", "--verify", "--quiet", f"refs/tags/{rev}^{{commit}}", where=where)) and (
        git("cat-file", "-t", f"refs/tags/{rev}", where=where) == "tag"
    )


def hosted_repository(rev: str, where: Path) -> Path:
    """A bare clone of this repository, as hosted, with the release tag ``rev``.

    A clone made without tags (a CI checkout: ``actions/checkout`` fetches none by default, and this
    project's CI clones only the branch) cannot carry the release: there the bare clone tags its HEAD,
    standing in for the release the README names. When this repository has the tag, the bare clone
    has that very tag (``git clone`` copies tags) and nothing is added."""
    bare = where / "tieaudit.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(ROOT), str(bare)], check=True)
    if not is_release_tag(rev, bare):
        subprocess.run(
            ["git", "-C", str(bare), "-c", "user.name=tieaudit tests", "-c", "user.email=tests@localhost",
             "tag", "-a", rev, "-m", f"stand-in for the release {rev}: the clone under test has no tags",
             "HEAD"],
            check=True,
        )  # fmt: skip
    return bare
