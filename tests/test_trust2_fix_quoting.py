"""Issue 23, point 5: advice that cannot be turned into an attack.

Every command tieaudit prints as a fix (check in every --format, inspect, the CLI's suggestions)
is pasted into bash here, for files named by an attacker: with a stand-in ``tieaudit`` on PATH that
records the argv it gets, the command must name exactly the file (byte for byte, also when the
name is not UTF-8 or holds a newline), the rest of the argv must be the intended one, and nothing
in the name may run (a marker file stays absent). One case also runs the real tieaudit from the
printed command. A source check holds the mechanism: no fix text interpolates a path; every
command in a fix is a ``core.shell.Command`` shown by ``shell_command``.
"""

from __future__ import annotations

import ast
import html
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from markdown_it import MarkdownIt
from safetensors.numpy import save_file

from tieaudit.cli.main import main
from tieaudit.core.escape import printable
from tieaudit.rules.copies import retied_path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tieaudit"
MARKER = "pwned"
"""The file a name's payload would create if any part of a printed command ran as code."""

# Each attack on a pasted command, by the file name that carries it.
ATTACKS: dict[str, str | bytes] = {
    "space": "my model.safetensors",
    "parentheses": "model(1).safetensors",
    "command_substitution": f"$(touch {MARKER}).safetensors",
    "backticks": f"`touch {MARKER}`.safetensors",
    "semicolon": f"m;touch {MARKER};.safetensors",
    "pipe": f"m|touch {MARKER}|.safetensors",
    "ampersand": f"m&touch {MARKER}&.safetensors",
    "and_list": f"m&&touch {MARKER}.safetensors",
    "redirection": f"m>{MARKER}.safetensors",
    "single_quote": f"it's';touch {MARKER};'.safetensors",
    "double_quote": f'say "$(touch {MARKER})".safetensors',
    "newline": f"m\ntouch {MARKER}\n.safetensors",
    "carriage_return_escape": "m\r\x1b[2Kclean.safetensors",
    "tab_and_nul_like": "m\t\x7f.safetensors",
    "leading_dash_option": "--in-place.safetensors",
    "leading_dash_short": "-rf.safetensors",
    "non_utf8_bytes": b"m\xff\xfe$(touch " + MARKER.encode() + b").safetensors",
    "bidi_override": "m\u202eevil.safetensors",
    "glob": "m*.safetensors",  # beside a decoy, mX.safetensors, which an unquoted glob also names
    "tilde": "~root",  # unquoted, bash reads /root
    "history_expansion": f"m!!touch {MARKER}.safetensors",
    "dollar_single_quote": f"$'\\x3b'touch {MARKER}.safetensors",
    "backslash": "m\\n\\\\.safetensors",
    "markdown_mention_and_issue": "m@owner#1.safetensors",
    "markdown_pipe_backtick": "m|`x`|.safetensors",
    "workflow_percent": "m%0A::error::x.safetensors",
    "unicode_letters_control": "модель.safetensors",  # no attack: quoting must not break it either
}


def _name(attack: str) -> str:
    raw = ATTACKS[attack]
    return os.fsdecode(raw) if isinstance(raw, bytes) else raw


def _make(folder: Path, name: str) -> None:
    # safetensors takes a str path; write under a plain name, then rename to the hostile bytes.
    plain = folder / "plain.safetensors"
    matrix = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    save_file({"emb.weight": matrix, "head.weight": matrix.copy()}, str(plain))
    os.rename(os.fsencode(plain), os.path.join(os.fsencode(folder), os.fsencode(name)))


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[Path]:
    """A folder holding a `tieaudit` and an `hf` that record their argv (NUL-separated, bytes) in
    argv.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("tieaudit", "hf"):
        script = bin_dir / program
        script.write_text(
            f"#!{sys.executable}\n"
            "import os, sys\n"
            "with open(os.environ['ARGV_LOG'], 'wb') as log:\n"
            "    log.write(b'\\0'.join(os.fsencode(a) for a in sys.argv[1:]))\n"
        )
        script.chmod(0o755)
    yield bin_dir


def _paste(command: str, *, cwd: Path, bin_dir: Path, history: bool = False) -> list[str]:
    """Run command as bash would when it is pasted (history: with history expansion on, as in an
    interactive shell); the argv the stand-in tieaudit got."""
    log = cwd / "argv.log"
    if log.exists():
        log.unlink()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_LOG": str(log), "HOME": str(cwd)}
    script = ("set -o history; set -H\n" if history else "") + command + "\n"
    done = subprocess.run(
        ["bash", "-s"], input=script.encode(), cwd=cwd, env=env, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, (command, done.stderr)
    assert not (cwd / MARKER).exists(), f"pasting ran code from the name: {command}"
    return [os.fsdecode(a) for a in log.read_bytes().split(b"\0")]


def _assert_retie_argv(argv: list[str], name: str) -> None:
    """argv is `retie NAME NAME-retied.safetensors [options]`, the two paths naming exactly those files."""
    assert argv[0] == "retie", argv
    assert os.path.normpath(argv[1]) == name, argv
    assert os.path.normpath(argv[2]) == retied_path(name, "safetensors"), argv
    assert not argv[1].startswith("-") and not argv[2].startswith("-"), argv  # else read as options
    assert all(a.startswith("--") or a.replace(",", "").isalpha() for a in argv[3:]), argv


# --- the fix as each format shows it -------------------------------------------------------------


def _from_text(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("    fix: ")]
    return line.removeprefix("    fix: ")


def _from_inspect_text(out: str) -> str:
    """The first line holding the fix (one line, or the command was folded and cannot be pasted)."""
    line = next(line for line in out.splitlines() if "fix: " in line)
    return line.split("fix: ", 1)[1].rstrip(" │")


def _from_json(out: str) -> str:
    document = json.loads(out)
    report = document["reports"][0] if "reports" in document else document
    (finding,) = [f for f in report["findings"] if f["rule"] == "TIE001"]
    return str(finding["fix"])


def _from_sarif(out: str) -> str:
    (result,) = [r for r in json.loads(out)["runs"][0]["results"] if r["ruleId"] == "TIE001"]
    return str(result["message"]["text"]).split(" Fix: ", 1)[1]


def _from_github(out: str) -> str:
    """What the annotation shows: the message after `::`, workflow-command escapes decoded."""
    (line,) = [line for line in out.splitlines() if "TIE001" in line.split("::", 2)[1]]
    shown = line.split("::", 2)[2].replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")
    assert shown.endswith(")")
    return shown.split(" (fix: ", 1)[1][:-1]


def _from_markdown(out: str) -> str:
    """What GitHub shows in the fix cell (a GFM renderer's text of it): what a reader copies."""
    rendered = MarkdownIt("commonmark").enable("table").render(out)
    rows = re.findall(r"<tr>(.*?)</tr>", rendered, flags=re.S)
    (row,) = [r for r in rows if "TIE001" in r]
    cell = re.findall(r"<td>(.*?)</td>", row, flags=re.S)[-1]
    return html.unescape(re.sub(r"<[^>]+>", "", cell))


SHOWN = {
    "text": (["check", "--jobs", "1"], _from_text),
    "json": (["check", "--jobs", "1", "--format", "json"], _from_json),
    "sarif": (["check", "--jobs", "1", "--format", "sarif"], _from_sarif),
    "github": (["check", "--jobs", "1", "--format", "github"], _from_github),
    "markdown": (["check", "--jobs", "1", "--format", "markdown"], _from_markdown),
    "inspect-text": (["inspect"], _from_inspect_text),
    "inspect-json": (["inspect", "--format", "json"], _from_json),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_pasted_fix_names_exactly_the_file_in_every_format(
    attack: str,
    tmp_path: Path,
    stand_in: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = _name(attack)
    work = tmp_path / "work"
    work.mkdir()
    _make(work, name)
    (work / "mX.safetensors").write_bytes(b"decoy")
    monkeypatch.chdir(work)
    monkeypatch.setenv("COLUMNS", "80")  # narrow: a folded command would no longer paste
    for fmt, (args, shown) in SHOWN.items():
        code = main([*args, "--", name])
        out = capsys.readouterr().out
        assert code in (0, 1), (fmt, out)
        command = shown(out)
        assert "\n" not in command and command == printable(command), (fmt, command)
        _assert_retie_argv(_paste(command, cwd=work, bin_dir=stand_in), name)
        _assert_retie_argv(_paste(command, cwd=work, bin_dir=stand_in, history=True), name)


@pytest.mark.parametrize(
    "attack", ["newline", "non_utf8_bytes", "leading_dash_option", "command_substitution"]
)
def test_pasted_fix_runs_the_real_retie_on_exactly_the_file(
    attack: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The printed command, run by bash with the real tieaudit on PATH, re-ties that file."""
    name = _name(attack)
    _make(tmp_path, name)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--jobs", "1", "--", name]) == 1
    command = _from_text(capsys.readouterr().out)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / MARKER).exists()
    out = os.fsencode(tmp_path) + b"/" + os.fsencode(retied_path(name, "safetensors"))
    assert os.path.isfile(out)
    assert sorted(os.listdir(os.fsencode(tmp_path))) == sorted([os.fsencode(name), os.path.basename(out)])


def test_cli_suggestion_to_check_a_folder_names_exactly_the_folder(
    tmp_path: Path, stand_in: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """inspect of a folder holding several models suggests `tieaudit check FOLDER`: pasted, it names it."""
    folder = f"models $(touch {MARKER})\n;`touch {MARKER}`"
    (tmp_path / folder).mkdir()
    for index in range(2):
        _make(tmp_path / folder, f"m{index}.safetensors")
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", folder]) == 2
    (line, *_) = capsys.readouterr().err.splitlines()
    command = re.search(r"; `(.*)` audits the", line)
    assert command is not None, line
    assert _paste(command.group(1), cwd=tmp_path, bin_dir=stand_in) == ["check", folder]


POLICY = """
max-wasted-bytes = 1
[[expect-tie]]
target = "head.weight"
source = "emb.weight"
"""


def test_every_rule_with_a_command_names_the_file_only_in_the_command(
    corpus: Any, tmp_path: Path, stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's view: every rule that suggests a command (TIE001 retie, TIE007 retie of a
    training checkpoint, TIE008 expected tie, TIE009 over the cap, inside prose) builds it as a
    Command; the hostile path is in no text part, and each command pasted names exactly the file."""
    from tieaudit.audit import audit_path
    from tieaudit.core.shell import Command
    from tieaudit.rules.policy import load_policy

    hostile = f"x $(touch {MARKER})\n;'`touch {MARKER}`"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tieaudit.toml").write_text(POLICY)
    policy = load_policy(str(tmp_path / "tieaudit.toml"))
    _make(tmp_path, hostile + ".safetensors")
    shutil.copy(corpus.path("torch_train_copy"), tmp_path / (hostile + ".pt"))
    checked = set()
    for name in (hostile + ".safetensors", hostile + ".pt"):
        for finding in audit_path(name, policy).findings:
            if finding.fix is None or not finding.fix.commands:
                continue
            for part in finding.fix.parts:
                assert isinstance(part, Command) or hostile not in part, (finding.rule, part)
            for command in finding.fix.commands:
                argv = _paste(str(command), cwd=tmp_path, bin_dir=stand_in)
                assert argv[0] == "retie" and os.path.normpath(argv[1]) == name, (finding.rule, argv)
            checked.add(finding.rule)
    assert checked == {"TIE001", "TIE007", "TIE008", "TIE009"}


def test_download_suggestion_for_a_revision_names_exactly_that_revision(
    tmp_path: Path, stand_in: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository id the cache lacks a revision of: the `hf download` it suggests."""
    cache = tmp_path / "hub"
    (cache / "models--org--llama" / "snapshots").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    revision = f"$(touch {MARKER});x"
    assert main(["inspect", f"org/llama@{revision}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    command = re.search(r"never downloads: `(.*)` fetches it", line)
    assert command is not None, line
    argv = _paste(command.group(1), cwd=tmp_path, bin_dir=stand_in)
    assert argv == ["download", "org/llama", "--revision", revision]


# --- the mechanism -------------------------------------------------------------------------------


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_shell_command_reads_back_as_its_argv(attack: str, tmp_path: Path, stand_in: Path) -> None:
    from tieaudit.core.shell import shell_command

    name = _name(attack)
    argv = ["retie", name, "-x", name + "\n", ""]
    shown = shell_command("tieaudit", *argv)
    assert shown == printable(shown) and "\n" not in shown
    assert _paste(shown, cwd=tmp_path, bin_dir=stand_in) == argv


def test_a_command_in_a_paths_place_keeps_the_operand_a_path(tmp_path: Path, stand_in: Path) -> None:
    """A leading '-' becomes './-': the same file, never an option."""
    from tieaudit.core.shell import tieaudit_command

    command = tieaudit_command("retie", "--in-place", "-o", options=("--all-equal",))
    assert _paste(str(command), cwd=tmp_path, bin_dir=stand_in) == [
        "retie",
        "./--in-place",
        "./-o",
        "--all-equal",
    ]


def test_rewriting_a_fixs_paths_edits_argv_not_text() -> None:
    """gate.tasks drops the folder a remote worker read from: only from operands' starts."""
    from tieaudit.core.shell import advice, tieaudit_command

    fix = advice("re-tie (", tieaudit_command("retie", "/base/a/base/m.pt", "OUT"), ") /base/")
    moved = fix.with_paths(lambda path: path.removeprefix("/base/"))
    assert str(moved) == "re-tie (tieaudit retie a/base/m.pt OUT) /base/"


def test_advice_refuses_a_command_written_as_text() -> None:
    from tieaudit.core.shell import Advice

    with pytest.raises(ValueError, match="not built as a Command"):
        Advice(("run tieaudit retie model.pt OUT",))


PATHLIKE = re.compile(r"path|shown|out|file|folder|location|(^|_)dir", re.IGNORECASE)
FIX_MAKER = re.compile(r"(^|_)fix(es)?($|_)")
"""A function whose name says it makes a fix (``_fix``, ``fix_for``; not ``_prefix``)."""
QUOTING = frozenset({"Command", "tieaudit_command", "shell_command", "shell_word"})


def _callee(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def _pathlike(node: ast.AST) -> list[str]:
    """Path-like names read in node, outside the calls that quote them."""
    if isinstance(node, ast.Call) and _callee(node) in QUOTING:
        return []
    here = []
    if isinstance(node, ast.Name) and PATHLIKE.search(node.id):
        here.append(node.id)
    if isinstance(node, ast.Attribute) and PATHLIKE.search(node.attr):
        here.append(node.attr)
    return here + [name for child in ast.iter_child_nodes(node) for name in _pathlike(child)]


def _text_built_from_paths(node: ast.AST) -> Iterator[str]:
    """Text made from a path-like value inside node: an f-string, '+' or '%' on text, str.format,
    or a fix edited as text (``fix.replace``); quoting calls are not looked into."""
    if isinstance(node, ast.Call) and _callee(node) in QUOTING:
        return
    if isinstance(node, ast.JoinedStr):
        for value in node.values:
            if isinstance(value, ast.FormattedValue) and _pathlike(value.value):
                yield f"f-string with {_pathlike(value.value)}"
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        names = _pathlike(node.left) + _pathlike(node.right)
        if names and any(isinstance(side, (ast.Constant, ast.JoinedStr)) for side in (node.left, node.right)):
            yield f"text concatenated with {names}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format" and any(_pathlike(a) for a in [*node.args, *node.keywords]):
            yield "str.format of a path"
        if node.func.attr == "replace" and "fix" in ast.unparse(node.func.value):
            yield "a fix edited as text"
    for child in ast.iter_child_nodes(node):
        yield from _text_built_from_paths(child)


def fix_text_violations(source: str) -> list[str]:
    """Where a fix's text is built from a path (`fix=`, `fix = `, advice(...) arguments, and all of
    a function whose name says it makes a fix)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        values: list[ast.AST] = []
        if isinstance(node, ast.keyword) and node.arg == "fix":
            values.append(node.value)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "fix" for t in node.targets
        ):
            values.append(node.value)
        elif isinstance(node, ast.Call) and _callee(node) in ("advice", "Advice"):
            values += node.args
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and FIX_MAKER.search(node.name):
            values += node.body
        for value in values:
            found += [f"line {getattr(value, 'lineno', 0)}: {why}" for why in _text_built_from_paths(value)]
    return found


def test_the_source_check_sees_a_path_interpolated_into_a_fix() -> None:
    assert fix_text_violations('X.finding(n, "m", fix=f"tieaudit retie {ckpt.path} OUT")')
    assert fix_text_violations('fix = "retie " + out')
    assert fix_text_violations(
        "def _fix(c):\n    command = f'tieaudit retie {c.path} {out}'\n    return command"
    )
    assert fix_text_violations('replace(f, fix=f.fix.replace(prefix, ""))')
    assert not fix_text_violations(
        'fix = advice("re-tie (", tieaudit_command("retie", ckpt.path, "OUT"), ")")'
    )


def test_no_fix_in_tieaudit_interpolates_a_path_into_text() -> None:
    found = {
        str(path.relative_to(ROOT)): violations
        for path in sorted(PACKAGE.rglob("*.py"))
        if (violations := fix_text_violations(path.read_text()))
    }
    assert found == {}


def test_a_fix_line_is_one_command_and_prose_is_advice() -> None:
    """Only a single command is labelled ``fix:`` (pasted, it runs); prose is ``advice:``."""
    from tieaudit.core.shell import Advice, tieaudit_command

    command = tieaudit_command("retie", "in.pt", "out.pt")
    assert Advice((command,)).label == "fix"
    assert Advice(("do not load this file with weights_only=False",)).label == "advice"
    assert Advice(("run ", command, " then check again")).label == "advice"


@pytest.mark.parametrize("fmt", ["text", "github"])
def test_every_fix_line_of_a_failing_folder_is_a_tieaudit_command(tmp_path: Path, fmt: str) -> None:
    """TIE010 (a pickle that runs code) and TIE001 side by side: every ``fix:`` shown is a command
    that shlex splits into ``tieaudit ...``; TIE010's prose comes as ``advice:``."""
    import pickle
    import shlex

    (tmp_path / "payload.pkl").write_bytes(pickle.dumps(os.system, protocol=2))
    shutil.copy(ROOT / "fixtures" / "generated" / "safetensors" / "cloned_head.safetensors", tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(tmp_path), "--format", fmt],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    assert "TIE010" in out.stdout and "advice: do not load" in out.stdout, out.stdout
    fixes = [line.split("fix: ", 1)[1].rstrip(")") for line in out.stdout.splitlines() if "fix: " in line]
    assert fixes, out.stdout
    for fix in fixes:
        assert shlex.split(fix)[:2] == ["tieaudit", "retie"], fix
