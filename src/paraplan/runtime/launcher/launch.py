"""Start the ranks of a plan on this machine, or join a torchrun launch unchanged."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch.multiprocessing as mp

from paraplan.errors import ParaplanError
from paraplan.runtime.config import TrainConfig
from paraplan.system.localnet import free_port
from paraplan.system.processes import WARM_MODULES, start_method

# The ranks start from a forkserver that imported the runtime once per launching process
# (system/processes.py); the launcher's environment is passed and applied in each rank.
RANK_MODULES = WARM_MODULES


class RankLost(ParaplanError):
    """A rank's process ended without a word (killed, crashed, its machine gone), as opposed to a
    rank that raised: what an elastic run (runtime/launcher/elastic.py) carries on from."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def spawn(config: TrainConfig, world: int) -> None:
    """One process per device of the plan, gloo on 127.0.0.1. Whatever ends the launch (a rank
    that dies or fails, Ctrl-C, SIGTERM), every rank is stopped before the launcher returns, and a
    rank's failure becomes one clear line: `rank R failed: Type: message` from what the rank itself
    recorded (runtime/launcher/teardown.py), the earliest failure when several ranks failed. The ranks also
    die with the launcher if it is killed outright (die_with_parent, die_with_launcher)."""
    import logging
    import tempfile

    # torch logs "Terminating process ..." for every survivor it stops; our one line says it all
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="paraplan-ranks-") as error_dir:
        context = mp.start_processes(worker_main, args=(world, free_port(), config, error_dir, dict(os.environ), os.getpid()),
                                     nprocs=world, join=False, start_method=start_method())
        failure, lost = None, None
        try:
            while not context.join():
                pass
        except mp.ProcessExitedException as exc:
            # a rank gone without a word (a signal, os._exit): the others' errors are its consequences
            failure, lost = _lost_line(exc.error_index, exc.exit_code), exc.error_index
        except mp.ProcessRaisedException as exc:
            failure = exc
            # a rank that raised because a peer had already died (gloo's closed connection): the dead one
            lost = _died_silently(context.processes, error_dir)
        finally:
            _stop(context.processes)
        if isinstance(failure, mp.ProcessRaisedException):
            failure = rank_failure(error_dir, failure.error_index, str(failure)) if lost is None else \
                _lost_line(lost, context.processes[lost].exitcode)
        if failure is not None:
            if lost is not None:
                raise RankLost(failure, lost) from None
            raise ParaplanError(failure) from None


def _lost_line(rank: int, code) -> str:
    return f"training stopped: rank {rank} exited with code {code}; the other ranks were stopped"


def _died_silently(processes, error_dir: str) -> int | None:
    """The first rank whose process has ended with a non-zero code without recording a failure."""
    from paraplan.runtime.launcher.teardown import recorded_failures

    recorded = {r["rank"] for r in recorded_failures(error_dir)}
    for rank, process in enumerate(processes):
        if process.exitcode not in (None, 0) and rank not in recorded:
            return rank
    return None


def _stop(processes) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent (the launcher) dies, however it dies
    (a SIGKILL included), so a rank never trains on as an orphan. Elsewhere a no-op."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


def die_with_launcher(launcher_pid: int) -> None:
    """This rank gets SIGTERM when the launcher dies, however it dies. A rank started from the
    forkserver is the server's child, not the launcher's, and the server outlives the launcher while
    its children hold its 'alive' pipe (multiprocessing hands every child that pipe), so the parent's
    death signal alone would leave the ranks training on; a thread watches the launcher itself
    (a pidfd: woken at its exit, no polling)."""
    import select
    import signal
    import threading
    import time

    try:
        pidfd = os.pidfd_open(launcher_pid)
    except ProcessLookupError:  # already gone
        os._exit(1)
    except (AttributeError, OSError):  # not Linux >= 5.3: poll
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while True:
                time.sleep(0.5)
                try:
                    os.kill(launcher_pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="paraplan-launcher-watch", daemon=True).start()


def worker_main(rank: int, world: int, port: int, config: TrainConfig, error_dir: str | None = None,
                environ: dict[str, str] | None = None, launcher_pid: int | None = None) -> None:
    """One started rank. A failure's type and message go to `error_dir` for the launcher (torch hands
    it only the traceback); the teardown releases DTensors, meshes and groups in order
    (runtime/launcher/teardown.py). `environ`: the launcher's environment, which a rank forked from the
    forkserver would otherwise not see."""
    import datetime

    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)

    import torch
    import torch.distributed as dist

    from paraplan.runtime.kinds import train_rank
    from paraplan.runtime.launcher.teardown import end_rank, record_failure
    from paraplan.runtime.rank.rank_base import backend

    die_with_parent()
    if launcher_pid is not None:
        die_with_launcher(launcher_pid)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    finished = False
    try:
        dist.init_process_group(backend(), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=config.timeout_s))
        train_rank(config)  # returns before the teardown: its objects are unreferenced by then
        finished = True
        end_rank(rank, finished=True)
    except BaseException as exc:
        record_failure(error_dir, rank, exc)
        if not finished:
            with contextlib.suppress(Exception):  # the training's error is the one to report
                end_rank(rank, finished=False)  # no closing barrier: the other ranks may be gone
        raise


def rank_failure(error_dir, error_index: int, traceback_text: str) -> str:
    """The line for a launch a rank's exception ended: the earliest failure the ranks recorded, or,
    if none did (it failed before it could), the exception read off torch's traceback text."""
    from paraplan.runtime.launcher.teardown import from_traceback, recorded_failures

    recorded = recorded_failures(error_dir)
    if recorded:
        rank, error = recorded[0]["rank"], recorded[0]["error"]
    else:
        rank, error = error_index, from_traceback(traceback_text)
    return f"training stopped: rank {rank} failed: {error}"


def default_run_dir(root: str | Path = "runs") -> Path:
    """Where a run writes when no directory is given: runs/<date>-<time> under the current
    directory (with -2, -3, ... if that is taken); not created here. The processes of a torchrun
    launch cannot agree on a clock second without talking, so there it is runs/torchrun-<the
    rendezvous's port>, the same for every rank."""
    import datetime

    root = Path(root)
    if under_torchrun():
        return root / f"torchrun-{os.environ.get('MASTER_PORT', 'run')}"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = root / stamp, 1
    while path.exists():
        n += 1
        path = root / f"{stamp}-{n}"
    return path


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def _loopback(address: str) -> bool:
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: another machine's, as far as gloo's interface is concerned
        return False


def run_under_torchrun(config: TrainConfig) -> dict:
    """Each torchrun process is one rank; the environment says which (RANK, WORLD_SIZE, MASTER_*)."""
    import datetime

    import torch
    import torch.distributed as dist

    from paraplan.runtime.kinds import train_rank
    from paraplan.runtime.launcher.teardown import end_rank
    from paraplan.runtime.rank.rank_base import backend

    if _loopback(os.environ.get("MASTER_ADDR", "")):
        # every rank on this host: gloo on the loopback interface (../shared/notes/runtime-on-cpu.md);
        # across machines gloo must pick a real interface (or the user's GLOO_SOCKET_IFNAME)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)

    timeout = datetime.timedelta(seconds=config.timeout_s)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # a restart after torchrun's elastic agent re-rendezvoused (an elastic run, runtime/launcher/
        # elastic.py): the agent hands the workers the same store every round, and the default group's
        # keys of the last round (its gloo ranks' addresses, some of them dead) would be read again
        # (gloo waits on them for ever); this round's keys under a prefix of their own
        store = dist.PrefixStore(f"paraplan/restart{restart}", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
            is_master=False, timeout=timeout))
        dist.init_process_group(backend(), store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    else:
        dist.init_process_group(backend(), timeout=timeout)
    rank = dist.get_rank()
    try:
        result = train_rank(config)  # returns before the teardown: its objects are unreferenced by then
    except BaseException:
        with contextlib.suppress(Exception):  # the training's error is the one to report
            end_rank(rank, finished=False)
        raise
    end_rank(rank, finished=True)  # in order, as spawned ranks (worker_main)
    return result


def check_before_launch(config: TrainConfig, world: int, n_layers: int, layers=None, built=None) -> None:
    """Refuse a plan that cannot run, before any process starts: one clear line. `layers` (the
    model's layer list, on meta) lets plans with per-layer strategies be checked layer by layer;
    `built` (the model built on meta) is what an operator placement's trace replays, so that the
    launcher builds the model once. What is checked is the plan's kind's (runtime/kinds.py)."""
    from paraplan.runtime.kinds import RUNNERS

    RUNNERS[config.plan.kind].check(config, world, n_layers, layers, built)


def launch_checked(config: TrainConfig, world: int | None = None) -> Path:
    """A plan's training run from this process, as `paraplan.train` and `paraplan train` run it
    once their arguments are read: every check that can be made before a rank starts (the plan
    against the world and the model, the model's output against its loss, the data file, a
    checkpoint to resume), then the output directory (only then: a refused run leaves nothing),
    then the ranks; returns the output directory (a new temporary one if the config names none).
    Calibrate and `--prove` launch their runs this way rather than as `paraplan
    train` processes, so that their ranks fork from this process's one warm forkserver."""
    from paraplan.models import source
    from paraplan.runtime.launcher.preflight import check_model_fits_loss
    from paraplan.system.fileio import make_dirs_all

    if world is not None and (isinstance(world, bool) or not isinstance(world, int) or world < 1):
        from paraplan.errors import FieldError

        raise FieldError("nproc", f"must be a positive whole number of ranks, got {world!r}")
    world = world or len(config.plan.devices)
    # the model built on meta once for every check of the launch (the ranks build their own)
    built = source.build(config.model, device="meta", seq_len=config.seq_len, image_size=config.image_size)
    layers = built.layers()
    check_before_launch(config, world, len(layers), layers, built)
    check_model_fits_loss(built, config.plan, layers, config.seed)
    if config.data is not None:
        from paraplan.runtime.rank.data import check_data

        check_data(config.data, config.data_dtype, built.inputs, config.model)
    if config.resume:
        from paraplan.runtime.state.checkpoints import check_resume

        check_resume(config)
    if config.out_dir is None:
        import tempfile
        from dataclasses import replace

        config = replace(config, out_dir=tempfile.mkdtemp(prefix="paraplan-train-"))
    make_dirs_all(config.out_dir, config.checkpoint_dir or None)  # as `paraplan train` makes them
    spawn(config, world)
    return Path(config.out_dir)
