"""The policy file: expected ties (TIE008), ignores, severities, and mistakes it refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import Corpus

from tieaudit.cli.main import main
from tieaudit.core.errors import UsageError
from tieaudit.rules.policy import load_policy

EXPECT_HEAD = """
[[expect-tie]]
target = "head.weight"
source = "emb.weight"
"""


def findings(path: Path, policy: Path, tmp_path: Path) -> list[dict[str, object]]:
    out = tmp_path / "r.json"
    main(["check", str(path), "--policy", str(policy), "-f", "json", "-o", str(out), "--exit-zero"])
    result: list[dict[str, object]] = json.loads(out.read_text())["findings"]
    return result


def test_expected_tie_missing_when_stored_as_a_copy(corpus: Corpus, tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(EXPECT_HEAD)
    rules = {f["rule"] for f in findings(corpus.path("torch_cloned_head"), policy, tmp_path)}
    assert rules == {"TIE001", "TIE008"}
    assert (
        main(["check", str(corpus.path("torch_cloned_head")), "--policy", str(policy), "--fail-on", "error"])
        == 1
    )


@pytest.mark.parametrize("fixture", ["torch_tied_lm", "st_save_model_tied"])
def test_expected_tie_present(corpus: Corpus, fixture: str, tmp_path: Path) -> None:
    # one storage (.pt), or target dropped with a {dropped: kept} record (save_model)
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(EXPECT_HEAD)
    assert findings(corpus.path(fixture), policy, tmp_path) == []


def test_expected_tie_missing_in_an_untied_model(corpus: Corpus, tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(EXPECT_HEAD)
    found = findings(corpus.path("torch_untied_lm"), policy, tmp_path)
    # the policy's tie is also a declared tie: both stored, values differ
    assert {f["rule"] for f in found} == {"TIE002", "TIE008"}


def test_severity_override_and_ignore(corpus: Corpus, tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text('fail-on = "error"\n[severity]\nTIE001 = "error"\n')
    assert main(["check", str(corpus.path("st_cloned_head")), "--policy", str(policy)]) == 1
    policy.write_text('ignore = ["TIE001"]\n')
    assert main(["check", str(corpus.path("st_cloned_head")), "--policy", str(policy)]) == 0


def test_pyproject_table_is_discovered(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.tieaudit]\nfail-on = "error"\n')
    monkeypatch.chdir(tmp_path)
    assert load_policy(None).fail_on == "error"
    assert main(["check", str(corpus.path("st_cloned_head"))]) == 0


@pytest.mark.parametrize(
    "text",
    [
        'fail_on = "error"',
        'ignore = ["TIE999"]',
        'fail-on = "fatal"',
        "min-size = -1",
        "[[expect-tie]]\ntarget = 3\nsource = 'x'",
        "not toml [",
    ],
)
def test_mistakes_are_usage_errors(text: str, tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(text)
    with pytest.raises(UsageError):
        load_policy(str(policy))
    assert main(["check", str(policy), "--policy", str(policy)]) == 2


def test_missing_policy_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        load_policy(str(tmp_path / "nope.toml"))


PER_PATH = """
fail-on = "warning"
[severity]
TIE001 = "note"
[[path]]
glob = "release/**"
fail-on = "note"
[[path]]
glob = "release/*-fp16.*"
ignore = ["TIE001"]
[[path]]
glob = "*.onnx"
severity = { TIE004 = "warning" }
max-wasted-bytes = 1000
"""


def test_path_entries_override_the_defaults_in_file_order(tmp_path: Path) -> None:
    (tmp_path / "tieaudit.toml").write_text(PER_PATH)
    policy = load_policy(str(tmp_path / "tieaudit.toml"))
    other = policy.for_path(str(tmp_path / "dev" / "m.pt"))
    assert (other.fail_on, other.ignore, other.severity) == ("warning", frozenset(), {"TIE001": "note"})
    release = policy.for_path(str(tmp_path / "release" / "m.pt"))
    assert (release.fail_on, release.ignore) == ("note", frozenset())
    fp16 = policy.for_path(str(tmp_path / "release" / "m-fp16.safetensors"))
    assert (fp16.fail_on, fp16.ignore) == ("note", frozenset({"TIE001"}))
    onnx = policy.for_path(str(tmp_path / "release" / "sub" / "m.onnx"))  # a name glob, any depth
    assert onnx.severity == {"TIE001": "note", "TIE004": "warning"}  # merged rule by rule
    assert (onnx.max_wasted_bytes, policy.max_wasted_bytes) == (1000, None)


def test_globs_are_relative_to_the_policy_file_not_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "tieaudit.toml").write_text(PER_PATH)
    monkeypatch.chdir(tmp_path)
    policy = load_policy("repo/tieaudit.toml")
    assert policy.for_path("repo/release/m.pt").fail_on == "note"
    assert policy.for_path("release/m.pt").fail_on == "warning"  # not under the policy's folder


def test_the_command_line_beats_path_entries(tmp_path: Path) -> None:
    (tmp_path / "tieaudit.toml").write_text(PER_PATH)
    policy = load_policy(str(tmp_path / "tieaudit.toml")).overridden("error", 0, ("TIE006",))
    fp16 = policy.for_path(str(tmp_path / "release" / "m-fp16.safetensors"))
    assert (fp16.fail_on, fp16.min_bytes, fp16.ignore) == ("error", 0, frozenset({"TIE001", "TIE006"}))
    with pytest.raises(UsageError, match="unknown rule id TIE999"):
        policy.overridden(ignore=("TIE999",))


def test_wasted_bytes_cap_is_tie009_per_path(corpus: Corpus, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    (folder / "big").mkdir(parents=True)
    (folder / "small").mkdir()
    for name in ("big", "small"):
        shutil.copy(corpus.path("st_cloned_head"), folder / name / "m.safetensors")  # 32 KiB wasted
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(
        'fail-on = "error"\nmax-wasted-bytes = 1000\n[[path]]\nglob = "models/small/**"\n'
        "max-wasted-bytes = 100000\n"
    )
    out = tmp_path / "r.json"
    args = [str(folder / "big"), str(folder / "small")]  # two repositories: no copies across them
    code = main(["check", *args, "--policy", str(policy), "-f", "json", "-o", str(out), "-j", "1"])
    assert code == 1
    reports = {Path(r["path"]).parent.name: r for r in json.loads(out.read_text())["reports"]}
    (cap,) = [f for f in reports["big"]["findings"] if f["rule"] == "TIE009"]
    assert cap["kind"] == "wasted-bytes-cap" and cap["severity"] == "error"
    assert cap["names"] == ["emb.weight", "head.weight"] and cap["wasted_bytes"] == 0
    assert cap["details"] == {"wasted_bytes": 32768, "max_wasted_bytes": 1000}
    assert [f["rule"] for f in reports["small"]["findings"]] == ["TIE001"]
    assert reports["big"]["summary"]["wasted_bytes"] == 32768  # the cap wastes nothing itself


@pytest.mark.parametrize(
    "text",
    [
        "[[path]]\nfail-on = 'error'",  # no glob
        "[[path]]\nglob = 'x'\nfail_on = 'error'",  # a typo inside an entry
        "[[path]]\nglob = 'x'\npath = []",  # entries do not nest
        "path = 'models'",
        "max-wasted-bytes = -5",
        "max-wasted-bytes = true",
        "[[path]]\nglob = 'x'\nmax-wasted-bytes = '1 G'",  # ambiguous: GB or GiB
        "max-wasted-bytes = 'lots'",
    ],
)
def test_path_entry_mistakes_are_usage_errors(text: str, tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(text)
    with pytest.raises(UsageError):
        load_policy(str(policy))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"x = " + b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"min-size = " + b"9" * 5000, "an integer has more than 4300 digits"),
        (b'fail-on = "\xff"', "not UTF-8 text (byte 0xff at offset 11)"),
        (b"fail-on = []", "fail-on: [] is not a severity; expected error, warning or note"),
        (b"ignore = [[1]]", "ignore: entry [1] is not a rule id (a string); known: TIE001, "),
        (b"relations = [[1]]", "relations: [1] is not a relation; expected cast, equal or transposed"),
        (
            b"[severity]\nTIE001 = []",
            "severity.TIE001: [] is not a severity; expected error, warning or note",
        ),
        (b"min-size = 18446744073709551616", "is not a byte count; expected 0 to 2**63-1"),
        (b"[tool]\nx = 1", "unknown policy keys ['tool']"),
        (b"x = " + b"[" * 9 + b"]" * 9, "nest deeper than 8 levels"),
    ],
)
def test_hostile_policies_are_one_usage_line(content: bytes, message: str, tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_bytes(content)
    with pytest.raises(UsageError) as raised:
        load_policy(str(policy))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_policy_value_is_shortened_in_the_message(tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text('fail-on = "' + "x" * 100_000 + '"')
    with pytest.raises(UsageError, match=r"fail-on: 'x+\.\.\.x+' is not a severity") as raised:
        load_policy(str(policy))
    assert len(raised.value.message) < 200  # the message; the path before it is the test folder's


def test_pyproject_tool_that_is_not_a_table_is_a_usage_error(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('tool = "x"\n')
    with pytest.raises(UsageError, match=r"no \[tool.tieaudit\] table"):
        load_policy(str(pyproject))


def test_policy_rule_ids_in_any_case(tmp_path: Path) -> None:
    path = tmp_path / "tieaudit.toml"
    path.write_text(
        'ignore = ["tie004"]\n[severity]\ntie001 = "error"\n'
        '[[path]]\nglob = "x/**"\nignore = ["Tie006"]\nseverity = { tie002 = "note" }\n'
    )
    policy = load_policy(str(path))
    assert (policy.ignore, policy.severity) == (frozenset({"TIE004"}), {"TIE001": "error"})
    entry = policy.for_path(str(tmp_path / "x" / "m.pt"))
    assert entry.ignore == frozenset({"TIE006"})
    assert entry.severity == {"TIE001": "error", "TIE002": "note"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('ignore = ["tie999"]', "tieaudit.toml:1: ignore: 'tie999' is not a known rule id; known: TIE001, "),
        (
            '[severity]\ntie999 = "error"',
            "tieaudit.toml:2: severity: 'tie999' is not a known rule id; known: ",
        ),
        (
            '[[path]]\nglob = "x"\nseverity = { x = "note" }',
            "tieaudit.toml:3: [[path]] #1: severity: 'x' is not a known rule id; known: TIE001, ",
        ),
    ],
)
def test_an_unknown_rule_id_in_the_policy_lists_the_valid_ones(
    text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "tieaudit.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match="TIE011") as raised:
        load_policy(str(path))
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("value", "count"),
    [("1024", 1024), ('"1MB"', 10**6), ('"1MiB"', 1 << 20), ('"1.5 kib"', 1536), ('"7"', 7)],
)
def test_policy_sizes_are_read_like_the_command_lines(value: str, count: int, tmp_path: Path) -> None:
    path = tmp_path / "tieaudit.toml"
    path.write_text(
        f"min-size = {value}\nmax-wasted-bytes = {value}\n[[path]]\nglob = 'x'\nmin-size = {value}\n"
    )
    policy = load_policy(str(path))
    assert (policy.min_bytes, policy.max_wasted_bytes, policy.paths[0].settings["min_bytes"]) == (count,) * 3


@pytest.mark.parametrize("marker", ["folder", "file"])
def test_the_search_stops_at_the_repository_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: str
) -> None:
    (tmp_path / "tieaudit.toml").write_text('fail-on = "error"\n')  # outside the repository
    inner = tmp_path / "repo" / "sub"
    inner.mkdir(parents=True)
    git = tmp_path / "repo" / ".git"
    git.mkdir() if marker == "folder" else git.write_text("gitdir: /elsewhere\n")  # a worktree's .git
    monkeypatch.chdir(inner)
    assert load_policy(None).source == "defaults"
    (tmp_path / "repo" / "pyproject.toml").write_text('[tool.tieaudit]\nfail-on = "note"\n')
    assert load_policy(None).fail_on == "note"  # the repository root itself is searched


def test_the_nearest_folder_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "tieaudit.toml").write_text('fail-on = "error"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pyproject.toml").write_text('[tool.tieaudit]\nfail-on = "note"\n')
    monkeypatch.chdir(tmp_path / "sub")
    assert load_policy(None).fail_on == "note"
