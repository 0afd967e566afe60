"""How a rank ends: its failure told to the launcher in one line, its distributed state released in
order before the process group goes.

Failures. torch.multiprocessing hands the launcher only a rank's formatted traceback, whose last
line is the last line of the exception's message: for an error raised by torch's pipelining stage
around a gloo timeout that is `            kwargs: {}`. So each rank writes its exception's type and
message (`rank<r>.json`, with the time it failed) into a directory the launcher gives it; the
launcher reports the earliest failure (the others are usually its consequences: a peer's closed
connection) as `rank R failed: Type: message` on one line (`failure_line`).

Teardown. A rank that reaches `destroy_process_group` still holding DTensors or DeviceMeshes keeps
the gloo groups they reference alive until the interpreter shuts down, and a gloo group destroyed
then can abort the process (SIGABRT, exit code -6: the path PyTorch documents for an abort at
exit). `end_rank` runs after `train_rank` has returned (its objects are unreferenced by then):
collect the cycles, empty the caches torch.distributed.tensor keeps (they hold meshes, and meshes
hold groups), collect again, destroy the subgroups, wait for every rank, destroy the default group.
Setting PARAPLAN_TEARDOWN_RECORD to a directory makes each rank write what was still alive before the
caches were emptied and at `destroy_process_group` (`teardown_rank<r>.json`: DTensors,
DeviceMeshes): the tests' evidence that nothing is.
"""

from __future__ import annotations

import gc
import json
import os
import re
import time
from pathlib import Path

RECORD_ENV = "PARAPLAN_TEARDOWN_RECORD"
MESSAGE_CHARS = 300  # a one-line report stays readable; the rest of a long message is cut


# --- failures --------------------------------------------------------------------------------------

def one_line(exc: BaseException) -> str:
    """`Type: message` on one line: the message's first meaningful line (with the next one when it
    only introduces it, ending in ':'), and the innermost cause when the exception wraps one (torch's
    pipelining re-raises a stage's error as 'failed to run forward: args: ... kwargs: ...'). A
    ParaplanError is already written for people: its message alone."""
    from paraplan.errors import ParaplanError

    cause, seen = exc.__cause__, {id(exc)}
    while cause is not None and cause.__cause__ is not None and id(cause.__cause__) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__
    # a wrapper's details (the stage's arguments) say less than its cause: its first line only
    text = _condense(str(exc), details=cause is None)
    if not isinstance(exc, ParaplanError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if cause is not None:
        text += f" (caused by {type(cause).__name__}: {_condense(str(cause))})"
    return _cut(text)


# where in torch's or gloo's C++ sources an error was raised: noise in a line for people
_SOURCE_PREFIX = re.compile(r"^\[[^\]\s]*\.(?:cc|cpp|cxx|h|hpp):\d+\]\s*")


def _condense(message: str, details: bool = True) -> str:
    """The first non-blank line, whitespace collapsed; with `details`, the next line too when the
    first only introduces it (ends in ':'), else without that colon."""
    lines = [_SOURCE_PREFIX.sub("", re.sub(r"\s+", " ", line).strip()) for line in message.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    if lines[0].endswith(":"):
        return " ".join(lines[:2]) if details and len(lines) > 1 else lines[0].rstrip(":")
    return lines[0]


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."


def record_failure(error_dir: str | None, rank: int, exc: BaseException) -> None:
    """Tell the launcher why this rank stopped (written whole, then renamed into place)."""
    if not error_dir:
        return
    try:
        path = Path(error_dir) / f"rank{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": rank, "time": time.time(), "error": one_line(exc)}))
        os.replace(tmp, path)
    except OSError:
        pass  # the launcher falls back to the traceback torch hands it


def recorded_failures(error_dir: str | Path) -> list[dict]:
    """The ranks' failure records, earliest first."""
    out = []
    for path in Path(error_dir).glob("rank*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r["time"])


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)): ?(.*)$")


def from_traceback(text: str) -> str:
    """A formatted traceback's exception as `Type: message` on one line: from its last line that
    names an exception (the message's own lines follow it)."""
    lines = text.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        match = _EXCEPTION_LINE.match(lines[i])
        if match:
            name = match.group(1).rpartition(".")[2]
            message = _condense("\n".join([match.group(2), *lines[i + 1:]]))
            return _cut(f"{name}: {message}" if message else name)
    meaningful = [line.strip() for line in lines if line.strip()]
    return _cut(meaningful[-1]) if meaningful else "(no message)"


# --- teardown --------------------------------------------------------------------------------------

def clear_distributed_caches() -> None:
    """Empty the caches torch.distributed.tensor keeps across runs: sharding propagation (Python and
    the C++ fast path), redistribution plans, the random-number tracker, the mesh stack. Their keys
    and values hold DTensorSpecs, and a spec holds its DeviceMesh and so its process groups."""
    try:
        from torch.distributed.tensor import _random, _redistribute
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:  # a torch without these private helpers (written against 2.13): leave its caches
        return
    _clear_sharding_prop_cache()
    _redistribute.clear_redistribute_planner_cache()
    _random._rng_tracker = None
    try:
        from torch.distributed.device_mesh import _mesh_resources

        _mesh_resources.mesh_stack.clear()
    except (ImportError, AttributeError):
        pass
    # every other memo of torch.distributed (transform infos, tensor metas, expanded strategies, mesh
    # topologies): some are created inside functions, so found by type rather than by name; those
    # the forkserver froze with its heap it listed (system/warm_heap.py: gc.get_objects skips them)
    from paraplan.system.warm_heap import INHERITED_MEMOS, distributed_memos

    for memo in [*INHERITED_MEMOS, *distributed_memos(gc.get_objects())]:
        memo.cache_clear()


def live_distributed_objects() -> dict[str, int]:
    """How many DTensors and DeviceMeshes this process still holds (after a collection)."""
    import warnings

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    gc.collect()
    counts = {"dtensors": 0, "meshes": 0}
    with warnings.catch_warnings():  # isinstance on some torch internals warns (deprecated aliases)
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, DTensor):
                counts["dtensors"] += 1
            elif isinstance(obj, DeviceMesh):
                counts["meshes"] += 1
    return counts


def end_rank(rank: int, *, finished: bool) -> None:
    """Release this rank's distributed state in order and destroy its process groups. `finished`:
    training ended normally on every rank, so the closing barrier can be met (after a failure the
    other ranks may be gone; the launcher stops them)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    record = os.environ.get(RECORD_ENV)
    gc.collect()  # the run's own cycles (modules and their FSDP states, hooks) go first
    before = live_distributed_objects() if record else None  # what only torch's caches still hold
    clear_distributed_caches()
    gc.collect()
    if record:
        Path(record, f"teardown_rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "at_destroy": live_distributed_objects(), "before_caches_cleared": before}))
    default = dist.group.WORLD
    from torch.distributed.distributed_c10d import _world

    # the subgroups (ours, the meshes', FSDP2's) newest first, as torch orders its own teardown of WORLD;
    # every rank has left its last collective on them (train_rank ends with a barrier)
    for group in sorted(_world.pg_names, key=_world.pg_names.get, reverse=True):
        if group is not default:
            dist.destroy_process_group(group)
    if finished:
        dist.barrier()  # shared/notes/runtime-on-cpu.md: without it a rare abort at exit after DTensor runs
    dist.destroy_process_group()
