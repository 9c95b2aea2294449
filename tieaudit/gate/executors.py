"""Where check's audits run: in this process, in local worker processes (--jobs), or on an existing
Dask cluster (--executor dask://HOST:PORT). Each maps the pure ``audit_one`` over (path, policy) pairs
and returns the outcomes in the order given, so everything after them is the same code."""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tieaudit.core.errors import UsageError
from tieaudit.core.escape import printable, quoted
from tieaudit.core.interrupts import SIGNALS, signals_blocked
from tieaudit.core.units import checked_seconds
from tieaudit.gate import CONNECT_TIMEOUT_S
from tieaudit.gate.discover import PathError
from tieaudit.gate.progress import ProgressBar
from tieaudit.gate.tasks import Executor, Outcomes, Work, audit_chunk, audit_one

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

PRELOAD = (
    "tieaudit.rules.registry",
    "tieaudit.formats.safetensors",
    "tieaudit.formats.torch_file",
    "tieaudit.formats.onnx_model",
    "tieaudit.formats.hf_dir",
)
"""Modules every audit imports lazily; imported before forking workers."""

SCHEMES = "local, dask://HOST:PORT (or dask://tcp://HOST:PORT, dask://tls://...)"
"""The --executor values, for the refusal of any other."""
MAX_SCHEDULER_ADDRESS = 300
"""Longest dask:// address accepted: a DNS name is at most 253 characters; with a protocol, IPv6
brackets and a port an address stays under 300."""
PROTOCOLS = ("tcp", "tls", "ws", "wss")
"""The protocols a dask:// address may name (Dask's comm backends that reach another machine)."""
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")
_PORT = re.compile(r"[0-9]{1,5}")
DIED = "the audit process died before finishing (out of memory?)"
STOPPED = "the audit process was sent SIGTERM before finishing"


@dataclass(frozen=True)
class LocalExecutor:
    """This machine: in this process (jobs 1), else in jobs forked worker processes."""

    jobs: int

    def audit(self, work: Work, bar: ProgressBar) -> Outcomes:
        """Audit every (path, policy) here; consecutive small checkpoints share a process task."""
        if self.jobs <= 1 or len(work) <= 1:
            outcomes: Outcomes = []
            for path, policy in work:
                outcomes.append(audit_one(path, policy))
                bar.advance()
            return outcomes
        return _audit_in_pool(work, min(self.jobs, len(work)), bar)


def default_jobs() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _shown(text: str, limit: int = 80) -> str:
    """text of an argument for a one-line message: escaped, and cut after limit characters."""
    return printable(text[:limit]) + ("..." if len(text) > limit else "")


def _valid_host(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        try:
            return isinstance(ipaddress.ip_address(host[1:-1]), ipaddress.IPv6Address)
        except ValueError:
            return False
    return len(host) <= 253 and _HOSTNAME.fullmatch(host) is not None


def scheduler_address(url: str) -> str:
    """The Dask scheduler address of ``dask://[PROTOCOL://]HOST:PORT`` (tcp://HOST:PORT when no
    protocol is named), checked before anything connects: a known protocol, a host name, IPv4 or
    bracketed IPv6 address, and a port from 1 to 65535; else UsageError saying which part is wrong."""
    shown = f"--executor {_shown(url)}"
    address = url.removeprefix("dask://")
    if address == url or not address:
        raise UsageError(f"{shown}: not an executor tieaudit has; use {SCHEMES}")
    if len(address) > MAX_SCHEDULER_ADDRESS:
        limit = MAX_SCHEDULER_ADDRESS
        raise UsageError(f"{shown}: the address is longer than {limit} characters (MAX_SCHEDULER_ADDRESS)")
    protocol, found, rest = address.partition("://")
    if not found:
        protocol, rest = "tcp", address
    if protocol not in PROTOCOLS:
        raise UsageError(f"{shown}: unknown protocol {quoted(protocol, 20)} (known: {', '.join(PROTOCOLS)})")
    if rest.startswith("["):  # [IPv6]:PORT: the address itself holds colons
        inside, bracket, tail = rest[1:].partition("]")
        if not bracket:
            raise UsageError(f"{shown}: an IPv6 address needs its closing ']' (as in [::1]:8786)")
        host, colon, port = f"[{inside}]", tail[:1], tail[1:]
    else:
        host, colon, port = rest.rpartition(":")
    if colon != ":" or not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise UsageError(f"{shown}: the address needs HOST:PORT with a port from 1 to 65535")
    if not _valid_host(host):
        raise UsageError(f"{shown}: {quoted(host, 80)} is not a host name, IPv4 or bracketed IPv6 address")
    return f"{protocol}://{host}:{int(port)}"


@contextlib.contextmanager
def open_executor(
    url: str, *, jobs: int | None = None, connect_timeout: float = CONNECT_TIMEOUT_S
) -> Iterator[tuple[Executor, tuple[str, ...]]]:
    """The executor url names, ready, with a warning for each option it ignores; closed on exit.
    ``local``: this machine, in jobs processes (None: one per CPU). ``dask://ADDRESS``: the workers of
    the Dask scheduler at ADDRESS (HOST:PORT, or with its protocol: tcp://HOST:PORT, tls://...),
    reached within connect_timeout seconds; the cluster sets the parallelism, so jobs is ignored.
    Anything else, a malformed address or a connect_timeout that is no finite number of seconds above
    0: UsageError, before anything is imported or connected."""
    connect_timeout = checked_seconds(connect_timeout, "--connect-timeout")
    if url == "local":
        yield LocalExecutor(default_jobs() if jobs is None else jobs), ()
        return
    address = scheduler_address(url)
    from tieaudit.gate.dask_executor import connect

    ignored: tuple[str, ...] = ()
    if jobs is not None:
        ignored = (
            f"--jobs {jobs} is ignored with --executor {url}: its workers set how many audits run at once",
        )
    with connect(address, connect_timeout=connect_timeout, where=_shown(url)) as executor:
        yield executor, ignored


class WorkerStopped(BaseException):
    """A worker's audit stopped by SIGTERM: the parent ends the run (a signal, an error), or the whole
    process group was sent it. Sent back as the task's outcome, which nobody reads any more."""


_WORKER = {"auditing": False, "stopped": False}
"""A worker process's state: inside an audit (where SIGTERM stops it at once), stop requested."""


def _stop_requested(signum: int, frame: object) -> None:
    """A worker's SIGTERM: stop the audit it is in; between audits (taking a task, sending a
    result) only remember it, so that the pool's pipes never hold half a message (the parent's
    reader would wait for the rest for ever), and refuse the next audit."""
    _WORKER["stopped"] = True
    if _WORKER["auditing"]:
        raise WorkerStopped(signum)


def _audit_in_worker(work: Work) -> Outcomes:
    """audit_chunk in a worker, stoppable by SIGTERM while it audits."""
    if _WORKER["stopped"]:
        raise WorkerStopped(signal.SIGTERM)
    _WORKER["auditing"] = True
    try:
        return audit_chunk(work)
    finally:
        _WORKER["auditing"] = False


def _quiet_worker() -> None:
    """A forked worker's signals, set before it takes any (it is forked with them blocked): Ctrl-C
    is the parent's to handle, once; SIGTERM stops its audit (``_stop_requested``). Never the
    parent's guard, which would raise anywhere in the worker, half-way through a result too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop_requested)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def _stop(pool: ProcessPoolExecutor) -> None:
    """The run ends before its audits (a signal, an error): tasks not started are dropped and every
    worker's audit stopped now (SIGTERM), instead of running to its end before the process exits."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # None after shutdown
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


def _stored_bytes(path: str) -> int:
    try:
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        return os.path.getsize(path)
    except OSError:
        return 0


def chunks(work: Work, workers: int) -> list[Work]:
    """Consecutive runs of about 1/(4 x workers) of the bytes each: few round trips, and a
    large checkpoint gets a task of its own so the others keep every worker busy."""
    sizes = [_stored_bytes(path) for path, _ in work]
    budget = max(1, sum(sizes) // (4 * workers))
    result: list[Work] = [[]]
    filled = 0
    for item, size in zip(work, sizes, strict=True):
        if result[-1] and filled + size > budget:
            result.append([])
            filled = 0
        result[-1].append(item)
        filled += size
    return result


def _collect(future: Future[Outcomes], chunk: Work) -> Outcomes:
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool:
        return [PathError(path=path, message=DIED) for path, _ in chunk]
    except WorkerStopped:  # SIGTERM sent to a worker alone: its audits did not run to their end
        return [PathError(path=path, message=STOPPED) for path, _ in chunk]


def _preload(paths: list[str]) -> None:
    """Import what every worker needs once, here: forked workers share it instead of each paying."""
    modules = list(PRELOAD)
    if any(path.endswith(".onnx") for path in paths):
        modules.append("google.protobuf.message")  # the ONNX reader's own lazy import
    for module in modules:
        with contextlib.suppress(ImportError):  # a speed-up only: a worker importing it reports why
            importlib.import_module(module)


def _audit_in_pool(work: Work, workers: int, bar: ProgressBar) -> Outcomes:
    # Imported here: a single-file audit, which needs no pool, does not pay for them.
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    _preload([path for path, _ in work])
    parts = chunks(work, workers)
    # fork: workers inherit the imported modules, and no thread runs yet (the bar starts later).
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    context = multiprocessing.get_context(method)
    pool = ProcessPoolExecutor(min(workers, len(parts)), context, initializer=_quiet_worker)
    try:
        with signals_blocked():  # the workers are forked at the first submit
            futures = {pool.submit(_audit_in_worker, part): i for i, part in enumerate(parts)}
        outcomes: list[Outcomes] = [[] for _ in parts]
        pending: set[Future[Any]] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for future in done:
                index = futures[future]
                outcomes[index] = _collect(future, parts[index])
                bar.advance(len(parts[index]))
            bar.tick()
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    return [outcome for part in outcomes for outcome in part]
