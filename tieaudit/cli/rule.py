"""The ``rule`` command: what a rule means, when it fires, how to fix and silence it (registered on
the main group); and ``ListsRules``, the command class whose help ends with every rule (``check``).
Both read the rules' records (``rules.texts``), which import nothing of the audit."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from tieaudit.cli.common import CliError, report_width, to_terminal, write_output

if TYPE_CHECKING:
    from tieaudit.report.rules import RuleFormat

EXPLAINS = "tieaudit rule ID explains one"
"""How the rule lists in help texts end their title."""


class ListsRules(click.Command):
    """A command whose help ends with a section listing every rule (id and summary)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The rules, then the command's own epilog (if any)."""
        import textwrap

        from tieaudit.rules.texts import RULE_TEXTS

        with formatter.section(f"Rules ({EXPLAINS})"):
            for text in RULE_TEXTS.values():
                lead = " " * formatter.current_indent + text.id + "  "
                room = max(formatter.width - len(lead), 20)  # wrapped, never inside max-wasted-bytes
                lines = textwrap.wrap(text.summary, room, break_on_hyphens=False) or [""]
                formatter.write(lead + f"\n{' ' * len(lead)}".join(lines) + "\n")
        super().format_epilog(ctx, formatter)


def _width() -> int:
    """COLUMNS, else the terminal's width on a terminal, else the report's 80 columns."""
    from tieaudit.report.rules import RULE_WIDTH

    columns = os.environ.get("COLUMNS", "")
    if (columns.isdigit() and int(columns) > 0) or to_terminal(None):
        return report_width(None)
    return RULE_WIDTH


@click.command(cls=ListsRules)
@click.argument("rule_id", metavar="[ID]", required=False)
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: for people, fitting the terminal (80 columns into a pipe); json: every field.",
)
def rule(rule_id: str | None, fmt: RuleFormat) -> None:
    """Explain rule ID (in any letter case): its kind and default severity, when it fires, an
    example, how to fix it, how to silence it, and the address of its help page. Without
    ID, list every rule on one line: id, default severity, kind, summary.

    The same texts are SARIF's rule help and docs/rules.md. An unknown ID exits 2.

    \b
    Examples:
      tieaudit rule TIE001
      tieaudit rule tie004 --format json
      tieaudit rule
      tieaudit rule --format json | jq -r '.rules[].help_uri'
    """
    from tieaudit.report.rules import render_rule, render_rule_list
    from tieaudit.rules.texts import RULE_TEXTS, rule_text

    if rule_id is None:
        write_output(render_rule_list(fmt, width=_width()), None)
        return
    text = rule_text(rule_id)
    if text is None:
        raise CliError(f"unknown rule id {rule_id} (known: {', '.join(RULE_TEXTS)})")
    write_output(render_rule(text, fmt, width=_width()), None)
