"""A stand-in for the GitHub Actions runner, enough to run the docs' workflows and the repository's own
composite action (action.yml) here, offline (for tests/test_readme_commands.py).

Steps run in order; after a failure only steps whose ``if`` admits it (``!cancelled()``, ``always()``,
``failure()``). Stand-ins for the actions the recipes use: ``actions/checkout`` (the folder is the
repository), ``actions/setup-python`` (a fresh venv), ``github/codeql-action/upload-sarif`` (the file it
names must be SARIF 2.1.0 with a category). ``uses: OWNER/tieaudit@REF`` runs action.yml as the runner
does: the hosted repository at REF (a branch or a commit; never a tag: it has none) checked out into
its own folder (``GITHUB_ACTION_PATH``), its inputs' defaults under the workflow's ``with``, its
composite steps with ``GITHUB_OUTPUT`` and ``GITHUB_STEP_SUMMARY`` files per step. An expression this
stand-in does not know fails the test rather than being guessed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from readme_blocks import PLACEHOLDER_URL, local

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
OWN_ACTION = PLACEHOLDER_URL.removeprefix("https://github.com/") + "@"


@dataclass
class Run:
    """What one job run did."""

    repository: Path
    python: Path
    hosted: Path
    env: dict[str, str]
    steps: list[tuple[str, int]] = field(default_factory=list)
    """(what ran, its exit status) in order."""
    stdout: list[str] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    """What each step wrote to GITHUB_STEP_SUMMARY."""
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    """step id -> its outputs (GITHUB_OUTPUT)."""


def _value(expression: str, inputs: dict[str, str], run: Run) -> str:
    parts = expression.split(".")
    if len(parts) == 2 and parts[0] == "inputs":
        assert parts[1] in inputs, f"unknown input {parts[1]}"
        return inputs[parts[1]]
    if len(parts) == 4 and parts[0] == "steps" and parts[2] == "outputs":
        return run.outputs.get(parts[1], {}).get(parts[3], "")
    quoted = re.fullmatch(r"'([^']*)'", expression)
    if quoted:
        return quoted.group(1)
    raise AssertionError(f"an expression the stand-in does not evaluate: {expression}")


def substitute(text: str, inputs: dict[str, str], run: Run) -> str:
    return EXPRESSION.sub(lambda m: _value(m.group(1), inputs, run), text)


def admitted(condition: str, failed: bool, inputs: dict[str, str], run: Run) -> bool:
    """A step's ``if``: a conjunction of status functions and == / != comparisons."""
    condition = condition.strip()
    match = EXPRESSION.fullmatch(condition)
    terms = [t.strip() for t in (match.group(1) if match else condition).split("&&")] if condition else []
    status_given = False
    verdict = True
    for term in terms:
        if term in ("!cancelled()", "always()"):
            status_given = True
        elif term == "failure()":
            status_given, verdict = True, verdict and failed
        elif term == "success()":
            status_given, verdict = True, verdict and not failed
        else:
            compared = re.fullmatch(r"(\S+)\s*(==|!=)\s*(\S+)", term)
            assert compared, f"a condition the stand-in does not evaluate: {term}"
            left, right = _value(compared.group(1), inputs, run), _value(compared.group(3), inputs, run)
            verdict = verdict and ((left == right) == (compared.group(2) == "=="))
    return verdict and (status_given or not failed)


def _bash(script: str, run: Run, *, cwd: Path, env: dict[str, str]) -> int:
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", local(script, run.hosted)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    run.stdout.append(done.stdout)
    assert done.returncode in (0, 1), (
        f"{script}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    )
    return done.returncode


def _files(run: Run, name: str) -> tuple[Path, Path]:
    folder = run.repository.parent / "runner" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "output", folder / "summary"


def step(spec: dict[str, Any], run: Run, inputs: dict[str, str], *, number: str) -> int:
    """One step of a job or of the composite action."""
    uses = str(spec.get("uses", ""))
    config = {k: substitute(str(v), inputs, run) for k, v in (spec.get("with") or {}).items()}
    if uses.startswith("actions/checkout@"):
        return 0
    if uses.startswith("actions/setup-python@"):
        assert float(config["python-version"]) >= 3.10
        if not run.python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(run.python)], check=True)
        return 0
    if uses.startswith("github/codeql-action/upload-sarif@"):
        document = json.loads((run.repository / config["sarif_file"]).read_text())
        return 0 if document["version"] == "2.1.0" and config.get("category") else 1
    if uses.startswith(OWN_ACTION):
        return run_action(uses.removeprefix(OWN_ACTION), config, run)
    assert "run" in spec, f"a step this stand-in cannot run: {spec}"
    output, summary = _files(run, number)
    env = dict(run.env)
    env.update({k: substitute(str(v), inputs, run) for k, v in (spec.get("env") or {}).items()})
    env.update(
        GITHUB_OUTPUT=str(output), GITHUB_STEP_SUMMARY=str(summary), GITHUB_WORKSPACE=str(run.repository)
    )
    output.touch()
    summary.touch()
    status = _bash(substitute(str(spec["run"]), inputs, run), run, cwd=run.repository, env=env)
    if "id" in spec:
        lines = output.read_text().splitlines()
        run.outputs[str(spec["id"])] = dict(line.split("=", 1) for line in lines if "=" in line)
    run.summaries.append(summary.read_text())
    return status


def run_steps(steps: list[dict[str, Any]], run: Run, inputs: dict[str, str], *, prefix: str) -> int:
    failed = 0
    for n, spec in enumerate(steps):
        if not admitted(str(spec.get("if", "")), bool(failed), inputs, run):
            continue
        status = step(spec, run, inputs, number=f"{prefix}{n}")
        run.steps.append((str(spec.get("run", spec.get("uses"))), status))
        failed = failed or status
    return failed


def run_action(ref: str, given: dict[str, str], run: Run) -> int:
    """action.yml of the hosted repository at ref, as a composite action."""
    commit = subprocess.run(
        ["git", "-C", str(run.hosted), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    where = run.repository.parent / "actions" / commit
    if not where.exists():
        where.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(run.hosted), "archive", commit], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    action = yaml.safe_load((where / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    declared = action.get("inputs") or {}
    unknown = set(given) - set(declared)
    assert not unknown, f"inputs action.yml does not declare: {sorted(unknown)}"
    inputs = {name: str(spec.get("default", "")) for name, spec in declared.items()}
    inputs.update(given)
    saved = run.env.get("GITHUB_ACTION_PATH")
    run.env["GITHUB_ACTION_PATH"] = str(where)
    try:
        return run_steps(action["runs"]["steps"], run, inputs, prefix=f"action-{commit[:8]}-")
    finally:
        if saved is None:
            run.env.pop("GITHUB_ACTION_PATH")


def run_job(workflow: dict[str, Any], run: Run) -> int:
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    run.env["PATH"] = os.pathsep.join([str(run.python / "bin"), run.env["PATH"]])
    return run_steps(job["steps"], run, {}, prefix="job-")
