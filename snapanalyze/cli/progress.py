"""A one-line progress indicator on stderr for long commands, shown only on a terminal.

Contract: `Progress(enabled)` writes "snapanalyze: <step>… <elapsed> s" to stderr, rewriting one line in
place, each time `step(name)` is called, and erases it on `done()`; with `enabled=False` (the default when
stderr is not a terminal, e.g. piped or captured) it writes nothing at all, so output that is piped or
parsed never carries progress text. Library code receives `step` as a plain callback and never prints.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Elapsed-time progress line on a terminal (see the module docstring)."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.started = time.perf_counter()
        self._shown = False

    def step(self, name: str) -> None:
        """Show that `name` (e.g. "loading", "replaying") has started."""
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.started
        self.stream.write(f"\r\033[Ksnapanalyze: {name}… {elapsed:.1f} s")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        """Erase the line (nothing to do when nothing was shown)."""
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False
