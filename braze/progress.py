"""A progress display for long command-line steps (loading, importing, fusing, exporting a
large model): a live spinner with elapsed time on an interactive terminal (rich, when
installed), one line per finished step otherwise, nothing when quiet."""
from __future__ import annotations

import contextlib
import sys
import time

__all__ = ["Progress"]


class Progress:
    """`with progress.step("fusing for cpu"): ...` shows the step while it runs."""

    def __init__(self, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = enabled and getattr(self.stream, "isatty", lambda: False)()
        self._console = None
        if self.live:
            try:
                from rich.console import Console

                self._console = Console(file=self.stream)
            except ImportError:
                self._console = None

    @contextlib.contextmanager
    def step(self, text: str):
        if not self.enabled:
            yield
            return
        t0 = time.perf_counter()
        if self._console is not None:
            with self._console.status(f"{text} ..."):
                yield
        else:
            yield
        dt = time.perf_counter() - t0
        line = f"braze: {text}: done in {dt:.2f} s"
        if self._console is not None:
            self._console.print(f"[green]\u2713[/green] {text} [dim]({dt:.2f} s)[/dim]")
        else:
            print(line, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """Print one line, `braze: text` (nothing when not enabled)."""
        if not self.enabled:
            return
        if self._console is not None:
            self._console.print(f"braze: {text}", highlight=False)
        else:
            print(f"braze: {text}", file=self.stream, flush=True)
