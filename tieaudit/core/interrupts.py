"""SIGINT and SIGTERM during work that leaves temporary files: clean up, then end as interrupted.

``signals_guarded`` installs handlers for the duration of a block (the previous ones come back
at its end). The first signal raises ``Interrupted`` where the block is, so its ``finally``
clauses remove what it made; further signals, and any arriving inside ``guard.deferred()``
(publishing, cleaning up), are held and never cut that work short. Once the handlers are
restored the signal is delivered again, so the process ends as it would have without the guard:
SIGTERM by its default action, SIGINT as KeyboardInterrupt.
"""

from __future__ import annotations

import itertools
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POOLS = itertools.count()  # a distinct thread-name prefix per pool


class Interrupted(BaseException):
    """A guarded signal arrived; unwinding removes what the block made."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGuard:
    """The state of one guarded block."""

    def __init__(self) -> None:
        self.caught: int | None = None
        self._raised = False
        self._deferring = 0

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The handler: raise once, outside deferred work; remember everything else."""
        if self.caught is None:
            self.caught = signum
        self._raise_pending()

    def _raise_pending(self) -> None:
        if self.caught is not None and not self._raised and not self._deferring:
            self._raised = True
            raise Interrupted(self.caught)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals arriving inside the block are acted on when it ends (it always runs to its end)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        self._raise_pending()


def _deliver(signum: int, previous: Any) -> None:
    """Act on signum as the handler that was there before the guard would have."""
    if callable(previous):
        previous(signum, None)  # default_int_handler raises KeyboardInterrupt
    elif previous == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action: the process ends by this signal


@contextmanager
def signals_guarded() -> Iterator[SignalGuard]:
    """Handlers for SIGINT and SIGTERM for the block's duration (main thread only; an ignored signal
    stays ignored). After the block: previous handlers back, then the caught signal delivered; if
    that returns (a handler that does not end the run), Interrupted is raised to the caller."""
    guard = SignalGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard  # handlers can only be installed from the main thread
        return
    previous: dict[int, Any] = {}
    for number in SIGNALS:
        handler = signal.getsignal(number)
        if handler is not signal.SIG_IGN and handler is not None:  # None: set outside Python, kept
            previous[number] = handler
            signal.signal(number, guard.handle)
    try:
        yield guard
    except Interrupted:
        pass  # delivered below, once the previous handlers are back
    finally:
        for restored, earlier in previous.items():
            signal.signal(restored, earlier)
    if guard.caught is not None:
        _deliver(guard.caught, previous.get(guard.caught))
        raise Interrupted(guard.caught)


@contextmanager
def worker_pool(workers: int, name: str) -> Iterator[ThreadPoolExecutor]:
    """A thread pool that, however the block ends (an error, a signal), drops the tasks not started
    and waits for every worker it started, before the files and memory maps they use close.

    A signal raised while the pool starts a worker leaves that thread out of the pool's own list,
    so every live thread named with the pool's prefix is joined as well.
    """
    prefix = f"tieaudit-{name}-{next(_POOLS)}"
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for thread in threading.enumerate():
            if thread.name.startswith(f"{prefix}_") and thread is not threading.current_thread():
                thread.join()
