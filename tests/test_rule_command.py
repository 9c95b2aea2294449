"""``tieaudit rule [ID]``: every rule explained in text and JSON, the list of all of them, an unknown id
(exit 2, one line naming the valid ids), and the rule list ``check --help`` ends with."""

from __future__ import annotations

import json
import re

import pytest

from tieaudit.cli.main import main
from tieaudit.rules.registry import RULES
from tieaudit.rules.texts import RULE_TEXTS

IDS = sorted(RULES)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Into a pipe (capsys) and without COLUMNS, text fits 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("rule_id", IDS)
def test_each_rule_in_text(rule_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = RULE_TEXTS[rule_id]
    code, out, err = run(["rule", rule_id.lower()], capsys)  # any letter case
    assert code == 0 and not err
    lines = out.splitlines()
    assert lines[0] == f"{rule_id} {text.kind} (default severity: {text.severity})"
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    flat = words(out)
    for prose in (text.summary, text.description, text.example, text.fix, text.ignore):
        assert words(prose) in flat
    for command in (text.example_command, *text.fix_commands, text.ignore_command):
        assert f"    $ {command}" in lines  # whole on its line, to be copied
    for printed in text.example_output.splitlines():  # wrapped, a word longer than a line cut
        assert "".join(printed.split()) in "".join(out.split())
    assert f'    ignore = ["{rule_id}"]' in lines
    assert lines[-1] == f"Help: https://github.com/OWNER/tieaudit/blob/main/docs/rules.md#{rule_id.lower()}"
    assert [line for line in lines if line.endswith(":") and not line.startswith(" ")] == [
        "When it fires:",
        "Example:",
        "Fix:",
        "Ignore:",
    ]


@pytest.mark.parametrize("rule_id", IDS)
def test_each_rule_in_json(rule_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = RULE_TEXTS[rule_id]
    code, out, _ = run(["rule", rule_id, "--format", "json"], capsys)
    document = json.loads(out)
    assert code == 0
    assert (document["id"], document["kind"], document["severity"]) == (rule_id, text.kind, text.severity)
    assert (document["summary"], document["description"]) == (text.summary, text.description)
    assert document["example"] == {
        "situation": text.example,
        "command": text.example_command,
        "output": text.example_output,
    }
    assert document["fix"] == {"text": text.fix, "commands": list(text.fix_commands)}
    assert document["ignore"]["command"] == f"tieaudit check PATH --ignore {rule_id}"
    assert document["ignore"]["policy"] == f'ignore = ["{rule_id}"]'
    assert document["ignore"]["text"] == text.ignore
    assert document["help_uri"].endswith(f"/docs/rules.md#{rule_id.lower()}")


@pytest.mark.parametrize("given", ["TIE099", "tie0", "untied-copy", ""])
def test_an_unknown_id_exits_2_naming_the_valid_ones(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["rule", given], capsys)
    assert code == 2 and not out
    (line,) = err.splitlines()
    assert line == f"tieaudit: error: unknown rule id {given} (known: {', '.join(IDS)})"


def test_the_list_has_each_rule_from_its_own_line_in_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["rule"], capsys)
    lines = out.splitlines()
    assert code == 0 and not err and all(len(line) <= 80 for line in lines)
    starts = [n for n, line in enumerate(lines) if not line.startswith(" ")]
    assert len(starts) == len(RULES)
    for start, end, rule_id in zip(starts, [*starts[1:], len(lines)], IDS, strict=True):
        text = RULE_TEXTS[rule_id]
        fields = lines[start].split(maxsplit=3)
        assert fields[:3] == [rule_id, text.severity, text.kind]
        column = lines[start].index(fields[3])
        assert all(line[:column].isspace() for line in lines[start + 1 : end])  # under the summary
        summary = " ".join([fields[3], *(line.strip() for line in lines[start + 1 : end])])
        assert summary == text.summary  # whole: wrapped, never cut


def test_a_wide_terminal_gets_whole_summaries(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _, out, _ = run(["rule"], capsys)
    assert [line.split(maxsplit=3)[3] for line in out.splitlines()] == [RULE_TEXTS[i].summary for i in IDS]
    _, out, _ = run(["rule", "TIE007"], capsys)
    assert 120 < max(len(line) for line in out.splitlines()) <= 200  # prose wrapped at 200 columns


def test_the_list_in_json_holds_every_rule_whole(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["rule", "-f", "json"], capsys)
    document = json.loads(out)
    assert code == 0 and document["schema"] == "tieaudit.rules/1"
    assert [r["id"] for r in document["rules"]] == IDS
    _, one, _ = run(["rule", "TIE005", "-f", "json"], capsys)
    assert document["rules"][IDS.index("TIE005")] == json.loads(one)


def test_rule_help_teaches_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["rule", "--help"], capsys)
    assert code == 0 and "Usage: tieaudit rule [OPTIONS] [ID]" in out
    assert "tieaudit rule TIE001" in out.split("Examples:", 1)[1]


def rules_section(help_text: str) -> list[str]:
    return help_text.split("\nRules (tieaudit rule ID explains one):\n", 1)[1].splitlines()


def test_check_help_lists_every_rule_from_the_registry(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(["check", "--help"], capsys)
    assert code == 0
    section = rules_section(out)
    assert max(len(line) for line in section) <= 80
    entries = re.split(r"\n  (?=TIE\d{3}  )", "\n" + "\n".join(section))[1:]
    assert [entry.split()[0] for entry in entries] == IDS
    for entry, rule_id in zip(entries, IDS, strict=True):
        assert words(entry) == f"{rule_id} {RULE_TEXTS[rule_id].summary}"
    assert "TIE001: equal" not in out  # no hand-written list left in the description
