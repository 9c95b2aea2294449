"""`check --executor dask://ADDRESS` (issue 16): the audits run on a Dask cluster's workers and the
report, the baseline and the exit code are those of `--jobs 1`, byte for byte.

The cluster is a real one on loopback: a LocalCluster of two worker processes, started once for the
module in a folder of its own, so a relative PATH works only if the executor sends where it is
relative to. The workers import this checkout (PYTHONPATH, inherited from this process's environment).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import distributed
import pytest
from conftest import ROOT, Corpus

from tieaudit.cli.main import main
from tieaudit.core.errors import UsageError
from tieaudit.core.version import __version__
from tieaudit.gate.dask_executor import DIED, ClusterError, DaskExecutor, _check_workers, connect
from tieaudit.gate.discover import PathError, discover
from tieaudit.gate.progress import ProgressBar
from tieaudit.gate.tasks import audit_one
from tieaudit.report import render
from tieaudit.rules.policy import Policy, load_policy


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a two-worker LocalCluster whose workers run in a folder of their own."""
    elsewhere = tmp_path_factory.mktemp("workers-cwd")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH",)}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    here = os.getcwd()
    os.chdir(elsewhere)  # worker processes start here: their current folder is not the tests'
    try:
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        )
    finally:
        os.chdir(here)
    try:
        yield str(cluster.scheduler_address)
    finally:
        cluster.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run(tmp_path: Path, name: str, *argv: str) -> tuple[int, bytes]:
    """main(argv) writing to tmp_path/name: its exit code and the bytes written."""
    out = tmp_path / name
    code = main([*argv, "-o", str(out)])
    return code, out.read_bytes()


def test_dask_gives_the_json_of_jobs_1_over_the_corpus(
    scheduler: str, corpus: Corpus, tmp_path: Path
) -> None:
    argv = ["check", str(corpus.root), "--format", "json"]
    local = run(tmp_path, "jobs1.json", *argv, "--jobs", "1")
    on_dask = run(tmp_path, "dask.json", *argv, "--executor", f"dask://{scheduler}")
    assert on_dask == local
    assert local[0] == 1  # the corpus holds copies: the gate fails, on both
    assert b'"checkpoints": %d' % len(corpus.entries) in local[1]  # every fixture, each once


def test_host_port_without_protocol_and_sarif(scheduler: str, corpus: Corpus, tmp_path: Path) -> None:
    argv = ["check", str(corpus.root), "--format", "sarif"]
    host_port = scheduler.removeprefix("tcp://")
    assert run(tmp_path, "dask.sarif", *argv, "--executor", f"dask://{host_port}") == run(
        tmp_path, "jobs1.sarif", *argv, "--jobs", "1"
    )


def test_a_baseline_gives_the_same_report_and_exit(
    scheduler: str, corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A baseline accepting part of today's findings: the rest still fails, on both executors.
    hf = corpus.root / "hf"
    assert main(["check", str(hf), "--jobs", "1", "--write-baseline", str(tmp_path / "base.json")]) == 0
    written = (tmp_path / "base.json").read_bytes()
    dask = f"dask://{scheduler}"
    assert main(["check", str(hf), "--executor", dask, "--write-baseline", str(tmp_path / "b2.json")]) == 0
    assert (tmp_path / "b2.json").read_bytes() == written
    argv = ["check", str(corpus.root), "--format", "json", "--baseline", str(tmp_path / "base.json")]
    local = run(tmp_path, "jobs1.json", *argv, "--jobs", "1")
    capsys.readouterr()
    on_dask = run(tmp_path, "dask.json", *argv, "--executor", dask, "--jobs", "2")
    assert on_dask == local
    assert b'"baselined": 0' not in local[1] and local[0] == 1
    warning = f"tieaudit: warning: --jobs 2 is ignored with --executor {dask}: its workers set how many"
    assert warning in capsys.readouterr().err
    # every finding accepted: exit 0 on both
    everything = ["check", str(hf), "--baseline", str(tmp_path / "base.json"), "--format", "json"]
    assert run(tmp_path, "all1.json", *everything, "--jobs", "1") == run(
        tmp_path, "all2.json", *everything, "--executor", dask
    )
    assert main([*everything, "--executor", dask]) == 0


def test_relative_paths_are_read_where_they_were_given(
    scheduler: str, corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers' current folder is not this one: each PATH as typed (relative, ./, a trailing
    slash, ../) is audited and named as given, fix hints included (text shows them)."""
    monkeypatch.chdir(ROOT / "fixtures")
    paths = [
        "generated/torch",
        "./generated/hf/llama_cloned_head/",
        "../fixtures/generated/safetensors/transposed_copy.safetensors",
        "generated/onnx/gpt2_tied_dynamo_extdata/model.onnx.data",  # external data: covered, named
    ]
    for fmt in ("text", "json"):
        argv = ["check", *paths, "--format", fmt]
        local = run(tmp_path, f"jobs1.{fmt}", *argv, "--jobs", "1")
        assert run(tmp_path, f"dask.{fmt}", *argv, "--executor", f"dask://{scheduler}") == local
    text = (tmp_path / "jobs1.text").read_text()
    assert (
        "fix: tieaudit retie ./generated/hf/llama_cloned_head/ ./generated/hf/llama_cloned_head-retied"
        in text
    )


def test_an_unreachable_scheduler_is_one_line_exit_2(corpus: Corpus) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(corpus.root), "--executor", f"dask://127.0.0.1:{port}",
         "--connect-timeout", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        f"tieaudit: error: dask://127.0.0.1:{port}: cannot reach the Dask scheduler ("
    )
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("url", ["ray://head:10001", "dask://", "spark://x:7077", "tcp://127.0.0.1:8786"])
def test_other_executors_are_refused_naming_the_supported_ones(
    url: str, corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(corpus.root), "--executor", url]) == 2
    assert capsys.readouterr().err == (
        f"tieaudit: error: --executor {url}: not an executor tieaudit has; use local, dask://HOST:PORT "
        "(or dask://tcp://HOST:PORT, dask://tls://...)\n"
    )


class FakeClient:
    """What client.run answers: each worker's tieaudit version, or Dask's wrapper of its ImportError."""

    def __init__(self, answer: dict[str, str] | Exception) -> None:
        self.answer = answer

    def run(self, function: Any) -> dict[str, str]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_workers_without_tieaudit_or_of_another_version_are_refused() -> None:
    missing = Exception(ModuleNotFoundError("No module named 'tieaudit'"))
    with pytest.raises(ClusterError, match=r"^dask://h:1: a Dask worker cannot import tieaudit \("):
        _check_workers(FakeClient(missing), "dask://h:1")
    other = {"tcp://a:1": __version__, "tcp://b:1": "0.0.1"}
    with pytest.raises(ClusterError) as raised:
        _check_workers(FakeClient(other), "dask://h:1")
    assert str(raised.value) == (
        f"dask://h:1: worker tcp://b:1 runs tieaudit 0.0.1, this is {__version__} (1 of 2 workers differ): "
        "install the same version on every worker"
    )
    assert isinstance(raised.value, UsageError)
    _check_workers(FakeClient({"tcp://a:1": __version__}), "dask://h:1")  # the same version: accepted
    _check_workers(FakeClient({}), "dask://h:1")  # no worker yet (an adaptive cluster): the tasks wait


def test_policy_audit_and_path_error_pickle(corpus: Corpus, tmp_path: Path) -> None:
    """What travels to and from a worker: every corpus audit, a PathError, a policy with [[path]]."""
    (tmp_path / "tieaudit.toml").write_text(
        'fail-on = "error"\nmax-wasted-bytes = 10\n[[path]]\nglob = "hf/**"\nignore = ["TIE004"]\n'
    )
    policy = load_policy(str(tmp_path / "tieaudit.toml"))
    assert pickle.loads(pickle.dumps(policy)) == policy and policy.paths
    targets = discover([str(corpus.root)]).targets
    assert len(targets) == len(corpus.entries)
    for target in targets:
        outcome = audit_one(target.path, policy.for_path(target.path))
        assert not isinstance(outcome, PathError), outcome
        back = pickle.loads(pickle.dumps(outcome))
        assert render(back, "json") == render(outcome, "json")
    error = audit_one(str(tmp_path / "missing.safetensors"), Policy())
    assert isinstance(error, PathError) and pickle.loads(pickle.dumps(error)) == error


class InterruptedBar(ProgressBar):
    """A progress bar whose first advance is Ctrl-C (KeyboardInterrupt), as a user pressing it."""

    def advance(self, count: int = 1) -> None:
        super().advance(count)
        raise KeyboardInterrupt


def test_every_outcome_advances_the_bar_and_ctrl_c_cancels_the_tasks(
    scheduler: str, corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = [(t.path, Policy()) for t in discover([str(corpus.root)]).targets]
    with connect(scheduler, connect_timeout=10) as executor:
        with ProgressBar(len(work), enabled=False) as bar:
            outcomes = executor.audit(work, bar)
        assert bar.done == len(work) == len(outcomes)
        assert [o.graph.checkpoint.path for o in outcomes if not isinstance(o, PathError)] == [
            p for p, _ in work
        ]
        submitted: list[Any] = []
        mapped = executor.client.map

        def keep(*args: Any, **kwargs: Any) -> Any:
            submitted.extend(mapped(*args, **kwargs))
            return submitted

        monkeypatch.setattr(executor.client, "map", keep)
        with pytest.raises(KeyboardInterrupt):
            executor.audit(work, InterruptedBar(len(work), enabled=False))
        assert len(submitted) == len(work)
        assert {f.status for f in submitted} == {"cancelled"}


class Failed:
    """A finished future whose result() raises what a task or the cluster raised."""

    def __init__(self, raised: BaseException) -> None:
        self.raised = raised

    def result(self) -> Any:
        raise self.raised


def test_what_a_task_raises_becomes_an_error_for_its_path_or_one_line() -> None:
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    executor = DaskExecutor(client=None, where="dask://h:1")
    died = executor._outcome(Failed(KilledWorker("audit_one-1", None, 3)), "models/a.pt")  # type: ignore[arg-type]
    assert died == PathError(path="models/a.pt", message=DIED)
    with pytest.raises(ClusterError, match=r"^dask://h:1: lost the Dask scheduler \(.*in transit"):
        executor._outcome(Failed(CommClosedError("in transit")), "models/a.pt")
    with pytest.raises(ClusterError, match=r"^dask://h:1: a Dask worker cannot import a module \(No module"):
        executor._outcome(Failed(ModuleNotFoundError("No module named 'onnx'")), "models/a.onnx")
    with pytest.raises(ZeroDivisionError):  # a tieaudit bug on a worker stays a bug (exit 3, traceback)
        executor._outcome(Failed(ZeroDivisionError()), "models/a.pt")
