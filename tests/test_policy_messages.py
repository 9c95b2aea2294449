"""A policy file's mistakes: each error names the key, the entry that is wrong and what is
expected, at the file's line of the key (found by reading its lines again; tomllib keeps none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tieaudit.cli.main import main
from tieaudit.core.errors import UsageError
from tieaudit.rules.policy import load_policy

RULE_IDS = "known: TIE001, TIE002, TIE003, TIE004, TIE005, TIE006, TIE007, TIE008, TIE009, TIE010, TIE011"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        # each mistake: the key, the entry and what is expected, at the line of the key
        ('ignore = ["TIE01"]', "tieaudit.toml:1: ignore: 'TIE01' is not a known rule id; " + RULE_IDS),
        (
            'fail-on = "error"\nignore = ["TIE001", 3]',
            "tieaudit.toml:2: ignore: entry 3 is not a rule id (a string); ",
        ),
        (
            'ignore = "TIE001"',
            'tieaudit.toml:1: ignore: expected a list of rule ids (ignore = ["TIE004"]), not ',
        ),
        ('ignore = [\n  "TIE001",\n  "TIE9",\n]', "tieaudit.toml:1: ignore: 'TIE9' is not a known rule id; "),
        (
            '[severity]\nTIE01 = "error"',
            "tieaudit.toml:2: severity: 'TIE01' is not a known rule id; " + RULE_IDS,
        ),
        (
            '# severities\n[severity]\nTIE002 = "note"\nTIE001 = "fatal"',
            "tieaudit.toml:4: severity.TIE001: 'fatal' is not a severity; expected error, warning or note",
        ),
        (
            'severity.TIE001 = "fatal"',
            "tieaudit.toml:1: severity.TIE001: 'fatal' is not a severity; expected ",
        ),
        ('severity = "error"', "tieaudit.toml:1: severity: expected a table of rule id = severity"),
        (
            'fail-on = "fatal"',
            "tieaudit.toml:1: fail-on: 'fatal' is not a severity; expected error, warning or note",
        ),
        ("fail-on = 3", "tieaudit.toml:1: fail-on: 3 is not a severity; expected error, warning or note"),
        (
            'relations = ["equal", "rotated"]',
            "tieaudit.toml:1: relations: 'rotated' is not a relation; expected ",
        ),
        (
            'relations = "equal"',
            "tieaudit.toml:1: relations: expected a list of cast, equal or transposed, not ",
        ),
        (
            "min-size = -1",
            "tieaudit.toml:1: min-size: -1 is not a byte count; expected 0 to 2**63-1, or a size",
        ),
        ('max-wasted-bytes = "1XB"', "tieaudit.toml:1: max-wasted-bytes: '1XB': unknown unit 'xb'"),
        (
            'expect-tie = [{target = "a"}]',
            "tieaudit.toml:1: expect-tie: entry #1 {'target': 'a'} needs string ",
        ),
        ('safe-globals = "a.b"', "tieaudit.toml:1: safe-globals: expected an array of dotted names"),
        (
            'safe-globals = ["a..b"]',
            "tieaudit.toml:1: safe-globals: entry 'a..b' is not a dotted module.qualname",
        ),
        (
            "x = 1\nbogus = 2",
            "tieaudit.toml:1: unknown policy keys ['bogus', 'x'] (known: ",
        ),  # the first's line
        (
            '[[path]]\nglob = "a"\n[[path]]\nglob = "b"\nignore = ["TIE01"]',
            "tieaudit.toml:5: [[path]] #2: ignore: 'TIE01' is not a known rule id; " + RULE_IDS,
        ),
        (
            '[[path]]\nglob = "a"\n[path.severity]\nTIE001 = "fatal"',
            "tieaudit.toml:4: [[path]] #1: severity.TIE001: 'fatal' is not a severity; expected ",
        ),
        (
            '[[path]]\nglob = "a"\n[[path]]\nglob = "b"\nseverity = { TIE001 = "bad" }',
            "tieaudit.toml:5: [[path]] #2: severity.TIE001: 'bad' is not a severity; expected ",
        ),
        (
            '[[path]]\nglob = "a"\n\n[[path]]\nfail-on = "note"',
            'tieaudit.toml:4: [[path]] #2: needs glob = "..."',
        ),
        (
            '[[path]]\nglob = "a"\nfail-on = "bad"',
            "tieaudit.toml:3: [[path]] #1: fail-on: 'bad' is not a severity",
        ),
        ("path = 3", "tieaudit.toml:1: path: expected an array of tables ([[path]]), not 3"),
        (
            '[[path]]\nglob = """\nignore = 1\n"""\nignore = [1]',  # a multi-line string holds no key
            "tieaudit.toml:5: [[path]] #1: ignore: entry 1 is not a rule id",
        ),
    ],
)
def test_a_policy_mistake_names_the_key_the_entry_what_is_expected_and_the_line(
    text: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("tieaudit.toml").write_text(text + "\n")
    with pytest.raises(UsageError) as raised:
        load_policy("tieaudit.toml")
    assert str(raised.value).startswith(line), str(raised.value)


def test_in_pyproject_the_line_is_the_keys_in_tool_tieaudit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("pyproject.toml").write_text(
        '[project]\nname = "x"\nignore = 1\n\n[tool.tieaudit]\nfail-on = "error"\nignore = ["TIE01"]\n'
    )
    with pytest.raises(UsageError) as raised:
        load_policy("pyproject.toml")
    assert str(raised.value).startswith("pyproject.toml:7: ignore: 'TIE01' is not a known rule id; known: ")
    assert main(["check", "--policy", "pyproject.toml", "--show-settings"]) == 2
