"""The policy file: expected ties (TIE008), ignores, severities, and mistakes it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Corpus

from tieaudit.cli import main
from tieaudit.errors import UsageError
from tieaudit.policy import load_policy

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
