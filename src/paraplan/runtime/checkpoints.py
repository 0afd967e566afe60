"""The checkpoints of `paraplan train --checkpoint-dir`, and the check a resumed run makes before
any rank starts.

A checkpoint is one file per stage, `stage<i>-step<N>.pt`, written by replica 0 of the stage (its
parameters, optimizer and RNG state, the step and the losses so far), and a manifest,
`checkpoint.json`, written last by rank 0 once every stage's file is complete: the step, each
file's size and sha256, and a record of everything resuming must match (the model and its sizes,
the global batch, the optimizer and its hyper-parameters, where the data stood, and the plan's
layout: stages, devices, micro-batches and schedule, enough for a later change to re-shard from).
The checkpoint is the manifest: a stage file it does not list is not part of it. The step is in
the file names so that a save that fails half-way (a full disk, a killed rank) leaves the previous
checkpoint whole: its manifest still names its own files, which are removed only once a newer
manifest is in place.

Everything a resumed run could trip over later is checked here, before launch, in one line: a
missing or damaged file (the sha256 names it), another model, batch, optimizer, data or plan, and
`--steps` not past the checkpoint's step. Without it the failures came after the ranks started (a
KeyError in the optimizer, miniz on a damaged file, a missing losses.json).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

RECORD_VERSION = 2  # 1: a record inside each stage<i>.pt, no manifest, no checksums
MANIFEST = "checkpoint.json"
FORMAT = "paraplan.checkpoint"
KEYS = ("module", "optimizer", "rng", "step", "losses")
# what a run may find in its checkpoint directory and writes there (checked before launch)
FILES = (MANIFEST, "stage*.pt")
# torch's switches between implementations of the same update, not hyper-parameters
_IMPLEMENTATION = {"foreach", "fused", "capturable", "differentiable"}


def stage_file(stage: int, step: int) -> str:
    return f"stage{stage}-step{step}.pt"


def checkpoint_record(config) -> dict:
    """What a checkpoint must match to be resumed under `config` (the run's TrainConfig), as it is
    stored in the manifest (JSON values)."""
    plan = config.plan
    record = {"model": config.model, "seq_len": config.seq_len, "image_size": config.image_size,
              "global_batch": plan.global_batch, "optimizer": optimizer_record(config),
              "data": data_record(config), "plan": plan_layout(plan)}
    return json.loads(json.dumps(record))  # tuples as lists, enums as strings: as read back


def plan_layout(plan) -> dict:
    """The plan's cut into stages and devices, micro-batches and schedule."""
    return {"n_layers": plan.n_layers, "n_micro": plan.n_micro, "schedule": str(plan.schedule),
            "stages": [{"layers": [s.layers.start, s.layers.stop], "devices": list(s.devices)} for s in plan.stages]}


def optimizer_record(config) -> dict:
    """The optimizer's name and every hyper-parameter torch gives it (lr, betas / momentum, eps,
    weight decay, ...) and the clipping: the optimizer's state is only meaningful under them."""
    import torch

    from paraplan.runtime.rank_base import make_optimizer

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


# --- writing (inside the ranks) ------------------------------------------------------------

def save_checkpoint(config, stage: int, step: int, state, writes: bool) -> None:
    """Collective over every rank: the writers (replica 0 of each stage) write their stage's file,
    rank 0 writes the manifest once all are written, then each writer removes its stage's older
    files. `state()` gives the writer's state dict. A full disk raises WriteError (one line)."""
    import torch.distributed as dist

    directory = Path(config.checkpoint_dir)
    entry = write_stage(directory, stage, step, state()) if writes else None
    entries: list = [None] * dist.get_world_size()
    dist.all_gather_object(entries, entry)
    if dist.get_rank() == 0:
        write_manifest(directory, step, [e for e in entries if e is not None], checkpoint_record(config))
    dist.barrier()  # the new manifest is in place: the files of older steps are no longer part of any
    if writes:
        for old in directory.glob(f"stage{stage}-step*.pt"):
            if old.name != entry["file"]:
                old.unlink(missing_ok=True)


def write_stage(directory: Path, stage: int, step: int, state: dict) -> dict:
    """One stage's file, atomically; its manifest entry (name, size, sha256 of the bytes written)."""
    from paraplan.system.fileio import atomic_torch_save

    name = stage_file(stage, step)
    digest, size = atomic_torch_save(state, Path(directory) / name)
    return {"stage": stage, "file": name, "bytes": size, "sha256": digest}


def write_manifest(directory: Path, step: int, entries: list[dict], record: dict) -> None:
    """The manifest, written last and atomically: from now on the checkpoint is these files."""
    from paraplan.system.fileio import atomic_write_text

    manifest = {"format": FORMAT, "version": RECORD_VERSION, "step": step,
                "stages": sorted(entries, key=lambda e: e["stage"]), "record": record}
    atomic_write_text(Path(directory) / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def load_stage(checkpoint_dir: str | Path, stage: int) -> dict:
    """A stage's state, from the file the manifest names (check_resume has checked it)."""
    import torch

    manifest = json.loads((Path(checkpoint_dir) / MANIFEST).read_text())
    entry = next(e for e in manifest["stages"] if e["stage"] == stage)
    return torch.load(Path(checkpoint_dir) / entry["file"], map_location="cpu", weights_only=False)


def remove_unlisted(checkpoint_dir: str | Path) -> None:
    """After a failed run: the stage files of a save that did not complete (its manifest was never
    written) and the temporaries of killed writers. What the manifest lists stays."""
    from paraplan.system.fileio import remove_temporaries

    directory = Path(checkpoint_dir)
    remove_temporaries(directory)
    try:
        listed = {e["file"] for e in json.loads((directory / MANIFEST).read_text())["stages"]}
    except (OSError, ValueError, KeyError, TypeError):
        return  # no readable manifest: nothing here is known to be ours
    for path in directory.glob("stage*-step*.pt"):
        if path.name not in listed and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)


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
    step, entries, record = _fields(manifest, path, refuse)
    _compare(record, checkpoint_record(config), path, refuse)
    if config.steps <= step:
        refuse(f"must be more than {step} to train further: the checkpoint is at step {step}", "steps")
    if len(entries) != config.plan.n_stages:
        refuse(f"{path}: field 'stages' lists {len(entries)} files for a plan of {config.plan.n_stages} stages")
    for stage, entry in enumerate(entries):
        _check_file(directory, stage, entry, path, refuse)
    return step


def _fields(manifest, path: Path, refuse) -> tuple[int, list[dict], dict]:
    """The manifest's step, stage entries and record, each checked for its type (one line naming
    the file and the field)."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        refuse(f"{path} is not a paraplan checkpoint manifest (expected \"format\": \"{FORMAT}\")")
    if manifest.get("version") != RECORD_VERSION:
        refuse(f"{path}: checkpoint version {manifest.get('version')!r}, this paraplan reads version "
               f"{RECORD_VERSION}; start again without resuming")
    step, entries, record = manifest.get("step"), manifest.get("stages"), manifest.get("record")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        refuse(f"{path}: field 'step' must be a whole number of at least 1, got {step!r}")
    if not isinstance(record, dict):
        refuse(f"{path}: field 'record' must be an object (what the checkpoint belongs to), got {record!r}")
    fields = {"stage": int, "file": str, "bytes": int, "sha256": str}
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), t) for k, t in fields.items()) for e in entries):
        refuse(f"{path}: field 'stages' must list objects with {', '.join(fields)}")
    return step, entries, record


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
    if found.get("plan") != expected["plan"]:
        refuse(f"resuming under another plan is not supported yet: the checkpoint was written under "
               f"{_describe_plan(found.get('plan'))}; this plan is {_describe_plan(expected['plan'])}")


def _check_file(directory: Path, stage: int, entry: dict, manifest: Path, refuse) -> None:
    from paraplan.system.fileio import not_regular

    if entry["stage"] != stage or Path(entry["file"]).name != entry["file"]:
        refuse(f"{manifest}: field 'stages' entry {stage} must name stage {stage}'s file in {directory}, got {entry}")
    path = directory / entry["file"]
    if not_regular(path):
        refuse(not_regular(path))
    if not path.exists():
        refuse(f"{path} does not exist: the checkpoint ({manifest.name}) lists it for stage {stage}")
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


def _describe_plan(layout) -> str:
    if not isinstance(layout, dict):
        return repr(layout)
    stages = "; ".join(f"layers {s['layers'][0]}-{s['layers'][1]} on {s['devices']}"
                       for s in layout.get("stages", []) if isinstance(s, dict))
    return (f"{len(layout.get('stages', []))} stages ({stages}), {layout.get('n_micro')} micro-batches, "
            f"{layout.get('schedule')}")
