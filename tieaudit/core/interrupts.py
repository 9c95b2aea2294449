"""SIGINT and SIGTERM during work that leaves temporary files: clean up, then end as interrupted.

``signals_guarded`` installs handlers for the duration of a block (the previous ones come back
at its end). The first signal raises ``Interrupted`` where the block is, so its ``finally``
clauses remove what it made; further signals, and any arriving inside ``guard.deferred()``
(publishing, cleaning up), are held and never cut that work short. Once the handlers are
restored the signal is delivered again to the handler that was there before.

The command-line process installs one more guard before it imports anything (``guard_process``,
from ``cli.launch``): the first signal anywhere in the run, or the one a block's guard delivers,
raises ``Interrupted`` once; the entry point turns it into one line and exit ``exit_status``
(130 for SIGINT, 143 for SIGTERM), and every later signal is held. Without it (tieaudit used as a
library) the previous handlers act as always: SIGTERM by its default action, SIGINT as
KeyboardInterrupt.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POOLS = itertools.count()  # a distinct thread-name prefix per pool


class Interrupted(BaseException):
    """A guarded signal arrived; unwinding removes what the block made."""

    def __init__(self, signum: int, guard: SignalGuard | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.guard = guard
        """The guard that raised it (to raise it again where one could not propagate)."""


class SignalGuard:
    """The state of one guarded block."""

    def __init__(self) -> None:
        self.caught: int | None = None
        self._raised = False
        self._deferring = 0
        self._held = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The handler: raise once, outside deferred work; remember everything else."""
        if self.caught is None:
            self.caught = signum
        self._raise_pending()

    def _raise_pending(self) -> None:
        if self.caught is not None and not self._raised and not self._deferring and not self._held:
            self._raised = True
            raise Interrupted(self.caught, self)

    def check(self) -> None:
        """Raise Interrupted if a signal was caught, also one raised before that something swallowed
        (a library's bare ``except:`` around an import): called where work would become visible."""
        if self.caught is not None and not self._deferring:
            self._raised = True
            raise Interrupted(self.caught, self)

    def rearm(self) -> None:
        """The Interrupted this guard raised was lost (Python could only report it, in a ``__del__``
        or a callback): raise it again in the main thread, once the report of the loss is over.

        Not from here: ``signal.raise_signal`` runs the handler at once, inside the report (the
        unraisable hook), where the Interrupted is lost again and printed as "Exception ignored".
        A thread of its own trips the signal for the main thread instead, which acts on it once the
        thread runs, after the hook returned (lost again somewhere, it is armed again, until it
        lands in the run)."""
        if self._raised and not self._held and self.caught is not None:
            self._raised = False
            import _thread

            try:  # not threading.Thread: its start() waits for the thread, inside the hook
                _thread.start_new_thread(_thread.interrupt_main, (signal.Signals(self.caught),))
            except RuntimeError:  # the interpreter is shutting down: the run's exit status says it
                pass

    def hold(self) -> None:
        """The run is over: every signal from now on is ignored, also while the interpreter shuts
        down (which puts its default action back under a Python handler, not under SIG_IGN)."""
        self._held = True
        for number in SIGNALS:
            if signal.getsignal(number) == self.handle:
                signal.signal(number, signal.SIG_IGN)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals arriving inside the block are acted on when it ends (it always runs to its end)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        self._raise_pending()


def exit_status(signum: int) -> int:
    """A run a signal ended exits with 128 + its number, as a shell reports it (130, 143)."""
    return 128 + signum


def interrupted_line(signum: int) -> str:
    """The one line a run a signal ended prints (its temporary files are already removed)."""
    return f"tieaudit: interrupted by {signal.Signals(signum).name}; nothing half-written was left"


_PROCESS: list[SignalGuard] = []
"""The process guard, once ``guard_process`` installed it."""


def guard_process() -> SignalGuard:
    """The command-line process's guard, installed for good before anything else runs: the first
    SIGINT or SIGTERM raises Interrupted where the run is (the main thread), later ones are held
    (``SignalGuard.hold`` once the run is over holds every one). An ignored signal stays ignored.
    An Interrupted that cannot propagate (raised in a ``__del__`` or a callback, where Python only
    reports it) is not lost: the guard is armed again and the signal raised anew."""
    guard = SignalGuard()
    for number in SIGNALS:
        handler = signal.getsignal(number)
        if handler is not signal.SIG_IGN and handler is not None:
            signal.signal(number, guard.handle)
    _PROCESS[:] = [guard]
    report = sys.unraisablehook

    def raise_again(unraisable: Any) -> None:
        try:
            lost = unraisable.exc_value
            if not isinstance(lost, Interrupted):
                report(unraisable)
            elif lost.guard is not None:
                lost.guard.rearm()
        except Interrupted as again:  # the signal acted inside this hook after all: once more, later
            if again.guard is not None:
                again.guard.rearm()

    sys.unraisablehook = raise_again
    return guard


def process_signal() -> int | None:
    """The signal the process guard caught, if any: an error raised after it is its consequence
    (a library turned Interrupted into its own exception), and the run ends as interrupted."""
    return _PROCESS[0].caught if _PROCESS else None


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
    if _PROCESS:
        _PROCESS[0].check()  # a signal the run swallowed before this block: it never starts
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
    except BaseException:
        # A signal arrived: the block was interrupted, whatever Interrupted became on its way out
        # (torch turns an exception raised in its writer into RuntimeError). Delivered below.
        if guard.caught is None:
            raise
    finally:
        owner = getattr(previous.get(guard.caught or 0), "__self__", None)
        if isinstance(owner, SignalGuard) and owner.caught is None:
            owner.caught = guard.caught  # the process's first signal is this one, whatever comes next
        for restored, earlier in previous.items():
            signal.signal(restored, earlier)
    if guard.caught is not None:
        _deliver(guard.caught, previous.get(guard.caught))
        raise Interrupted(guard.caught)


@contextmanager
def signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back for the block (blocked in this thread, the main one), then acted
    on: a process forked inside it starts with them blocked, so it sets its own dispositions before
    it takes any (``gate.executors``: workers ignore Ctrl-C, which is the parent's, and end at
    SIGTERM) instead of running this process's guard; and no handler runs in fork's callbacks
    (``os.register_at_fork``), where an exception is lost and a lock they release stays held.
    A thread started inside the block keeps them blocked for good: they are the main thread's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a held signal acts here


@contextmanager
def worker_pool(workers: int, name: str) -> Iterator[ThreadPoolExecutor]:
    """A thread pool that, however the block ends (an error, a signal), drops the tasks not started
    and waits for every worker it started, before the files and memory maps they use close.

    A signal raised while the pool starts a worker leaves that thread out of the pool's own list,
    so every live thread named with the pool's prefix is joined as well.
    """
    from concurrent.futures import ThreadPoolExecutor  # here: cli.launch imports this module first thing

    prefix = f"tieaudit-{name}-{next(_POOLS)}"
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for thread in threading.enumerate():
            if thread.name.startswith(f"{prefix}_") and thread is not threading.current_thread():
                thread.join()
