"""What ``tieaudit rule`` prints (one rule in full, or every rule one per line, as text or JSON), and
the rule help SARIF carries: all from the rules' records (``rules.texts``), defined once there.

Text fits the width given: prose is wrapped, a command is kept whole on its line (to be copied), and
the lines tieaudit prints in an example are wrapped with a deeper indent. docs/rules.md is rendered
by ``report.rules_doc`` from the same records.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any, Literal

from tieaudit.rules.text_record import RuleText, help_url
from tieaudit.rules.texts import RULE_TEXTS

RuleFormat = Literal["text", "json"]
"""What ``tieaudit rule`` writes."""
RULE_FORMATS: tuple[RuleFormat, ...] = ("text", "json")
"""``tieaudit rule --format`` choices, the default first."""
LIST_SCHEMA = "tieaudit.rules/1"
"""The ``schema`` of the JSON list of every rule."""
RULE_WIDTH = 80
"""Columns ``tieaudit rule`` fits in when neither a terminal nor COLUMNS says otherwise."""
INDENT = "  "
"""A section's body, under its title."""
CODE_INDENT = "    "
"""A command or printed line, under a section's prose."""
SHORTEST_SUMMARY = 12
"""Columns a summary's lines keep in the list however narrow the width (a narrower one overflows)."""


def rule_dict(text: RuleText) -> dict[str, Any]:
    """One rule as JSON data: every field ``tieaudit rule ID`` prints."""
    return {
        "id": text.id,
        "kind": text.kind,
        "severity": text.severity,
        "summary": text.summary,
        "description": text.description,
        "example": {
            "situation": text.example,
            "command": text.example_command,
            "output": text.example_output,
        },
        "fix": {"text": text.fix, "commands": list(text.fix_commands)},
        "ignore": {
            "text": text.ignore,
            "command": text.ignore_command,
            "policy": text.ignore_policy,
            "severity_policy": text.severity_policy,
        },
        "help_uri": help_url(text),
    }


def _paragraph(text: str, width: int, indent: str = INDENT) -> list[str]:
    return textwrap.wrap(
        text, width=width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
    )


def _printed(line: str, width: int) -> list[str]:
    """A line tieaudit prints, under CODE_INDENT, its continuations further in (its own indent kept;
    a word longer than the width, such as a Python call, is cut: it is shown, not copied)."""
    lead = CODE_INDENT + line[: len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(
        line.lstrip(" "),
        width=width,
        initial_indent=lead,
        subsequent_indent=lead + INDENT,
        break_on_hyphens=False,
    )


def _section(title: str, prose: str, width: int, *, commands: tuple[str, ...] = ()) -> list[str]:
    lines = ["", f"{title}:", *_paragraph(prose, width)]
    if commands:
        lines += ["", *(f"{CODE_INDENT}$ {command}" for command in commands)]
    return lines


def rule_text_lines(text: RuleText, width: int = RULE_WIDTH) -> list[str]:
    """One rule in full: id, kind, default severity, summary, then when it fires, an example, the
    fix, how to silence it and its help page."""
    lines = [
        f"{text.id} {text.kind} (default severity: {text.severity})",
        *_paragraph(text.summary, width, ""),
    ]
    lines += _section("When it fires", text.description, width)
    lines += _section("Example", text.example, width, commands=(text.example_command,))
    for printed in text.example_output.splitlines():
        lines += _printed(printed, width)
    lines += _section("Fix", text.fix, width, commands=text.fix_commands)
    lines += _section("Ignore", text.ignore, width, commands=(text.ignore_command,))
    lines += ["", *(CODE_INDENT + line for line in policy_lines(text))]
    lines += ["", f"Help: {help_url(text)}"]
    return lines


def list_lines(width: int = RULE_WIDTH) -> list[str]:
    """Every rule (id, default severity, kind, summary) from its own line; a summary longer than the
    width leaves goes on under itself, wrapped at words, never cut."""
    kind_width = max(len(t.kind) for t in RULE_TEXTS.values())
    severity_width = max(len(t.severity) for t in RULE_TEXTS.values())
    lines = []
    for text in RULE_TEXTS.values():
        lead = f"{text.id}  {text.severity:<{severity_width}}  {text.kind:<{kind_width}}  "
        room = max(width - len(lead), SHORTEST_SUMMARY)
        wrapped = textwrap.wrap(text.summary, room, break_long_words=False, break_on_hyphens=False)
        lines.append(lead + wrapped[0])
        lines.extend(" " * len(lead) + more for more in wrapped[1:])
    return lines


def render_rule(text: RuleText, fmt: RuleFormat, *, width: int = RULE_WIDTH) -> str:
    """``tieaudit rule ID``: the rule in full, as text fitting width columns or as one JSON object."""
    if fmt == "json":
        return json.dumps(rule_dict(text), indent=2) + "\n"
    return "\n".join(rule_text_lines(text, width)) + "\n"


def render_rule_list(fmt: RuleFormat, *, width: int = RULE_WIDTH) -> str:
    """``tieaudit rule``: every rule, one line each fitting width columns, or JSON (every field)."""
    if fmt == "json":
        rules = [rule_dict(text) for text in RULE_TEXTS.values()]
        return json.dumps({"schema": LIST_SCHEMA, "rules": rules}, indent=2) + "\n"
    return "\n".join(list_lines(width)) + "\n"


def help_text(text: RuleText) -> str:
    """SARIF's ``help.text``: the fix, its commands, and how to silence the rule."""
    commands = "".join(f"\n  $ {command}" for command in text.fix_commands)
    policy = "".join(f"\n  {line}" for line in policy_lines(text))
    return f"Fix: {text.fix}{commands}\n\nIgnore: {text.ignore}\n  $ {text.ignore_command}{policy}"


def md_escape(text: str) -> str:
    """Prose as Markdown shows it literally: ``__metadata__`` not bold, ``*.output.weight`` not
    emphasis, a ``|`` not a table cell's end."""
    for char in ("\\", "`", "*", "_", "<", "|"):
        text = text.replace(char, "\\" + char)
    return text


def console(*commands: str) -> str:
    """Markdown: commands as a console block."""
    return "```console\n" + "".join(f"$ {command}\n" for command in commands) + "```"


def policy_lines(text: RuleText) -> list[str]:
    """The policy lines that silence the rule, and (commented out) those that change its severity."""
    other = "reported, failing check" if text.severity == "note" else "reported without failing check"
    alternative = [f"# {line}" for line in text.severity_policy.splitlines()]
    return ["# tieaudit.toml", text.ignore_policy, f"# or, {other}:", *alternative]


def policy_block(text: RuleText) -> str:
    """Markdown: ``policy_lines`` as a TOML block."""
    return "```toml\n" + "".join(f"{line}\n" for line in policy_lines(text)) + "```"


def help_markdown(text: RuleText) -> str:
    """SARIF's ``help.markdown``: the fix with its commands, and how to silence the rule."""
    parts = ["**Fix.** " + md_escape(text.fix)]
    if text.fix_commands:
        parts.append(console(*text.fix_commands))
    parts += ["**Ignore.** " + md_escape(text.ignore), console(text.ignore_command), policy_block(text)]
    return "\n\n".join(parts)
