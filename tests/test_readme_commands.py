"""Every command README.md and docs/ show runs as written (issue 14, 26), or this file says why not and
what covers it, against a bare clone of the repository without tags (the published repository has none).

- ``sh`` blocks: each block runs as one bash session (state such as an activated venv carries over, as
  when a reader types the lines), in a fresh copy of the repository holding the files the examples
  name. ``tieaudit`` is this checkout (a shim running ``python -m tieaudit``) until a line installs
  it into a venv of the block's own. Each line must exit 0 or 1, or the exit its comment states.
  A line that cannot run here goes in NOT_RUN with the reason and the test that covers it.
- ``yaml`` blocks: GitHub Actions jobs (their steps run on tests/actions_standin.py, the repository's
  own action.yml included: test_every_workflow_runs) and the pre-commit configuration (with the ``sh``
  block that freezes and runs it: test_the_pre_commit_recipe_runs).
- ``toml`` blocks: policies, loaded by tieaudit. ``python`` blocks: each page's blocks run in order as
  scripts (test_every_python_page_runs). ``console`` blocks: commands and their output
  (tests/test_docs_output.py).
A block of any other language, or a yaml block of another kind, fails until it is classified here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from actions_standin import Run, run_job
from conftest import Corpus
from readme_blocks import (
    DEFAULT_BRANCH,
    DOCS,
    PLACEHOLDER_URL,
    README,
    ROOT,
    Block,
    all_blocks,
    commands,
    git,
    hosted_repository,
    installs_tieaudit,
    local,
    tags,
)

from tieaudit.rules.policy import load_policy

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

BLOCKS = all_blocks()


def runs_pre_commit(block: Block) -> bool:
    return any(c.text.startswith("pre-commit ") for c in commands(block))


PRE_COMMIT_SH = [b for b in BLOCKS if b.language == "sh" and runs_pre_commit(b)]
"""The sh block that freezes and runs the pre-commit configuration: test_the_pre_commit_recipe_runs."""
SH_BLOCKS = [b for b in BLOCKS if b.language == "sh" and not runs_pre_commit(b)]
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
    "python": "run in order, one page's blocks as one reader would: test_every_python_page_runs",
    "console": "commands and their exact output: tests/test_docs_output.py",
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
    unknown = [f"{b.where}: ```{b.language}" for b in BLOCKS if b.language not in KINDS]
    assert not unknown, f"blocks no test runs (add them to KINDS and run them): {unknown}"
    kinds = [yaml_kind(b) for b in BLOCKS if b.language == "yaml"]
    assert "unknown" not in kinds and {"pre-commit", "steps", "workflow"} <= set(kinds), kinds
    assert kinds.count("pre-commit") == 1 and len(PRE_COMMIT_SH) == 1
    shown = {c.text for b in SH_BLOCKS for c in commands(b)}
    stale = sorted(set(NOT_RUN) - shown)
    assert not stale, f"NOT_RUN names commands the pages no longer show: {stale}"
    assert README.read_text().count("\n") <= 300, "README.md is the newcomer's page: at most 300 lines"


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
    """Where the pages' `OWNER/tieaudit` URL points in these tests: a bare clone without tags."""
    return hosted_repository(tmp_path_factory.mktemp("hosted"))


@pytest.fixture
def workspace(corpus: Corpus, tmp_path: Path) -> Path:
    where = a_clone(tmp_path / "clone")
    example_files(corpus, where)
    return where


@pytest.mark.parametrize("block", SH_BLOCKS, ids=[b.where for b in SH_BLOCKS])
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
        where = f"{block.page.relative_to(ROOT)}:{command.line}: {command.text}"
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
    assert "$(PY) -m pip install -q -c constraints.txt -e '.[" in makefile  # the project, its console script
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tieaudit"] == "tieaudit.cli.launch:main"
    assert "tieaudit: command not found" not in README.read_text()


def test_every_toml_block_is_a_valid_policy(tmp_path: Path) -> None:
    tomls = [b for b in BLOCKS if b.language == "toml"]
    assert tomls
    for block in tomls:
        (tmp_path / "tieaudit.toml").write_text(block.text)
        load_policy(str(tmp_path / "tieaudit.toml"))  # raises on an unknown key or a bad value


def the_yamls(kind: str) -> list[Block]:
    return [b for b in BLOCKS if b.language == "yaml" and yaml_kind(b) == kind]


def pre_commit_repo() -> dict[str, Any]:
    (block,) = the_yamls("pre-commit")
    repos = yaml.safe_load(block.text)["repos"]
    assert isinstance(repos, list) and len(repos) == 1 and isinstance(repos[0], dict)
    return repos[0]


REVISION = re.compile(r"OWNER/tieaudit@([^\s'\"`]+)")


def test_no_recipe_needs_a_tag() -> None:
    """Every revision a page installs or uses is the default branch, a commit the reader looked up
    (`$rev`), or the `<commit>` a comment points to; pre-commit's `rev:` is the branch, frozen to its
    commit by the command beside it. The published repository has no tags, and neither has the clone
    these tests install from."""
    shown = {m.group(1) for page in DOCS for m in REVISION.finditer(page.read_text())}
    assert shown and shown <= {DEFAULT_BRANCH, "$rev", "<commit>:"}, shown
    assert pre_commit_repo()["repo"] == PLACEHOLDER_URL and pre_commit_repo()["rev"] == DEFAULT_BRANCH


def test_the_hosted_clone_has_no_tags(hosted: Path) -> None:
    assert tags(hosted) == []
    assert git("symbolic-ref", "HEAD", where=hosted) == f"refs/heads/{DEFAULT_BRANCH}"


def models_repository(corpus: Corpus, where: Path) -> Path:
    """A model repository for the CI recipes: a copy (TIE001) and a clean model folder."""
    (where / "models").mkdir(parents=True)
    shutil.copy(corpus.path("st_cloned_head"), where / "models" / "cloned.safetensors")
    shutil.copytree(corpus.path("hf_llama_tied"), where / "models" / "llama")
    return where


WORKFLOWS = sorted({b.text: b for b in the_yamls("workflow")}.values(), key=lambda b: b.where)


@pytest.mark.parametrize("block", WORKFLOWS, ids=[b.where for b in WORKFLOWS])
def test_every_workflow_runs(block: Block, corpus: Corpus, hosted: Path, tmp_path: Path) -> None:
    """A copy fails the job; SARIF naming only the copy is uploaded anyway, the job summary has the
    markdown report, the action (when used) annotates the file and installs from the hosted commit."""
    repository = models_repository(corpus, tmp_path / "repository")
    run = Run(repository=repository, python=tmp_path / "python", hosted=hosted, env=clean_env([]))
    status = run_job(yaml.safe_load(block.text), run)
    assert status == 1, run.steps
    checks = [code for ran, code in run.steps if "tieaudit check" in ran and "--format" in ran]
    assert checks in ([1], [0]), run.steps  # the action's check step records the status, its verdict fails
    uploads = [code for ran, code in run.steps if "upload-sarif" in ran]
    assert uploads == [0], run.steps
    (sarif,) = repository.glob("*.sarif")
    (result,) = json.loads(sarif.read_text())["runs"][0]["results"]
    assert result["ruleId"] == "TIE001"
    assert (
        result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "models/cloned.safetensors"
    )
    assert any("FAIL `models/cloned.safetensors`" in summary for summary in run.summaries)
    tieaudit = run.python / "bin" / "tieaudit"
    version = subprocess.run([str(tieaudit), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"tieaudit, version {VERSION}"
    if "uses: OWNER/tieaudit@" in block.text:
        assert any("::warning file=models/cloned.safetensors" in out for out in run.stdout)


def test_the_pre_commit_recipe_runs(corpus: Corpus, hosted: Path, tmp_path: Path) -> None:
    """The configuration, frozen to the hosted main's commit by the page's command, then run: a copy
    fails the hook with TIE001, the clean checkpoint beside it is ok, a text file is not passed."""
    (block,) = PRE_COMMIT_SH
    (hook,) = pre_commit_repo()["hooks"]
    assert set(hook) == {"id"}  # no args: the hook fails on warnings, TIE001 included
    repository = tmp_path / "work"
    repository.mkdir()
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    (config,) = the_yamls("pre-commit")
    (repository / ".pre-commit-config.yaml").write_text(local(config.text, hosted))
    shutil.copy(corpus.path("st_save_model_tied"), repository / "clean.safetensors")
    shutil.copy(corpus.path("st_cloned_head"), repository / "copy.safetensors")
    (repository / "notes.txt").write_text("not a checkpoint\n")
    subprocess.run(["git", "add", "-A"], cwd=repository, check=True)
    env = clean_env([str(Path(sys.executable).parent)])
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")
    outputs = []
    for command in commands(block):
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", local(command.text, hosted)],
            cwd=repository, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode in command.expected_exit, (
            f"{block.where}: {command.text}\n{done.stdout}{done.stderr}"
        )
        outputs.append(done.stdout)
    frozen = yaml.safe_load((repository / ".pre-commit-config.yaml").read_text())["repos"][0]["rev"]
    assert frozen == git("rev-parse", f"refs/heads/{DEFAULT_BRANCH}", where=hosted)
    lines = outputs[-1].splitlines()
    assert any(line.startswith("FAIL copy.safetensors") for line in lines), outputs[-1]
    assert any(line.startswith("ok") and "clean.safetensors" in line for line in lines), outputs[-1]
    assert "TIE001" in outputs[-1] and "notes.txt" not in outputs[-1]


PYTHON_PAGES = sorted({b.page for b in BLOCKS if b.language == "python"})


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=[str(p.relative_to(ROOT)) for p in PYTHON_PAGES])
def test_every_python_page_runs(page: Path, workspace: Path) -> None:
    """A page's python blocks, in order, each a script run in the examples' folder with this checkout."""
    env = clean_env([])
    env["PYTHONPATH"] = str(ROOT)
    for block in [b for b in BLOCKS if b.page == page and b.language == "python"]:
        done = subprocess.run(
            [sys.executable, "-c", block.text], cwd=workspace, env=env, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{block.where}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
