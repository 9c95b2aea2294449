"""Options that used to do nothing without a word (issue 14): each now works or says so.

One glob base for --exclude and [[path]] globs (the policy file's folder, else the current one),
with a warning for a pattern that matches nothing or only relative to the PATH argument; rule ids
in any letter case; sizes with units; the policy searched up to the repository root, two sources
an error; --show-settings; a --dim that sets nothing is a usage error. The policy file read
alone (ids in any case, sizes, where the search stops) is tested in test_policy.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import Corpus

from tieaudit.cli.common import SizeParam
from tieaudit.cli.main import main
from tieaudit.rules.policy import load_policy
from tieaudit.rules.registry import RULES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

WARNING = "tieaudit: warning: "


@pytest.fixture
def repo(corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository (with .git) holding models/legacy/a.safetensors and models/new/b.safetensors
    (each a 32 KiB cloned head: TIE001), the current folder."""
    root = tmp_path / "repo"
    for name in ("legacy/a", "new/b"):
        (root / "models" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(corpus.path("st_cloned_head"), root / "models" / f"{name}.safetensors")
    (root / ".git").mkdir()
    monkeypatch.chdir(root)
    return root


def audited(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], list[str]]:
    """Exit code, the checkpoints audited (names), and the warning lines of one check run."""
    code = main(["check", *args, "-f", "json", "--exit-zero"])
    captured = capsys.readouterr()
    reports = json.loads(captured.out)["reports"]
    warnings = [line for line in captured.err.splitlines() if line.startswith(WARNING)]
    return code, sorted(Path(r["path"]).name for r in reports), warnings


# --- one glob base -------------------------------------------------------------------------


def test_exclude_is_relative_to_the_current_folder_without_a_policy(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, names, warnings = audited(["models", "--exclude", "models/legacy/**"], capsys)
    assert (code, names, warnings) == (0, ["b.safetensors"], [])


def test_exclude_relative_to_the_path_still_applies_and_says_how_to_write_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, names, warnings = audited(["models", "--exclude", "legacy/**"], capsys)
    assert (code, names) == (0, ["b.safetensors"])
    assert warnings == [
        "tieaudit: warning: --exclude 'legacy/**' matched relative to the PATH argument, not to the "
        "current folder (the base of every glob): write --exclude 'models/legacy/**'"
    ]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_exclude_matching_nothing_is_a_warning_and_the_exit_code_is_unchanged(
    repo: Path, capsys: pytest.CaptureFixture[str], jobs: str
) -> None:
    # discovery runs in the parent process: --jobs changes nothing
    assert main(["check", "models", "-j", jobs]) == 1
    assert WARNING not in capsys.readouterr().err
    assert main(["check", "models", "-j", jobs, "--exclude", "nope/**", "--exclude", "*.onnx"]) == 1
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith(WARNING)]
    assert warnings == [
        f"tieaudit: warning: --exclude '{pattern}' matched nothing under models (globs are relative "
        "to the current folder, or name a file or folder alone)"
        for pattern in ("nope/**", "*.onnx")
    ]


def test_with_several_paths_an_exclude_matching_under_one_of_them_is_no_warning(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    both = ["models/legacy", "models/new"]
    assert audited([*both, "--exclude", "models/new/**"], capsys) == (0, ["a.safetensors"], [])
    assert audited([*both, "--exclude", "a.safetensors"], capsys) == (0, ["b.safetensors"], [])
    code, names, warnings = audited(["models/legacy", "models/new", "--exclude", "zz"], capsys)
    assert names == ["a.safetensors", "b.safetensors"]
    assert warnings == [
        "tieaudit: warning: --exclude 'zz' matched nothing under models/legacy, models/new (globs are "
        "relative to the current folder, or name a file or folder alone)"
    ]


def test_the_base_is_the_policy_files_folder_for_exclude_and_path_globs(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "tieaudit.toml").write_text('[[path]]\nglob = "models/new/**"\nignore = ["TIE001"]\n')
    monkeypatch.chdir(repo / "models")  # the policy is found above; its folder is the base
    code, names, warnings = audited([".", "--exclude", "models/legacy/**"], capsys)
    assert (code, names, warnings) == (0, ["b.safetensors"], [])
    assert main(["check", "new"]) == 0  # the [[path]] entry applies: TIE001 ignored
    assert WARNING not in capsys.readouterr().err


def test_a_policy_glob_matching_nothing_is_a_warning(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "tieaudit.toml").write_text(
        '[[path]]\nglob = "legacy/**"\nfail-on = "error"\n'
        '[[path]]\nglob = "*.safetensors"\nfail-on = "note"\n'
    )
    assert main(["check", "models"]) == 1  # the unmatched entry changes nothing
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith(WARNING)]
    assert warnings == [
        f"tieaudit: warning: tieaudit.toml: [[path]] glob 'legacy/**' matched no checkpoint audited "
        f"(globs are relative to {repo}, or name a file or folder alone)"
    ]


def test_a_policy_glob_about_another_folder_or_a_run_naming_files_is_no_warning(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CI jobs per folder and the pre-commit hook (staged files) do not reach every entry's paths
    (repo / "tieaudit.toml").write_text(
        '[[path]]\nglob = "models/legacy/**"\nfail-on = "error"\n'
        '[[path]]\nglob = "*.onnx"\nfail-on = "error"\n'
    )
    assert main(["check", "models/new/b.safetensors"]) == 1  # files named, no folder searched
    assert WARNING not in capsys.readouterr().err
    (repo / "tieaudit.toml").write_text('[[path]]\nglob = "models/legacy/**"\nfail-on = "error"\n')
    assert main(["check", "models/new"]) == 1  # models/legacy exists, beside the folder searched
    assert WARNING not in capsys.readouterr().err
    (repo / "tieaudit.toml").write_text('[[path]]\nglob = "models/new/*.onnx"\nfail-on = "error"\n')
    assert main(["check", "models/new"]) == 1  # about the folder searched: it could have matched
    assert "[[path]] glob 'models/new/*.onnx' matched no checkpoint audited" in capsys.readouterr().err


# --- rule ids in any letter case -----------------------------------------------------------


def test_ignore_takes_rule_ids_in_any_case(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "models", "--ignore", "tie001"]) == 0
    assert main(["check", "models", "--ignore", "Tie001"]) == 0
    capsys.readouterr()
    assert main(["check", "models", "--ignore", "tie999"]) == 2
    assert capsys.readouterr().err == (
        f"tieaudit: error: --ignore: unknown rule id tie999 (known: {', '.join(RULES)})\n"
    )


# --- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "code"),
    [("1MB", 0), ("1mb", 0), ("1MiB", 0), ("40000", 0), ("32KiB", 1), ("1.5KiB", 1), ("1024", 1)],
)
def test_min_size_takes_units(corpus: Corpus, size: str, code: int) -> None:
    # the copy is 32 KiB: a candidate under 32 KiB, not under 40 kB or more
    assert main(["check", str(corpus.path("st_cloned_head")), "--min-size", size]) == code


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ("1M", "'1M' is ambiguous: say 1MB (x1000) or 1MiB (x1024)"),
        ("lots", "'lots' is not a size"),
        ("-1", "'-1' is not a size"),
    ],
)
@pytest.mark.parametrize("command", ["check", "retie"])
def test_a_size_that_is_none_is_one_usage_line(
    corpus: Corpus, capsys: pytest.CaptureFixture[str], command: str, size: str, message: str
) -> None:
    extra = ["--dry-run"] if command == "retie" else []
    assert main([command, str(corpus.path("st_cloned_head")), *extra, "--min-size", size]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tieaudit: error: Invalid value for '--min-size': ") and message in err
    assert err.count("\n") == 1


def test_retie_min_size_takes_units(corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    source = str(corpus.path("st_cloned_head"))
    assert main(["retie", source, "--dry-run", "--all-equal", "--min-size", "1MiB"]) == 0
    assert "nothing to re-tie" in capsys.readouterr().out
    assert main(["retie", source, "--dry-run", "--all-equal", "--min-size", "32KiB"]) == 0
    assert "tie  head.weight = emb.weight" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "size", "message"),
    [
        ("--fold-limit", "0", "'0' is less than 1 byte"),
        ("--fold-limit", "1M", "'1M' is ambiguous"),
        ("--memory-limit", "lots", "'lots' is not a size"),
    ],
)
def test_runtime_sizes_use_the_same_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, size: str, message: str
) -> None:
    assert main(["runtime", str(tmp_path / "m.onnx"), option, size]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tieaudit: error: Invalid value for '{option}'") and message in err
    assert SizeParam(minimum=1).convert("512KiB", None, None) == 512 << 10


# --- which policy --------------------------------------------------------------------------


def test_the_policy_is_found_up_to_the_repository_root(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "tieaudit.toml").write_text('fail-on = "error"\n')
    (repo / "models" / "new" / "pyproject.toml").write_text(
        '[project]\nname = "x"\n'
    )  # no table: passed over
    monkeypatch.chdir(repo / "models" / "new")
    policy = load_policy(None)
    assert (policy.source, policy.fail_on, policy.root) == (str(repo / "tieaudit.toml"), "error", str(repo))
    assert main(["check", "b.safetensors"]) == 0  # TIE001 is a warning: under fail-on error


def test_two_policies_in_one_folder_are_an_error_naming_both(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "tieaudit.toml").write_text('fail-on = "error"\n')
    (repo / "pyproject.toml").write_text('[tool.tieaudit]\nfail-on = "note"\n')
    assert main(["check", "models"]) == 2
    assert capsys.readouterr().err == (
        "tieaudit: error: two policies: tieaudit.toml and pyproject.toml [tool.tieaudit]; keep one, "
        "or choose with --policy\n"
    )
    monkeypatch.chdir(repo / "models")
    assert main(["check", "."]) == 2
    assert f"two policies: {repo / 'tieaudit.toml'} and {repo / 'pyproject.toml'}" in capsys.readouterr().err
    assert main(["check", ".", "--policy", str(repo / "tieaudit.toml")]) == 0  # chosen: fail-on error


# --- --show-settings -----------------------------------------------------------------------


def test_show_settings_prints_every_key_with_its_origin_and_audits_nothing(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "tieaudit.toml").write_text(
        'fail-on = "error"\nignore = ["tie004"]\n[severity]\nTIE001 = "note"\n'
        '[[expect-tie]]\ntarget = "head.weight"\nsource = "emb.weight"\n'
        '[[path]]\nglob = "models/new/**"\nmin-size = "2KiB"\nfail-on = "note"\n'
    )
    args = ["check", "missing-path", "--show-settings", "--ignore", "TIE006", "--min-size", "1MB"]
    assert main([*args, "--exclude", "models/legacy/**"]) == 0
    captured = capsys.readouterr()
    policy_file = "tieaudit.toml"  # found in the current folder: named as found
    lines = captured.out.splitlines()
    assert lines[:3] == [
        "# tieaudit check: settings in force, in tieaudit.toml form",
        f"# policy file: {policy_file}",
        f"# globs (--exclude, [[path]] glob) are relative to: {repo}",
    ]
    origins = {
        line.split(" = ")[0]: line.rsplit("# ", 1)[1] for line in lines if " = " in line and "# " in line
    }
    assert origins == {
        "fail-on": policy_file,
        "min-size": "command line",
        "ignore": f"{policy_file} + command line",
        "relations": "default",
        "safe-globals": "default",
        "runtime": "default",
        "exclude": "command line",
    }
    assert "# max-wasted-bytes is not set" in captured.out and captured.err == ""
    document = tomllib.loads(captured.out)  # the settings are TOML; runtime and exclude are options
    assert document.pop("runtime") is False and document.pop("exclude") == ["models/legacy/**"]
    (repo / "again.toml").write_text(captured.out.replace("runtime = ", "# ").replace("exclude = ", "# "))
    again = load_policy(str(repo / "again.toml"))  # read back, it is the same policy
    assert (again.fail_on, again.min_bytes, again.ignore) == ("error", 10**6, frozenset({"TIE004", "TIE006"}))
    assert again.severity == {"TIE001": "note"} and [t.dropped for t in again.expected_ties] == [
        "head.weight"
    ]
    # --min-size beats the entry's min-size: the entry in force keeps only its fail-on
    assert [(p.glob, dict(p.settings)) for p in again.paths] == [("models/new/**", {"fail_on": "note"})]


def test_show_settings_without_a_policy_and_without_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--show-settings"]) == 0
    out = capsys.readouterr().out
    assert "# policy file: none found from the current folder up to the repository root" in out
    assert 'fail-on = "warning"' in out and "min-size = 1024" in out
    assert all(line.endswith("# default") for line in out.splitlines() if " = " in line and "#" in line)
    assert main(["check"]) == 2
    assert capsys.readouterr().err.startswith("tieaudit: error: Missing argument 'PATHS...'")


# --- --dim ---------------------------------------------------------------------------------


def test_export_dim_naming_nothing_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert main(["export", str(folder), str(tmp_path / "o.onnx"), "--dim", "foo=3"]) == 2
    assert capsys.readouterr().err == (
        "tieaudit: error: --dim foo sets nothing: a Hugging Face folder's example sizes are "
        "--dim batch, --dim sequence and, for a seq2seq model, --dim decoder_sequence\n"
    )
    assert main(["export", "mymodels:build", str(tmp_path / "o.onnx"), "--dim", "batch=2"]) == 2
    assert capsys.readouterr().err == (
        "tieaudit: error: --dim batch sets nothing: mymodels:build() brings its own example inputs\n"
    )


@pytest.mark.parametrize("command", ["runtime", "export"])
def test_a_dim_given_twice_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    args = [command, str(tmp_path / "m.onnx"), *(["o.onnx"] if command == "export" else [])]
    assert main([*args, "--dim", "batch=2", "--dim", "batch=3"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for --dim: 'batch' is given twice" in err and err.count("\n") == 1
