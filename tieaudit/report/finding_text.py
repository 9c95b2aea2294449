"""One finding in the text reports (``check`` and ``inspect``): a few lines that fit the width.

    TIE001 warning  untied-copy (equal), 8.0 KiB wasted
      names: lm_head.weight, model.embed_tokens.weight
      lm_head.weight holds the same bytes as model.embed_tokens.weight in separate storage (8.0 KiB
      wasted): values that are equal are not a tie; ...
      fix: tieaudit retie model.safetensors model-retied.safetensors

The head says what it is and what it costs; the names follow, each whole (a line breaks between
two names, never inside one); the message wraps at spaces; a fix that is one command is printed on
its own line whole, since a command pasted as shown must run as shown (the terminal wraps it when
it is wider than the window; nothing here inserts a break into it).
"""

from __future__ import annotations

from tieaudit.core.escape import printable
from tieaudit.core.shell import Advice
from tieaudit.core.units import human_bytes
from tieaudit.report.wrap import Line, Word, listed, word, words, wrap
from tieaudit.rules.finding import Finding

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
"""How each severity is shown on a colour terminal."""
NAMES_NAMED = 64
"""Names a finding of ``check``'s text lists, the rest counted (a pickle can point 100 000 names at
one storage); ``inspect`` lists MAX_CELL_NAMES, --format json every one."""
INDENT = 2
"""Where a finding's head line starts (under its checkpoint's line or the Findings title)."""
BODY = INDENT + 2
"""Where its names, message and fix start."""


def cut(message: str, limit: int | None) -> str:
    """message, or its first limit characters and how many more (all of it when limit is None)."""
    if limit is None or len(message) <= limit:
        return message
    more = len(message) - limit
    return f"{message[:limit]}... ({more} more characters in --format json)"


def head(finding: Finding, *, baselined: bool = False) -> list[Word]:
    """Rule, severity, kind (relation), bytes a fix saves; (baselined) when the baseline accepts it."""
    what = [finding.kind + (f" ({finding.relation})" if finding.relation else "")]
    if finding.wasted_bytes:
        what.append(f"{human_bytes(finding.wasted_bytes)} wasted")
    out = [word(finding.rule, "bold"), word(finding.severity, SEVERITY_STYLE[finding.severity])]
    out += [word(item, sep="  " if index == 0 else " ") for index, item in enumerate(_joined(what))]
    if baselined:
        out.append(word("(baselined)", "dim"))
    return out


def _joined(items: list[str]) -> list[str]:
    return [item + ("," if index < len(items) - 1 else "") for index, item in enumerate(items)]


def names_words(names: tuple[str, ...] | list[str], *, limit: int = NAMES_NAMED) -> list[Word]:
    """Names, escaped, one word each; past limit, how many more."""
    shown = listed(printable(name) for name in names[:limit])
    if len(names) > limit:
        shown[-1] = shown[-1].around(after=",")
        shown += words(f"and {len(names) - limit} more (--format json lists every name)")
    return shown


def advice_words(advice: Advice) -> list[Word]:
    """Advice's prose as words, each command in it one word (with the text glued to it: '(')."""
    pieces: list[str] = []
    current = ""
    for part in advice.parts:
        if not isinstance(part, str):
            current += printable(str(part))
            continue
        for index, piece in enumerate(printable(part).split(" ")):
            if index:
                pieces.append(current)
                current = ""
            current += piece
    pieces.append(current)
    return [word(piece) for piece in pieces if piece]


def finding_lines(
    finding: Finding,
    width: int,
    *,
    baselined: bool = False,
    names_named: int = NAMES_NAMED,
    max_chars: int | None = None,
) -> list[Line]:
    """The finding's head, names (names_named of them), message (cut after max_chars when given)
    and fix (not when baselined: nothing is to be done), fitting width but for a word wider than a
    line."""
    lines = wrap(head(finding, baselined=baselined), width, indent=INDENT, hang=BODY)
    if finding.names:
        names = [word("names:", "dim"), *names_words(finding.names, limit=names_named)]
        lines += wrap(names, width, indent=BODY, hang=BODY + 2)
    lines += wrap(words(printable(cut(finding.message, max_chars))), width, indent=BODY)
    fix = finding.fix
    if fix is not None and not baselined:
        if fix.label == "fix":  # one command: one line, whole
            lines.append([(" " * BODY, ""), ("fix:", "dim"), (" " + printable(str(fix)), "")])
        else:
            lines += wrap(
                [word(f"{fix.label}:", "dim"), *advice_words(fix)], width, indent=BODY, hang=BODY + 2
            )
    return lines
