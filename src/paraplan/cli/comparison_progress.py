"""What `paraplan plan` shows on stderr while its comparison runs (issue 51 item 3): the planners done,
skipped and timed out, the ones running with how far each search has come (planners/progress.py,
forwarded by planners/auto.py), and the best plan so far, redrawn twice a second in one line. On
stderr, so that `--json` keeps stdout to its one document; only where a person watches a terminal,
and never with `--quiet`.
"""

from __future__ import annotations

import contextlib
import time

SHOWN_WHERE = 60  # characters of a search's own words about how far it has come


class ComparisonStatus:
    """The comparison as it stands: fed by `compare`'s on_progress and on_row, read by `line`."""

    def __init__(self, total: int):
        self.total = total
        self.started_at = time.perf_counter()
        self.running: dict[str, str] = {}  # planner -> how far its search has come ("" until it says)
        self.done = self.skipped = self.timed_out = 0
        self.best: tuple[str, float] | None = None  # (planner, iteration s) of the fastest plan that fits

    def on_progress(self, name: str, where: str) -> None:
        self.running[name] = where

    def on_row(self, row) -> None:
        self.running.pop(row.planner, None)
        self.done += 1
        self.skipped += row.status == "skipped"
        self.timed_out += bool(row.timed_out or row.status == "timeout")
        if row.status == "ok" and row.iteration_s is not None and (self.best is None or row.iteration_s < self.best[1]):
            self.best = (row.planner, row.iteration_s)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started_at
        counts = ", ".join(part for part in (f"{self.skipped} skipped" if self.skipped else "",
                                             f"{self.timed_out} timed out" if self.timed_out else "") if part)
        text = f"comparing planners: {self.done} of {self.total} done" + (f" ({counts})" if counts else "")
        text += f", {elapsed:.0f} s"
        if self.running:
            text += "; running " + ", ".join(name + (f" ({where[:SHOWN_WHERE]})" if where else "")
                                             for name, where in self.running.items())
        if self.best is not None:
            text += f"; best so far {self.best[0]}, {self.best[1]:.4g} s an iteration"
        return text


@contextlib.contextmanager
def showing(err, total: int, quiet: bool):
    """A ComparisonStatus, drawn on `err` (a rich Console on stderr) while the block runs, where a
    person watches it; the line is gone when the comparison ends (the table says the rest)."""
    status = ComparisonStatus(total)
    if quiet or not err.is_terminal:
        yield status
        return
    from rich.live import Live
    from rich.text import Text

    with Live(console=err, transient=True, refresh_per_second=2, get_renderable=lambda: Text(status.line())):
        yield status
