"""A progress bar on stderr for long `check` runs: shown only on a terminal, and only once a run
of several checkpoints has taken a second, so quick runs and logs never see it."""

from __future__ import annotations

import time
from typing import Any

DELAY_S = 1.0


class ProgressBar:
    """Counts finished audits; draws a transient rich bar once DELAY_S has passed with work left."""

    def __init__(self, total: int, enabled: bool, delay_s: float = DELAY_S) -> None:
        self.total = total
        self.done = 0
        self.enabled = enabled and total > 1
        self.deadline = time.monotonic() + delay_s
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def tick(self) -> None:
        """Start drawing when due; called after each audit and periodically while waiting."""
        if self._progress is not None or not self.enabled or self.done >= self.total:
            return
        if time.monotonic() < self.deadline:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("checking"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._progress.add_task("check", total=self.total, completed=self.done)
        self._progress.start()

    def advance(self, count: int = 1) -> None:
        """count more audits finished."""
        self.done += count
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done)
        self.tick()
