"""What a command shows a person while it works, and how it stops.

Progress bars and spinners go to stderr, and only where a person watches a terminal: piped output
and error messages stay one clean line. `BARS` is the workload Watch made of them (a bar while a
model is measured, a spinner while its operators are traced).

SIGTERM (main installs `on_sigterm`): where the command holds processes or half-written files, it
becomes an exception so that the code that holds them cleans up on the way out (the launcher stops
its ranks, an atomic write removes its temporary file). Where it only computes (`pure_work`:
planning, simulating), the process ends at once: unwinding would free what it built object by
object, as slowly as it was built.
"""

from __future__ import annotations

import contextlib
import os

from paraplan.workload import Watch


def progress():
    """A transient progress bar on stderr, only where a person watches it (a terminal): piped
    output and error messages stay one clean line."""
    from rich.progress import Progress

    from paraplan.report.tables import console

    err = console(stderr=True)
    return Progress(transient=True, console=err, disable=not err.is_terminal)


@contextlib.contextmanager
def progress_task(description: str, total: int | None):
    """One task on a progress bar; the value advances it by one step."""
    with progress() as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)


class Bars(Watch):
    """The command line's Watch: a progress bar while the model is measured, a spinner while its
    operators are traced."""

    def progress(self, description: str, total: int):
        return progress_task(description, total)

    def tracing(self, built):
        from paraplan.report.tables import console

        return console(stderr=True).status(f"tracing the operators of {built.name} on meta")


BARS = Bars()


class Terminated(BaseException):
    """SIGTERM, turned into an exception so that cleanup (stopping the ranks, removing a half-written
    file) runs. A BaseException, as KeyboardInterrupt is: an `except Exception` on the way (a
    planner's failure kept as a table row, a user's module that fails to load) would swallow it."""


_exit_at_once = False  # set by pure_work(): nothing to clean up, so SIGTERM ends the process at once


def on_sigterm(signum, frame):
    if _exit_at_once:
        if os.isatty(2):  # a progress spinner hides the cursor; show it again
            os.write(2, b"\x1b[?25h\n")
        os.write(2, b"paraplan: terminated\n")
        os._exit(143)  # 128 + SIGTERM, as the shell reports a process it killed
    raise Terminated()


@contextlib.contextmanager
def pure_work():
    """Around a computation that holds no processes and no half-written files (planning,
    simulating): SIGTERM there ends the process at once. Unwinding would first free
    every object it built one by one, as slowly as it built them: a simulator graph of millions of
    tasks took longer to free than the few seconds a SIGTERM gives before a SIGKILL."""
    global _exit_at_once
    before, _exit_at_once = _exit_at_once, True
    try:
        yield
    finally:
        _exit_at_once = before
