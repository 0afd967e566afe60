"""`paraplan ARGS` as a process of its own, forked from a warm one.

The command-line tests want what a user gets: a separate process, its exit status, its stdout and
stderr at the file-descriptor level, its own working directory and environment, signals and a
timeout. Starting `python -m paraplan` for each costs 4-6 s of one core in imports (torch,
transformers, torch.distributed.tensor), most of the suite's time. So the process is forked from a
multiprocessing forkserver that imported those modules once (per pytest worker) and has run no
kernel (so no thread pool is copied into the child); the child sets its directory and environment,
points fds 1 and 2 at files and runs `paraplan.cli.main` as `python -m paraplan` would
(src/paraplan/__main__.py). What a command itself starts (ranks, the comparison's processes) is
started as it is for a user.

The README's and the user guide's commands still start `python -m paraplan` / `paraplan` as
written (tests/unit/test_readme_commands.py, tests/distributed/guide_commands.py), so the real
entry points stay covered.
"""

import multiprocessing
import os
import subprocess
import sys
import tempfile

from paraplan.runtime.launcher.launch import RANK_MODULES

# what every command imports anyway; a name that fails to import is skipped by the forkserver
# (one forkserver per process: the runtime's ranks start from it too, so its modules are here)
PRELOAD = ["paraplan.cli", "paraplan.models.measure", "paraplan.models.zoo", "numpy", "matplotlib.pyplot",
           *RANK_MODULES]
_context = None


def _forkserver():
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _context = context
    return _context


# commands that may start processes of their own (ranks, link probes), for which a spare server is forked
_LAUNCHING = ("train", "calibrate", "profile", "profile-links")


def _spare_rank_server() -> None:
    """The command's own forkserver (system/processes.py starts one for its ranks) as a fork of this
    process as it is now, not a fresh interpreter importing the same modules again (~4 s a command).

    Now, before the command has run anything, this process is what a fresh rank server is once its
    preloads are in: the warm server's copy (PRELOAD holds the ranks' modules; its heap frozen by
    paraplan.system.warm_heap), no kernel run, one thread. So a spare copy is forked here and waits.
    If the command starts its forkserver, multiprocessing's own ensure_running does everything as
    usual but the spawn: the listening socket and the alive pipe it passes the new interpreter go to
    the spare, which serves (multiprocessing.forkserver.main, as the fresh one runs it). A command
    that never launches leaves, and the spare reads the end of its socket and goes. Later servers
    (a dead one replaced) and every other spawn (the resource tracker) start as usual."""
    import multiprocessing.forkserver as forkserver
    import socket
    from multiprocessing import reduction, util

    ours, spare_end = socket.socketpair(socket.AF_UNIX)
    pid = os.fork()
    if pid == 0:  # the spare
        ours.close()
        try:
            try:
                listener_fd, alive_r = reduction.recvfds(spare_end, 2)
            except (EOFError, OSError):
                os._exit(0)
            spare_end.close()
            forkserver.main(listener_fd, alive_r, [])
        finally:
            os._exit(0)
    spare_end.close()
    spawn_fresh = util.spawnv_passfds

    def spawn(path, args, passfds):
        if "multiprocessing.forkserver import main" not in args[-1]:
            return spawn_fresh(path, args, passfds)
        util.spawnv_passfds = spawn_fresh  # once
        reduction.sendfds(ours, list(passfds))  # [the listening socket, the alive pipe's read end]
        ours.close()
        return pid

    util.spawnv_passfds = spawn


def _child(args: list[str], cwd: str, env: dict, out_path: str, err_path: str, script: str | None = None,
           code_path: str | None = None) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    if script is not None or (args and args[0] in _LAUNCHING) or any(a in ("--prove", "--try-top") for a in args):
        _spare_rank_server()
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115 (lives until os._exit)
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    code = 1
    try:
        if script is None:
            from paraplan.cli import main

            sys.argv = [os.path.join(os.path.dirname(sys.executable), "paraplan"), *args]
            code = main(args)
        else:  # `python SCRIPT ARGS`: the script's folder first on the path, as python puts it
            import runpy

            sys.argv = [script, *args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
            code = 0
    except SystemExit as exc:  # argparse's refusals and --help
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        code = code if isinstance(code, int) else 1
        if code_path is not None:  # the status itself, should the forkserver's report of it be lost
            with open(code_path, "w") as status:
                status.write(str(code))
        os._exit(code)


def run_paraplan(*args, cwd=None, env=None, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """Like `subprocess.run([sys.executable, "-m", "paraplan", *args], capture_output=True,
    text=True, cwd=cwd, env=env, timeout=timeout, check=check)`, from a warm process."""
    return _run_forked(None, args, cwd, env, timeout, check)


def run_script(script, *args, cwd=None, env=None, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """Like `subprocess.run([sys.executable, SCRIPT, *args], ...)`, from a warm process: the script
    runs as `__main__` (runpy), its folder first on sys.path."""
    return _run_forked(str(script), args, cwd, env, timeout, check)


def start_paraplan(*args, cwd=None, env=None) -> "Started":
    """Like `subprocess.Popen([sys.executable, "-m", "paraplan", *args], ...)`, from a warm process:
    signal it by its `pid`, `wait()` for what run_paraplan returns."""
    return Started(None, args, cwd, env)


class Started:
    """A command forked from the warm process, running: its pid; `wait` gives its CompletedProcess."""

    def __init__(self, script: str | None, args, cwd, env):
        self.args = [str(a) for a in args]
        self.argv = [sys.executable, "-m", "paraplan", *self.args] if script is None else [sys.executable, script, *self.args]
        self._tmp = tempfile.TemporaryDirectory(prefix="paraplan-cli-")
        self._out, self._err, self._code = (os.path.join(self._tmp.name, name) for name in ("out", "err", "code"))
        for path in (self._out, self._err):
            open(path, "w").close()
        self._process = _forkserver().Process(target=_child, args=(
            self.args, str(cwd or os.getcwd()), dict(os.environ if env is None else env), self._out, self._err, script,
            self._code))
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        return None if self._process.is_alive() else self._process.exitcode

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
            self._tmp.cleanup()
            raise subprocess.TimeoutExpired(self.argv, timeout)
        # The forkserver reports the status over a pipe and multiprocessing says 255 where that
        # report is lost (CI saw a --help that printed all of itself exit "255"); the child's own
        # record of it wins, and a child killed before writing one keeps the forkserver's figure.
        code = self._process.exitcode
        if os.path.exists(self._code):
            with open(self._code) as status:
                code = int(status.read() or code)
        with open(self._out) as out, open(self._err) as err:
            done = subprocess.CompletedProcess(self.argv, code, out.read(), err.read())
        self._tmp.cleanup()
        return done


def _run_forked(script: str | None, args, cwd, env, timeout: float, check: bool) -> subprocess.CompletedProcess:
    done = Started(script, args, cwd, env).wait(timeout)
    if check:
        done.check_returncode()
    return done


def refused(res, *needles):
    """Exit 2, one line on stderr naming every needle, no traceback."""
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr
