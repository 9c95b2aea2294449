"""The record of what a person is told about a rule (``RuleText``), and where its help page is.

The records themselves are in ``texts`` (one per rule, defined once); this module and that one
import nothing of the audit, so ``check --help`` lists the rules without loading numpy or a reader.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tieaudit.rules.finding import Severity

DOCS_URL = "https://github.com/OWNER/tieaudit/blob/main/docs"
"""The documentation's address, as ``[project.urls] Documentation`` in pyproject.toml says it (OWNER
stands for where tieaudit is hosted): used when the installed package's metadata does not say."""
RULES_PAGE = "rules.md"
"""The page under the documentation that explains every rule, one section (``#tie001``) each."""


@dataclass(frozen=True, kw_only=True)
class RuleText:
    """What a person is told about one rule."""

    id: str
    """Stable id, e.g. TIE001 (SARIF, baselines and --ignore rely on it)."""
    kind: str
    """Short slug, e.g. untied-copy."""
    severity: Severity
    """Default severity (the policy's [severity] table changes it)."""
    summary: str
    """One sentence a person understands at once."""
    description: str
    """When it fires, in a few sentences."""
    example: str
    """A situation in which it fires."""
    example_command: str
    """The command run in that situation."""
    example_output: str
    """The finding's lines tieaudit prints for it, exactly."""
    fix: str
    """What to do."""
    fix_commands: tuple[str, ...] = ()
    """Shell commands that do it, where one applies."""
    ignore_note: str = ""
    """What to know before silencing it, beyond the ways every rule is silenced (``ignore``)."""

    @property
    def ignore(self) -> str:
        """How to silence it: --ignore, the policy's ignore list, or another severity."""
        text = (
            f"Leave it out of one run with --ignore {self.id}, or out of every run with the ignore list "
            "of the policy file (tieaudit.toml, or [tool.tieaudit] in pyproject.toml; in a [[path]] "
            "entry, for the checkpoints its glob names only). "
        )
        if self.severity == "note":
            text += (
                "As a note it fails check only with --fail-on note; the policy's [severity] table can "
                "raise it."
            )
        else:
            text += (
                "To keep it reported without failing check (which fails on warnings and errors by "
                "default), lower it to a note in the policy's [severity] table instead."
            )
        return f"{text} {self.ignore_note}".rstrip()

    @property
    def ignore_command(self) -> str:
        """The command line that leaves it out of one run."""
        return f"tieaudit check PATH --ignore {self.id}"

    @property
    def ignore_policy(self) -> str:
        """The policy lines that leave it out of every run."""
        return f'ignore = ["{self.id}"]'

    @property
    def severity_policy(self) -> str:
        """The policy lines that keep it reported at another severity."""
        return f'[severity]\n{self.id} = "{"error" if self.severity == "note" else "note"}"'

    @property
    def anchor(self) -> str:
        """Its section's anchor on the rules page."""
        return self.id.lower()


@functools.cache
def docs_url() -> str:
    """The documentation's address: the installed package's ``Documentation`` project URL when its
    metadata has one, else ``DOCS_URL``. Read on first use only, so no other command pays for it."""
    from importlib import metadata

    try:
        entries = metadata.metadata("tieaudit").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return DOCS_URL
    for entry in entries:
        label, _, url = str(entry).partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return url.strip().rstrip("/")
    return DOCS_URL


def help_url(text: RuleText) -> str:
    """The address of the rule's section on the rules page."""
    return f"{docs_url()}/{RULES_PAGE}#{text.anchor}"
