"""check's audits on an existing Dask cluster (``--executor dask://HOST:PORT``, the ``dask`` extra).

One task per checkpoint, not the byte-budget chunks of --jobs: the scheduler balances tasks over
however many workers the cluster has at each moment (it may scale while the run lasts), a worker
that dies costs the one checkpoint it held (retried elsewhere, then reported as an error), and the
progress bar moves per checkpoint. A task costs the scheduler about a millisecond, little next to
reading a checkpoint over a shared filesystem. Tasks are impure to Dask (``pure=False``): a file
audited again after it changed must not get a result another client still holds for its name.

The workers run ``audit_one`` of their own installed tieaudit (the same version, checked on
connecting) on the absolute path of each checkpoint, which must be valid on every worker (a shared
filesystem mounted at the same place); the outcome names the path as given here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from tieaudit.audit import Audit
from tieaudit.core.errors import TieauditError, UsageError, one_line
from tieaudit.core.extras import require
from tieaudit.core.version import __version__
from tieaudit.gate.discover import PathError
from tieaudit.gate.progress import ProgressBar
from tieaudit.gate.tasks import Outcomes, Work, audit_one

POLL_S = 0.05
"""How often the progress bar is looked at while no audit finishes."""
DIED = "the Dask workers auditing it died before finishing, each time it was tried (out of memory?)"


class ClusterError(UsageError):
    """The Dask scheduler cannot be reached or used (exit 2, one line)."""


def worker_version() -> str:
    """The tieaudit version a worker imports (run on every worker when connecting)."""
    return __version__


@contextlib.contextmanager
def connect(address: str, *, connect_timeout: float, where: str | None = None) -> Iterator[DaskExecutor]:
    """A client of the Dask scheduler at address (checked by ``executors.scheduler_address``), its
    workers checked; closed on exit. where: dask://ADDRESS as the user gave it, for messages."""
    require("check --executor dask://", ("dask", "distributed"), extra="dask")
    import distributed
    from distributed.comm.addressing import get_address_host_port, parse_address
    from distributed.comm.registry import get_backend

    client_of: Any = distributed.Client  # partly typed: used as Any, like the other optional libraries
    full = address if "://" in address else f"tcp://{address}"
    where = where or f"dask://{address}"
    try:  # Dask's own parsing first: a Client that fails to parse leaves a noisy __del__ behind
        get_backend(parse_address(full)[0])
        get_address_host_port(full)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise ClusterError(f"{where}: not an address Dask can use ({one_line(exc, 200)})") from None
    try:
        client = client_of(full, timeout=connect_timeout, set_as_default=False)
    except (OSError, ValueError, TypeError) as exc:  # timed out, refused, or no address at all
        raise ClusterError(f"{where}: cannot reach the Dask scheduler ({one_line(exc, 200)})") from None
    try:
        _check_workers(client, where)
        yield DaskExecutor(client, where)
    finally:
        with contextlib.suppress(Exception):  # a scheduler gone already: nothing left to close
            client.close(timeout=connect_timeout)


def _check_workers(client: Any, where: str) -> None:
    """ClusterError unless every worker imports this tieaudit version (none yet: an adaptive cluster
    starts them for the tasks, and they are checked by the tasks' own imports)."""
    try:
        versions: dict[str, str] = client.run(worker_version)
    except Exception as exc:  # Dask wraps what the worker raised (ModuleNotFoundError) in Exception
        raise ClusterError(f"{where}: a Dask worker cannot import tieaudit {_install(exc)}") from None
    other = {worker: version for worker, version in versions.items() if version != __version__}
    if other:
        worker, version = sorted(other.items())[0]
        raise ClusterError(
            f"{where}: worker {worker} runs tieaudit {version}, this is {__version__} "
            f"({len(other)} of {len(versions)} workers differ): install the same version on every worker"
        )


def _install(exc: BaseException) -> str:
    return (
        f"({one_line(exc, 200)}): install tieaudit (this version, with the extras the checkpoints need) "
        "in every worker's environment"
    )


class DaskExecutor:
    """Audits on a Dask cluster's workers, one task per checkpoint, outcomes in the order given."""

    def __init__(self, client: Any, where: str) -> None:
        self.client = client
        """The connected distributed.Client."""
        self.where = where
        """dask://ADDRESS as given, for messages."""

    def audit(self, work: Work, bar: ProgressBar) -> Outcomes:
        """Submit every (path, policy), wait for each; Ctrl-C (or any error) cancels the rest."""
        import distributed

        as_completed: Any = distributed.as_completed
        given = [path for path, _ in work]
        base = os.getcwd()  # relative paths are read as base/path on the workers, named as given
        futures = self.client.map(
            audit_one, given, [policy for _, policy in work], [base] * len(work), pure=False
        )
        index = {future.key: i for i, future in enumerate(futures)}
        outcomes: list[Audit | PathError | None] = [None] * len(work)
        try:
            finished = as_completed(futures, loop=self.client.loop)
            while not finished.is_empty():
                batch = finished.next_batch(block=False) if finished.has_ready() else []
                for future in batch:
                    i = index[future.key]
                    outcomes[i] = self._outcome(future, given[i])
                    bar.advance()
                if not batch:
                    bar.tick()
                    time.sleep(POLL_S)
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)
            raise
        return [outcome for outcome in outcomes if outcome is not None]  # none is: every future finished

    def _outcome(self, future: Any, given: str) -> Audit | PathError:
        """The task's outcome; a worker that died with it is an error for that path, a lost
        scheduler or a worker without tieaudit a ClusterError, anything else a tieaudit bug."""
        from distributed.scheduler import KilledWorker

        try:
            outcome: Audit | PathError = future.result()
        except KilledWorker:
            return PathError(path=given, message=DIED)
        except ImportError as exc:  # a worker without tieaudit, or without an extra an audit needs
            raise ClusterError(
                f"{self.where}: a Dask worker cannot import a module {_install(exc)}"
            ) from None
        except TieauditError:
            raise
        except (OSError, TimeoutError) as exc:  # CommClosedError is an OSError
            raise ClusterError(f"{self.where}: lost the Dask scheduler ({one_line(exc, 200)})") from None
        return outcome
