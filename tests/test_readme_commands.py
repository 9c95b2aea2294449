"""Every command README.md shows runs as written (issue 14), or this file says why not and what covers it.

- ``sh`` blocks: each block runs as one bash session (state such as an activated venv carries over, as
  when a reader types the lines), in a fresh copy of the repository holding the files the examples
  name. ``tieaudit`` is this checkout (a shim running ``python -m tieaudit``) until a line installs
  it into a venv of the block's own. Each line must exit 0 or 1, or the exit its comment states.
  A line that cannot run here goes in NOT_RUN with the reason and the test that covers it.
- ``yaml`` blocks: the GitHub Actions job (its steps run, see test_the_actions_job_runs) and the
  pre-commit configuration (its hook runs through ``pre-commit try-repo``).
- ``toml`` blocks: policies, loaded by tieaudit.
A block of any other language, or a yaml block of another kind, fails until it is classified here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from conftest import Corpus
from readme_blocks import (
    PLACEHOLDER_URL,
    README,
    ROOT,
    Block,
    blocks,
    commands,
    git,
    hosted_repository,
    installs_tieaudit,
    is_release_tag,
    local,
    tags,
)

from tieaudit.rules.policy import load_policy

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

BLOCKS = blocks()
SH_BLOCKS = [b for b in BLOCKS if b.language == "sh"]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# Commands of the sh blocks that are not run, with the reason and what covers them instead.
NOT_RUN = {
    "make demo": "creates .venv with torch and transformers (minutes); its script, scripts/demo.py, runs in "
    "tests/test_docs.py::test_the_demo_runs_to_a_passing_check",
    "make test": "the whole suite (tens of minutes): CI's entry point (.ci/run) runs it",
    'eval "$(_TIEAUDIT_COMPLETE=zsh_source tieaudit)"': "zsh syntax, which bash cannot eval; "
    "tests/test_terminal.py::test_shell_completion generates the zsh source",
    ". .venv/bin/activate": "needs the .venv of make; test_make_installs_the_command_into_venv_bin checks "
    "that make installs the tieaudit command there",
    "tieaudit check models/ --executor dask://scheduler:8786 --exclude 'models/legacy/**' --format sarif "
    "-o tieaudit.sarif": "needs a running Dask scheduler; tests/test_executor_dask.py runs check on a "
    "LocalCluster and compares its JSON and SARIF with --jobs 1 (test_host_port_without_protocol_and_sarif)",
}
# Languages of fenced blocks, and how each is covered.
KINDS = {
    "sh": "run line by line: test_every_sh_block_runs",
    "yaml": "the Actions job or the pre-commit configuration: test_the_actions_job_runs, "
    "test_the_pre_commit_hook_runs_through_try_repo",
    "toml": "loaded as a policy: test_every_toml_block_is_a_valid_policy",
    "text": "output excerpts, not commands",
    "": "diagrams (the Architecture tree), not commands",
}
# Graphviz is not installed here: a stand-in `dot` (used only when no real one is on PATH) checks
# that its input is one DOT digraph and writes a minimal SVG.
DOT_STAND_IN = """#!/bin/sh
input=$(cat)
case "$input" in digraph*"}") ;; *) echo "dot stand-in: not a DOT digraph" >&2; exit 1 ;; esac
echo '<svg xmlns="http://www.w3.org/2000/svg"/>'
"""


def yaml_kind(block: Block) -> str:
    document = yaml.safe_load(block.text)
    if isinstance(document, dict) and "jobs" in document:
        return "workflow"
    if isinstance(document, dict) and "repos" in document:
        return "pre-commit"
    if isinstance(document, list) and all(isinstance(step, dict) and "run" in step for step in document):
        return "steps"  # steps to add to the job: test_output_formats.py runs the job-summary recipe
    return "unknown"


def test_every_block_is_of_a_kind_this_test_covers() -> None:
    unknown = [f"README.md:{b.line}: ```{b.language}" for b in BLOCKS if b.language not in KINDS]
    assert not unknown, f"blocks no test runs (add them to KINDS and run them): {unknown}"
    kinds = [yaml_kind(b) for b in BLOCKS if b.language == "yaml"]
    assert sorted(kinds) == ["pre-commit", "steps", "workflow"], kinds
    shown = {c.text for b in SH_BLOCKS for c in commands(b)}
    stale = sorted(set(NOT_RUN) - shown)
    assert not stale, f"NOT_RUN names commands README.md no longer shows: {stale}"


def example_files(corpus: Corpus, where: Path) -> None:
    """The files the Usage examples name, from the corpus: a copy in each single file, folders."""
    shutil.copy(corpus.path("torch_cloned_head"), where / "model.pt")
    # README: exit 1 on findings, and retie --dry-run plans the tie (a bare file of a class it recognises)
    shutil.copy(corpus.path("st_gpt2_cloned_head"), where / "model.safetensors")
    shutil.copy(corpus.path("onnx_gpt2_tied_dynamo"), where / "model.onnx")
    shutil.copytree(corpus.path("hf_llama_cloned_head"), where / "my-llama")
    shutil.copytree(corpus.path("hf_gpt2"), where / "release")
    (where / "models" / "legacy").mkdir(parents=True)
    shutil.copy(corpus.path("st_cloned_head"), where / "models" / "cloned.safetensors")
    shutil.copytree(corpus.path("hf_llama_tied"), where / "models" / "llama")
    shutil.copy(corpus.path("torch_untied_lm"), where / "models" / "legacy" / "old.pt")
    (where / "tieaudit.toml").write_text('fail-on = "warning"\n')


def a_clone(where: Path) -> Path:
    """The repository's tracked files as they are now (uncommitted edits included): a fresh clone."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, where / name)
    return where


def clean_env(path: list[str]) -> dict[str, str]:
    """No venv active, no PYTHONPATH: what runs is what the PATH given finds."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    system = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "tieaudit").exists()]
    env["PATH"] = os.pathsep.join([*path, *system])
    env["HF_HUB_OFFLINE"] = "1"
    return env


def shims(where: Path) -> tuple[Path, Path]:
    """bin/tieaudit running this checkout; a last-resort dot/ for Graphviz (see DOT_STAND_IN)."""
    (where / "bin").mkdir()
    (where / "fallback").mkdir()
    shim = where / "bin" / "tieaudit"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m tieaudit "$@"\n')
    (where / "fallback" / "dot").write_text(DOT_STAND_IN)
    for script in (shim, where / "fallback" / "dot"):
        script.chmod(0o755)
    return where / "bin", where / "fallback"


def session_script(block: Block, log: Path, hosted: Path) -> str:
    """One bash session: each command's output and exit go to log/N.*; installs are checked after."""
    lines = ["set -o pipefail"]
    for n, command in enumerate(commands(block)):
        if command.text in NOT_RUN:
            continue
        if installs_tieaudit(command.text):  # a real install, not 'already satisfied'; never outside a venv
            lines.append(
                f"python -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' || "
                f"{{ echo 'no venv is active' > {log}/{n}.out; echo 99 > {log}/{n}.rc; exit; }}"
            )
            lines.append("python -m pip uninstall -qy tieaudit >/dev/null 2>&1")
        lines += [f"{{\n{local(command.text, hosted)}\n}} > {log}/{n}.out 2>&1", f"echo $? > {log}/{n}.rc"]
        if installs_tieaudit(command.text):
            lines.append(
                f"{{ command -v tieaudit; tieaudit --version; python -c 'import importlib.util as u; "
                f'print("torch" if u.find_spec("torch") else "no torch")\'; }} > {log}/{n}.after 2>&1'
            )
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the README's `OWNER/tieaudit` URL points in these tests: a bare clone with the release tag."""
    return hosted_repository(f"v{VERSION}", tmp_path_factory.mktemp("hosted"))


@pytest.fixture
def workspace(corpus: Corpus, tmp_path: Path) -> Path:
    where = a_clone(tmp_path / "clone")
    example_files(corpus, where)
    return where


@pytest.mark.parametrize("block", SH_BLOCKS, ids=[f"README.md:{b.line}" for b in SH_BLOCKS])
def test_every_sh_block_runs(block: Block, workspace: Path, hosted: Path, tmp_path: Path) -> None:
    bin_dir, fallback = shims(tmp_path)
    log = tmp_path / "log"
    log.mkdir()
    script = tmp_path / "session.sh"
    script.write_text(session_script(block, log, hosted))
    env = clean_env([str(bin_dir)])
    env["PATH"] += os.pathsep + str(fallback)
    env["HF_HOME"] = str(tmp_path / "hf-home")  # an empty Hugging Face cache: nothing from this machine
    env["HOME"] = str(tmp_path / "home")  # shell set-up lines (completion) write here, not in the real home
    (tmp_path / "home").mkdir()
    subprocess.run(
        ["bash", "--noprofile", "--norc", str(script)], cwd=workspace, env=env, timeout=300, check=False
    )  # fmt: skip
    for n, command in enumerate(commands(block)):
        if command.text in NOT_RUN:
            continue
        where = f"README.md:{command.line}: {command.text}"
        assert (log / f"{n}.rc").exists(), f"{where}: not reached"
        output = (log / f"{n}.out").read_text()
        status = int((log / f"{n}.rc").read_text())
        assert status in command.expected_exit, (
            f"{where}: exit {status}, expected {command.expected_exit} (make it work, or add it to NOT_RUN "
            f"with the reason and the test that covers it)\n{output[-3000:]}"
        )
        if installs_tieaudit(command.text):
            found, version, torch = (log / f"{n}.after").read_text().splitlines()[:3]
            assert Path(found).is_relative_to(workspace), f"{where}: tieaudit is {found}, not the venv's"
            assert version == f"tieaudit, version {VERSION}", f"{where}: {version}"
            if "[" not in command.text:
                assert torch == "no torch", f"{where}: the core pulled in torch"


def test_make_installs_the_command_into_venv_bin() -> None:
    """The contributor's `. .venv/bin/activate` (or `.venv/bin/tieaudit`): make's venv gets the command."""
    makefile = (ROOT / "Makefile").read_text()
    assert "VENV := .venv\n" in makefile and "PY := $(VENV)/bin/python\n" in makefile
    assert "$(PY) -m pip install -q -e '.[" in makefile  # the project itself, with its console script
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tieaudit"] == "tieaudit.cli.launch:main"
    assert "tieaudit: command not found" not in README.read_text()


def test_every_toml_block_is_a_valid_policy(tmp_path: Path) -> None:
    tomls = [b for b in BLOCKS if b.language == "toml"]
    assert tomls
    for block in tomls:
        (tmp_path / "tieaudit.toml").write_text(block.text)
        load_policy(str(tmp_path / "tieaudit.toml"))  # raises on an unknown key or a bad value


def the_yaml(kind: str) -> dict[object, object]:
    (block,) = [b for b in BLOCKS if b.language == "yaml" and yaml_kind(b) == kind]
    document: dict[object, object] = yaml.safe_load(block.text)
    return document


def pre_commit_repo() -> dict[str, Any]:
    repos = the_yaml("pre-commit")["repos"]
    assert isinstance(repos, list) and len(repos) == 1 and isinstance(repos[0], dict)
    return repos[0]


def test_the_revisions_readme_names_are_release_tags() -> None:
    """`rev:` of the pre-commit configuration and `@rev` of every install line name the release of the
    version in pyproject.toml, and where this clone has tags (a developer's, the release machine's) that
    release is an annotated tag whose pyproject.toml has that version.

    A clone without tags (CI clones the branch only) cannot show the tag: there the install and hook
    tests run against `hosted_repository`, which tags HEAD as the stand-in release."""
    repo = pre_commit_repo()
    assert repo["repo"] == PLACEHOLDER_URL
    revs = {repo["rev"]}
    text = README.read_text()
    revs |= {part.split("'")[0].split('"')[0] for part in text.split(f"{PLACEHOLDER_URL}@")[1:]}
    assert revs == {f"v{VERSION}"}, revs
    if not tags():
        return
    rev = f"v{VERSION}"
    assert is_release_tag(rev), (
        f"{rev} is not an annotated tag of the repository: git tag -a {rev} -m 'tieaudit {rev}'"
    )
    tagged = tomllib.loads(git("show", f"{rev}:pyproject.toml"))["project"]["version"]
    assert tagged == VERSION, f"the tag {rev} is on a commit whose version is {tagged}"


def job_steps() -> list[dict[str, object]]:
    workflow = the_yaml("workflow")
    (job,) = workflow["jobs"].values()  # type: ignore[attr-defined]
    assert job["runs-on"] == "ubuntu-latest"
    steps: list[dict[str, object]] = job["steps"]
    return steps


def run_job(
    steps: list[dict[str, object]], repository: Path, python: Path, hosted: Path
) -> list[tuple[str, int]]:
    """The job as Actions runs it: steps in order; after a failure only `!cancelled()`/`always()` steps.
    Stand-ins: checkout (the folder is the repository), setup-python (a fresh venv), upload-sarif (the
    file it names must be SARIF 2.1.0)."""
    ran: list[tuple[str, int]] = []
    failed = False
    for step in steps:
        condition = str(step.get("if", ""))
        if failed and not any(c in condition for c in ("!cancelled()", "always()", "failure()")):
            continue
        uses, config = str(step.get("uses", "")), step.get("with", {})
        assert isinstance(config, dict)
        if uses.startswith("actions/checkout@"):
            status = 0
        elif uses.startswith("actions/setup-python@"):
            assert float(str(config["python-version"])) >= 3.10
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(python)], check=True)
            status = 0
        elif uses.startswith("github/codeql-action/upload-sarif@"):
            document = json.loads((repository / str(config["sarif_file"])).read_text())
            status = 0 if document["version"] == "2.1.0" and config.get("category") else 1
        elif "run" in step:
            env = clean_env([str(python / "bin")])
            done = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", local(str(step["run"]), hosted)],
                cwd=repository, env=env, capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            status = done.returncode
            assert status in (0, 1), (
                f"{step['run']}: exit {status}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        else:
            raise AssertionError(f"a step this test cannot run: {step}")
        ran.append((str(step.get("run", uses)), status))
        failed = failed or status != 0
    return ran


def test_the_actions_job_runs(corpus: Corpus, hosted: Path, tmp_path: Path) -> None:
    """A copy fails the job at the check step, the SARIF is uploaded anyway and names only the copy (the
    clean model folder beside it has no result)."""
    steps = job_steps()
    repository = tmp_path / "repository"
    (repository / "models").mkdir(parents=True)
    shutil.copy(corpus.path("st_cloned_head"), repository / "models" / "cloned.safetensors")
    shutil.copytree(corpus.path("hf_llama_tied"), repository / "models" / "llama")
    python = tmp_path / "python"
    ran = run_job(steps, repository, python, hosted)
    assert len(ran) == len(steps)
    install = [status for command, status in ran if installs_tieaudit(command)]
    assert install == [0]
    assert Path(str(shutil.which("tieaudit", path=str(python / "bin")))).parent == python / "bin"
    checks = [status for command, status in ran if command.startswith("tieaudit check")]
    assert checks == [1]  # the job fails; the upload still ran (if: !cancelled())
    (sarif,) = [str(s["with"]["sarif_file"]) for s in steps if "upload-sarif" in str(s.get("uses"))]  # type: ignore[index]
    (result,) = json.loads((repository / sarif).read_text())["runs"][0]["results"]
    assert result["ruleId"] == "TIE001"
    assert (
        result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "models/cloned.safetensors"
    )


def test_the_pre_commit_hook_runs_through_try_repo(corpus: Corpus, tmp_path: Path) -> None:
    """README's hook on the staged checkpoints: a copy fails the commit with TIE001, a clean one is ok.

    try-repo builds the hook's environment in a temporary store each time (pip installs this repository
    with its dependencies: ~15 s on an idle machine), so one run covers both checkpoints."""
    (hook,) = pre_commit_repo()["hooks"]
    assert set(hook) == {"id"}  # no args: the README's hook fails on warnings, TIE001 included
    repository = tmp_path / "work"
    repository.mkdir()
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    shutil.copy(corpus.path("st_save_model_tied"), repository / "clean.safetensors")
    shutil.copy(corpus.path("st_cloned_head"), repository / "copy.safetensors")
    (repository / "notes.txt").write_text("not a checkpoint\n")
    subprocess.run(
        ["git", "add", "clean.safetensors", "copy.safetensors", "notes.txt"], cwd=repository, check=True
    )
    env = clean_env([str(Path(sys.executable).parent)])
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")
    done = subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), hook["id"]],
        cwd=repository, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tieaudit check" in done.stdout and "Failed" in done.stdout and "exit code: 1" in done.stdout
    lines = done.stdout.splitlines()
    assert any(line.startswith("FAIL copy.safetensors") for line in lines), done.stdout
    assert any(line.startswith("ok") and "clean.safetensors" in line for line in lines), done.stdout
    assert "TIE001" in done.stdout and "notes.txt" not in done.stdout
