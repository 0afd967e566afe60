"""SIGTERM for the `paraplan` command (cli.main installs the handler).

Where the command holds processes or half-written files, SIGTERM becomes an exception so that the
code that holds them cleans up on the way out (the launcher stops its ranks, an atomic write removes
its temporary file). Where it only computes (`pure_work`: planning, simulating), the process ends
at once: unwinding would free what it built object by object, as slowly as it was built.
"""

from __future__ import annotations

import contextlib
import os


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
