"""The checkpoints of `paraplan train --checkpoint-dir`, and the check a resumed run makes before
any rank starts.

A checkpoint (version 3) is the training state keyed by the whole model's parameter names, written
by torch.distributed.checkpoint into `step<N>/` (runtime/state/layout_state.py: each rank offers what its
plan gives it, DCP writes each piece once), and a manifest, `checkpoint.json`, written last by rank
0 once DCP's save has completed on every rank: the step, every file of `step<N>/` with its size and
sha256, the losses so far, fp16's loss scale, and a record of what resuming must match (the model
and its sizes, the global batch, the optimizer and its hyper-parameters, where the data stood) and
the plan it was written under. The plan is not among what must match: the state belongs to the
model, so a run saved under one plan resumes under another (other stages, other DP / SDP / TP
degrees, another precision: issue 32), DCP re-sharding it. The checkpoint is the manifest: a
directory it does not name is not part of it. The step is in the directory's name so that a save
that fails half-way (a full disk, a killed rank) leaves the previous checkpoint whole: its manifest
still names its own files, which are removed only once a newer manifest is in place.

Everything a resumed run could trip over later is checked here, before launch, in one line: a
missing or damaged file (the sha256 names it), another model, batch, optimizer or data, and
`--steps` not past the checkpoint's step. Without it the failures came after the ranks started (a
KeyError in the optimizer, a damaged file deep in DCP, a missing losses.json).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

RECORD_VERSION = 3  # 1: a record inside each stage<i>.pt; 2: one torch.save file per stage, same plan only
MANIFEST = "checkpoint.json"
FORMAT = "paraplan.checkpoint"
# what a run may find in its checkpoint directory and writes there (checked before launch)
FILES = (MANIFEST,)  # and step<N>/ directories, which DCP writes into
# torch's switches between implementations of the same update, not hyper-parameters
_IMPLEMENTATION = {"foreach", "fused", "capturable", "differentiable"}


def state_dir(step: int) -> str:
    return f"step{step}"


def checkpoint_record(config) -> dict:
    """What a checkpoint must match to be resumed under `config` (the run's RunConfig), as it is
    stored in the manifest (JSON values)."""
    plan = config.plan
    record = {"model": config.model, "seq_len": config.seq_len, "image_size": config.image_size,
              "global_batch": plan.global_batch, "optimizer": optimizer_record(config),
              "data": data_record(config), "plan": plan_layout(plan)}
    return json.loads(json.dumps(record))  # tuples as lists, enums as strings: as read back


def plan_layout(plan) -> dict:
    """The plan's cut into stages and devices, micro-batches and schedule."""
    return {"n_layers": plan.n_layers, "n_micro": plan.n_micro, "schedule": str(plan.schedule),
            "precision": str(plan.precision),
            "stages": [{"layers": [s.layers.start, s.layers.stop], "devices": list(s.devices),
                        "strategies": sorted({str(st) for st in s.strategies})} for s in plan.stages]}


def optimizer_record(config) -> dict:
    """The optimizer's name and every hyper-parameter torch gives it (lr, betas / momentum, eps,
    weight decay, ...) and the clipping: the optimizer's state is only meaningful under them."""
    import torch

    from paraplan.runtime.rank.rank_base import make_optimizer

    group = make_optimizer(config, [torch.zeros(1, requires_grad=True)]).param_groups[0]
    hyper = {k: v for k, v in sorted(group.items()) if k != "params" and k not in _IMPLEMENTATION
             and isinstance(v, (int, float, bool, tuple, type(None)))}
    return {"name": str(config.optimizer), **hyper, "clip_norm": config.clip_norm}


def data_record(config) -> dict:
    """Where the batches come from: the step's batch is drawn from (seed, step), from synthetic
    data or from a file (its absolute path and size: another file would continue elsewhere)."""
    if config.data is None:
        return {"source": "synthetic", "seed": config.seed}
    path = Path(config.data).resolve()
    size = path.stat().st_size if path.is_file() else None
    return {"source": str(path), "dtype": config.data_dtype, "bytes": size, "seed": config.seed}


# --- writing and reading (inside the ranks) ---------------------------------------------------

def save_checkpoint(config, step: int, named: dict, optim, losses: list, loss_scale: float, module=None,
                    zero=()) -> None:
    """Collective over every rank: DCP writes the state into step<step>/, then rank 0 writes the
    manifest, then the directories of older steps go. A full disk raises WriteError (one line)."""
    import shutil

    import torch.distributed as dist

    from paraplan.runtime.state import layout_state

    directory = Path(config.checkpoint_dir)
    target = directory / state_dir(step)
    if dist.get_rank() == 0 and target.exists():  # a save of this step that never completed
        shutil.rmtree(target)
    dist.barrier()
    try:
        layout_state.save(named, optim, str(target), module, zero)
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        # DCP fails on every rank at once (its finish step gathers the ranks' results), so every
        # rank can say whether it met a full disk: one line from each, whichever rank met it
        full = [False] * dist.get_world_size()
        dist.all_gather_object(full, _is_full_disk(exc))
        if any(full):
            from paraplan.system.fileio import WriteError

            raise WriteError(f"no space left on device: {target}") from None
        raise
    dist.barrier()
    if dist.get_rank() == 0:
        files = [{"file": p.relative_to(directory).as_posix(), "bytes": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(target.rglob("*")) if p.is_file()]
        write_manifest(directory, step, files, checkpoint_record(config), losses, loss_scale)
    dist.barrier()  # the new manifest is in place: the directories of older steps are no longer part of any
    if dist.get_rank() == 0:
        for old in _state_dirs(directory):
            if old.name != target.name:
                shutil.rmtree(old, ignore_errors=True)


def _is_full_disk(exc: BaseException) -> bool:
    """Whether a full disk (or quota) is behind `exc` or behind one of the failures a DCP
    CheckpointException carries (rank -> (exception, traceback))."""
    from paraplan.system.fileio import no_space

    failures = [v[0] if isinstance(v, tuple) else v for v in (getattr(exc, "failures", None) or {}).values()]
    return any(no_space(e) for e in (exc, *failures) if isinstance(e, BaseException))


def write_manifest(directory: Path, step: int, files: list[dict], record: dict, losses: list | None = None,
                   loss_scale: float = 1.0) -> None:
    """The manifest, written last and atomically: from now on the checkpoint is these files."""
    from paraplan.system.fileio import atomic_write_text

    manifest = {"format": FORMAT, "version": RECORD_VERSION, "step": step, "state": state_dir(step),
                "files": files, "losses": list(losses or []), "loss_scale": loss_scale, "record": record}
    atomic_write_text(Path(directory) / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def load_checkpoint(checkpoint_dir: str | Path, named: dict, optim, module=None, zero=()) -> tuple[int, list, float]:
    """Collective: this plan's state read from the checkpoint (written under any plan of the model;
    check_resume has checked it); (its step, the losses so far, fp16's loss scale)."""
    from paraplan.runtime.state import layout_state

    directory = Path(checkpoint_dir)
    manifest = json.loads((directory / MANIFEST).read_text())
    layout_state.load(named, optim, str(directory / manifest["state"]), module, zero)
    return manifest["step"], list(manifest["losses"]), float(manifest.get("loss_scale", 1.0))


def remove_unlisted(checkpoint_dir: str | Path) -> None:
    """After a failed run: the state directories of a save that did not complete (its manifest was
    never written) and the temporaries of killed writers. What the manifest lists stays."""
    import shutil

    from paraplan.system.fileio import remove_temporaries

    directory = Path(checkpoint_dir)
    remove_temporaries(directory)
    try:
        listed = json.loads((directory / MANIFEST).read_text())["state"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no readable manifest: nothing here is known to be ours
    for path in _state_dirs(directory):
        if path.name != listed:
            shutil.rmtree(path, ignore_errors=True)


def _state_dirs(directory: Path) -> list[Path]:
    """The state directories a save writes (`step<N>`, real directories): never anything else a
    user keeps in the checkpoint directory."""
    import re

    return [p for p in directory.glob("step*")
            if re.fullmatch(r"step\d+", p.name) and p.is_dir() and not p.is_symlink()]


# --- checking (before launch) -------------------------------------------------------------

def check_resume(config) -> int:
    """Before any rank starts: config.checkpoint_dir holds a whole checkpoint (its manifest and
    every file it lists, sha256 checked) written by this model, batch, optimizer, data and plan,
    at a step below config.steps. Returns that step; raises FieldError("resume" or "steps", ...)
    in one line naming the file or what differs."""
    from paraplan.errors import FieldError
    from paraplan.system.fileio import not_regular, read_json

    def refuse(detail: str, field: str = "resume"):
        raise FieldError(field, detail)

    if not config.checkpoint_dir:
        refuse("needs a checkpoint directory")
    directory = Path(config.checkpoint_dir)
    path = directory / MANIFEST
    if not_regular(path):
        refuse(not_regular(path))
    if not path.exists():
        older = sorted(p.name for p in directory.glob("stage*.pt")) if directory.is_dir() else []
        if older:
            refuse(f"{directory} holds {', '.join(older[:3])} but no {MANIFEST}: a checkpoint of an older paraplan "
                   "or a save that never completed; start again without resuming")
        refuse(f"{path} does not exist: no checkpoint was written in {directory}")
    manifest = read_json(path, "the checkpoint's manifest", lambda text: FieldError("resume", text))
    step, files, record = _fields(manifest, path, refuse)
    _compare(record, checkpoint_record(config), path, refuse)
    if config.steps <= step:
        refuse(f"must be more than {step} to train further: the checkpoint is at step {step}", "steps")
    if not any(Path(e["file"]).name == ".metadata" for e in files):
        refuse(f"{path}: field 'files' lists no DCP .metadata: not a whole checkpoint")
    for entry in files:
        _check_file(directory, entry, path, manifest["state"], refuse)
    return step


def _fields(manifest, path: Path, refuse) -> tuple[int, list[dict], dict]:
    """The manifest's step, files and record, each checked for its type (one line naming the file
    and the field)."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        refuse(f"{path} is not a paraplan checkpoint manifest (expected \"format\": \"{FORMAT}\")")
    if manifest.get("version") != RECORD_VERSION:
        refuse(f"{path}: checkpoint version {manifest.get('version')!r}, this paraplan reads version "
               f"{RECORD_VERSION}; start again without resuming")
    step, files, record = manifest.get("step"), manifest.get("files"), manifest.get("record")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        refuse(f"{path}: field 'step' must be a whole number of at least 1, got {step!r}")
    if manifest.get("state") != state_dir(step):
        refuse(f"{path}: field 'state' must be {state_dir(step)!r} (the step's directory), got {manifest.get('state')!r}")
    if not isinstance(record, dict):
        refuse(f"{path}: field 'record' must be an object (what the checkpoint belongs to), got {record!r}")
    losses = manifest.get("losses")
    if not isinstance(losses, list) or not all(isinstance(x, int | float) for x in losses):
        refuse(f"{path}: field 'losses' must list numbers, got {losses!r}")
    fields = {"file": str, "bytes": int, "sha256": str}
    if not isinstance(files, list) or not files or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), t) for k, t in fields.items()) for e in files):
        refuse(f"{path}: field 'files' must list objects with {', '.join(fields)}")
    return step, files, record


def _compare(found: dict, expected: dict, path: Path, refuse) -> None:
    """The first difference between the checkpoint's record and this run's, as one line."""
    model = ("model", "seq_len", "image_size")
    if any(found.get(k) != expected[k] for k in model):
        refuse(f"{path} belongs to another model: {_describe_model(found)}; this run trains {_describe_model(expected)}")
    if found.get("global_batch") != expected["global_batch"]:
        refuse(f"the checkpoint was written with global batch {found.get('global_batch')}; this plan's is "
               f"{expected['global_batch']}: resuming with another batch is not supported (the data and "
               "the optimizer's steps would not continue)")
    was, now = found.get("optimizer") or {}, expected["optimizer"]
    if was.get("name") != now["name"]:
        refuse(f"the checkpoint was written with the {was.get('name')} optimizer, not {now['name']}: its state "
               "does not carry over to another optimizer", "optimizer")
    if was != now:
        first = next(k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k))
        refuse(f"the checkpoint was written with {now['name']} {_differences(was, now)}: resuming needs the same "
               "optimizer settings", first if first in ("lr", "clip_norm") else "resume")
    if found.get("data") != expected["data"]:
        refuse(f"the checkpoint's batches came from {_describe_data(found.get('data'))}; this run's come from "
               f"{_describe_data(expected['data'])}: resuming must continue from the same data position")
    # the plan may differ: the state is keyed by the model's parameter names (runtime/state/layout_state.py)


def _check_file(directory: Path, entry: dict, manifest: Path, state: str, refuse) -> None:
    from paraplan.system.fileio import not_regular

    parts = Path(entry["file"]).parts
    if len(parts) < 2 or parts[0] != state or ".." in parts:
        refuse(f"{manifest}: field 'files' must name files in {directory / state}, got {entry['file']!r}")
    path = directory / entry["file"]
    if not_regular(path):
        refuse(not_regular(path))
    if not path.exists():
        refuse(f"{path} does not exist: the checkpoint ({manifest.name}) lists it")
    size = path.stat().st_size
    if size != entry["bytes"]:
        refuse(f"{path} is damaged: {size} bytes, {manifest.name} says {entry['bytes']}")
    if _sha256(path) != entry["sha256"]:
        refuse(f"{path} is damaged: its sha256 does not match {manifest.name}'s; start again without resuming")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _differences(was: dict, now: dict) -> str:
    keys = [k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
    return ", ".join(f"{k.replace('_', ' ')} {was.get(k)} (this run: {now.get(k)})" for k in keys)


def _describe_model(record: dict) -> str:
    sizes = "".join(f", {k.replace('_', ' ')} {record[k]}" for k in ("seq_len", "image_size")
                    if record.get(k) is not None)
    return f"{record.get('model')!r}{sizes}"


def _describe_data(data) -> str:
    if not isinstance(data, dict):
        return repr(data)
    if data.get("source") == "synthetic":
        return f"synthetic data, seed {data.get('seed')}"
    dtype = f" ({data['dtype']})" if data.get("dtype") and not str(data.get("source")).endswith(".npz") else ""
    return f"{data.get('source')}{dtype}, {data.get('bytes')} bytes, seed {data.get('seed')}"


def resume_note(config, step: int) -> str | None:
    """One line when the checkpoint was written under another plan than this run's (None: the same)."""
    manifest = json.loads((Path(config.checkpoint_dir) / MANIFEST).read_text())
    was, now = manifest["record"].get("plan"), checkpoint_record(config)["plan"]
    if was == now:
        return None
    return (f"resuming step {step} under another plan: written under {_describe_plan(was)}; now "
            f"{_describe_plan(now)} (the state re-sharded by torch.distributed.checkpoint)")


def _describe_plan(layout) -> str:
    if not isinstance(layout, dict):
        return repr(layout)
    stages = "; ".join(f"layers {s['layers'][0]}-{s['layers'][1]} on {s['devices']}"
                       + (f" as {', '.join(s['strategies'])}" if s.get("strategies") else "")
                       for s in layout.get("stages", []) if isinstance(s, dict))
    return (f"{len(layout.get('stages', []))} stage{'s' if len(layout.get('stages', [])) != 1 else ''} ({stages}), "
            f"{layout.get('n_micro')} micro-batches, {layout.get('schedule')}, {layout.get('precision', 'fp32')}")
