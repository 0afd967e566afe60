"""`paraplan train --plan LADDER --elastic --checkpoint-dir D`: training that carries on when a rank
is lost (issue 53 item 5; how the work divides between paraplan's launcher and torchrun's elastic
agent: runtime/launcher/elastic.py).

Without torchrun this process is the supervisor: it runs rung K's plan (`--rung`, default 0); when a
rank's process ends without a word (`RankLost`: killed, crashed, its machine gone) the others are
stopped, and the run goes on from the last checkpoint under the ladder's next rung that holds a plan,
on that rung's ranks, logged in D's `elastic.log`. A rank that raises (a bug, bad data) is not a lost
machine and ends the run as before. Under torchrun, each worker takes the rung of the world torchrun
gives it and resumes from D's checkpoint; torchrun's agent restarts the workers."""

from __future__ import annotations

import copy
import time
from pathlib import Path

from paraplan.errors import ParaplanError


def run_elastic(args, run_plan) -> int:
    from paraplan.plans.ladder_file import ladder_rungs
    from paraplan.runtime.launcher.launch import default_run_dir, under_torchrun

    rungs = ladder_rungs(args.plan)
    if rungs is None:
        raise ParaplanError(f"--elastic: {args.plan} is a plan; an elastic run needs a fallback ladder "
                            "(paraplan plan --fallbacks F) to carry on under")
    if not args.checkpoint_dir:
        raise ParaplanError("--elastic: needs --checkpoint-dir (a run carries on from its last checkpoint)")
    if args.resume or args.print_launch or args.nproc is not None:
        flag = "--resume" if args.resume else "--print-launch" if args.print_launch else "--nproc"
        raise ParaplanError(f"--elastic: {flag} is decided by the run itself (the checkpoint found, the rung's devices)")
    _check_rungs_checkpoint(args.plan, rungs)
    if under_torchrun():
        return _torchrun_attempt(args, rungs, run_plan)
    rung = 0 if args.rung is None else args.rung
    if not 0 <= rung < len(rungs) or rungs[rung] is None:
        raise ParaplanError(f"--rung {rung}: {args.plan} has no plan on rung {rung}")
    args = copy.copy(args)
    if args.out_dir is None:  # one output directory for every rung's run
        args.out_dir = str(default_run_dir())
        if not args.json:
            print(f"writing to {args.out_dir}", flush=True)
    return _supervise(args, rungs, rung, run_plan)


def _check_rungs_checkpoint(path, rungs) -> None:
    """Every rung must be able to write and read a checkpoint: a run carries on only through one."""
    from paraplan.runtime.kinds import RUNNERS

    for k, plan in enumerate(rungs):
        why = None if plan is None else RUNNERS[plan.kind].checkpoints_refused(plan)
        if why:
            raise ParaplanError(f"--elastic: rung {k} of {path} cannot carry a run on: {why}")


def _supervise(args, rungs, rung: int, run_plan) -> int:
    from paraplan.runtime.launcher.elastic import Switch, checkpoint_step, devices_text, log_line, next_rung
    from paraplan.runtime.launcher.launch import RankLost
    from paraplan.system.fileio import make_dirs_all

    make_dirs_all(args.checkpoint_dir)
    say = (lambda text: None) if args.json else (lambda text: print(text, flush=True))
    switches: list[Switch] = []
    lost_at = None
    while True:
        step = checkpoint_step(args.checkpoint_dir)
        if step is not None and step >= args.steps:
            return 0  # the last checkpoint is the run's end: nothing left to train
        attempt = copy.copy(args)
        attempt.resume = step is not None
        line = (f"elastic: rung {rung} on {devices_text(len(rungs[rung].devices))}, "
                + ("from the start" if step is None else f"from the checkpoint at step {step}"))
        log_line(args.checkpoint_dir, line)
        say(line)
        started = time.perf_counter()
        try:
            result = run_plan(attempt, rungs[rung])
        except RankLost as lost:
            k = next_rung(rungs, rung)
            if k is None:
                raise ParaplanError(f"{lost}; the ladder has no rung left to carry on under") from None
            resumed = checkpoint_step(args.checkpoint_dir) or 0
            text = (f"elastic: rank {lost.rank} lost on rung {rung} ({devices_text(len(rungs[rung].devices))}): carrying "
                    f"on under rung {k} ({devices_text(len(rungs[k].devices))}) from step {resumed}")
            log_line(args.checkpoint_dir, text)
            say(text)
            switches.append(Switch(lost.rank, rung, k, len(rungs[rung].devices), len(rungs[k].devices), resumed))
            lost_at, rung = time.perf_counter(), k
            continue
        if lost_at is not None:
            _record_switch_time(args, switches, lost_at, started)
        return result


def _record_switch_time(args, switches, lost_at: float, started: float) -> None:
    """The last switch's time: from the lost rank's detection to the new run's first step (its wall
    time less what its steps took), logged and written beside the losses (elastic.json)."""
    import json
    from dataclasses import asdict, replace

    from paraplan.runtime.launcher.elastic import log_line
    from paraplan.system.fileio import atomic_write_text

    steps_path = Path(args.out_dir) / "steps_rank0.json"
    try:
        steps_s = sum(json.loads(steps_path.read_text()))
    except (OSError, ValueError, TypeError):
        steps_s = 0.0
    # the new run's wall time includes its end (the report, the final checkpoint): an upper bound
    seconds = (started - lost_at) + (time.perf_counter() - started - steps_s)
    switches[-1] = replace(switches[-1], seconds=seconds)
    text = f"elastic: the switch to rung {switches[-1].to_rung} took {seconds:.1f} s (lost rank to the new run's steps)"
    log_line(args.checkpoint_dir, text)
    if not args.json:
        print(text)
    atomic_write_text(Path(args.out_dir) / "elastic.json", json.dumps(
        {"schema": "paraplan.elastic/1", "switches": [asdict(s) for s in switches]}, indent=2))


def _torchrun_attempt(args, rungs, run_plan) -> int:
    """One torchrun worker of an elastic run: the rung of this world, resumed from the checkpoint if
    there is one; rank 0 logs what torchrun did since the last attempt."""
    import os

    from paraplan.runtime.launcher.elastic import (
        checkpoint_step,
        log_line,
        rung_for_world,
        torchrun_attempt_line,
    )

    world = int(os.environ["WORLD_SIZE"])
    rung = rung_for_world(rungs, world)
    if rung is None:
        sizes = sorted({len(p.devices) for p in rungs if p is not None})
        raise ParaplanError(f"--elastic: torchrun started {world} workers, and no rung of {args.plan} runs on {world} "
                            f"devices (its rungs run on {', '.join(map(str, sizes))})")
    step = checkpoint_step(args.checkpoint_dir)
    if step is not None and step >= args.steps:
        return 0
    if os.environ.get("RANK") == "0":
        Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        line = torchrun_attempt_line(args.checkpoint_dir, rung, world)
        log_line(args.checkpoint_dir, line)
        if not args.json:
            print(line, flush=True)
    attempt = copy.copy(args)
    attempt.resume = step is not None
    return run_plan(attempt, rungs[rung])
