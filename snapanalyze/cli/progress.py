"""A one-line progress indicator on stderr for long commands, shown only on a terminal.

Contract: `Progress(enabled)` writes "snapanalyze: <step>… <elapsed> s" to stderr, rewriting one line in
place, each time `step(name)` is called and, while a step runs, twice a second (so a long load or replay
shows its time passing), and erases it on `done()` (or on leaving `with Progress() as p:`); with
`enabled=False` (the default when stderr is not a terminal, e.g. piped or captured) it writes nothing at
all and starts no thread, so output that is piped or parsed never carries progress text. Library code
receives `step` as a plain callback and never prints. `rank_step(step, rank)` prefixes a rank's steps
("rank 1: loading") for run-wide commands.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

TICK_S = 0.5          # how often a running step's elapsed time is redrawn


class Progress:
    """Elapsed-time progress line on a terminal (see the module docstring)."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.started = time.perf_counter()
        self._shown = False
        self._name = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def step(self, name: str) -> None:
        """Show that `name` (e.g. "loading", "replaying") has started."""
        if not self.enabled:
            return
        with self._lock:
            self._name = name
            self._draw()
        if self._ticker is None:
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, name="snapanalyze-progress", daemon=True)
            self._ticker.start()

    def _draw(self) -> None:
        elapsed = time.perf_counter() - self.started
        self.stream.write(f"\r\033[Ksnapanalyze: {self._name}… {elapsed:.1f} s")
        self.stream.flush()
        self._shown = True

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                if self._shown:
                    self._draw()

    def done(self) -> None:
        """Stop redrawing and erase the line (nothing to do when nothing was shown)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            if self._shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.done()


def rank_step(step: Callable[[str], None], rank: int | None) -> Callable[[str], None]:
    """`step` with each name prefixed by the rank ("rank 1: replaying"); `step` itself when rank is None."""
    if rank is None:
        return step
    return lambda name: step(f"rank {rank}: {name}")
