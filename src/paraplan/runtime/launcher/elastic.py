"""Training that carries on when a machine is lost (issue 53 item 5): which rung of a fallback ladder
(plans/ladder_file.py) a run continues under, from which checkpoint, and the record of each switch.

Two launchers, one rule. Under `paraplan train --elastic` without torchrun, paraplan's own launcher
(runtime/launcher/launch.py: spawn) sees a rank's process end without a word (`RankLost`), stops
the others, and starts the ladder's next rung that holds a plan on the ranks left, resuming from the
last checkpoint (cli/train_elastic.py). Under torchrun the work is divided differently, and
torchrun's elastic agent does the restarting, not paraplan: when one worker dies, its agent stops
its node's other workers and, while restarts remain (`--max-restarts`), starts them again after a
new rendezvous; the world stays the same size if every node's agent is still there (the same rung
again), and shrinks only when a node's agent has left (killed with its machine), between
`--nnodes MIN:MAX`. Each restarted worker picks the rung whose plan has as many devices as the
world it finds (`rung_for_world`) and resumes from the checkpoint; rank 0 logs which case it was,
from the world size the previous attempt recorded in the checkpoint directory (`ELASTIC_STATE`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

ELASTIC_STATE = "elastic.json"  # in the checkpoint directory: the last attempt's world, rung and restart
ELASTIC_LOG = "elastic.log"  # in the checkpoint directory: one line per start and switch


@dataclass(frozen=True)
class Switch:
    """One switch of an elastic run: the rank lost, the rungs and devices before and after, the
    checkpoint step the run carried on from, and how long the switch took (the lost run's stop,
    the new launch and its set-up up to its first step)."""

    lost_rank: int | None
    from_rung: int
    to_rung: int
    from_devices: int
    to_devices: int
    from_step: int
    seconds: float | None = None


def devices_text(n: int) -> str:
    return f"{n} device{'' if n == 1 else 's'}"


def next_rung(rungs, current: int) -> int | None:
    """The first rung after `current` that holds a plan, or None."""
    return next((k for k in range(current + 1, len(rungs)) if rungs[k] is not None), None)


def rung_for_world(rungs, world: int) -> int | None:
    """The first rung whose plan runs on `world` devices (a torchrun world after a restart)."""
    return next((k for k, plan in enumerate(rungs) if plan is not None and len(plan.devices) == world), None)


def checkpoint_step(checkpoint_dir: str | Path) -> int | None:
    """The step of the last whole checkpoint in `checkpoint_dir` (its manifest), or None."""
    from paraplan.runtime.state.checkpoints import MANIFEST

    path = Path(checkpoint_dir) / MANIFEST
    try:
        step = json.loads(path.read_text()).get("step")
    except (OSError, ValueError):
        return None
    return step if isinstance(step, int) else None


def log_line(checkpoint_dir: str | Path, text: str) -> None:
    """Append one line to the run's elastic log (and it is printed by the caller)."""
    with open(Path(checkpoint_dir) / ELASTIC_LOG, "a", encoding="utf-8") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


def torchrun_attempt_line(checkpoint_dir: str | Path, rung: int, world: int) -> str:
    """Rank 0 of a torchrun attempt: what happened since the previous attempt, from the state it
    recorded (the world it had), and this attempt recorded for the next. One line."""
    path = Path(checkpoint_dir) / ELASTIC_STATE
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        before = None
    step = checkpoint_step(checkpoint_dir)
    start = "from the start" if step is None else f"from the checkpoint at step {step}"
    if before is None:
        line = f"elastic: start on {devices_text(world)}, rung {rung} ({start})"
    elif before.get("world") == world:
        line = (f"elastic: torchrun restart {restart}: a worker failed and torchrun restarted the group at the same "
                f"size ({devices_text(world)}): rung {rung} again, {start}")
    else:
        line = (f"elastic: torchrun restart {restart}: the world went from {before.get('world')} to "
                f"{devices_text(world)} (a node's agent left): rung {before.get('rung')} -> rung {rung}, {start}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"world": world, "rung": rung, "restart": restart}) + "\n")
    os.replace(tmp, path)
    return line
