"""The checkpoints of `paraplan train --checkpoint-dir`: one file per stage, `stage<i>.pt`, written
by replica 0 of each stage (its parameters, optimizer and RNG state, the step and the losses so
far, and a record of the plan and model it belongs to), and the check a resumed run makes before
any rank starts: every stage's file exists, loads, belongs to this plan and model, and all stages
stopped at the same step. Without it a missing file surfaces as a peer closing its connection,
a minute later.
"""

from __future__ import annotations

from pathlib import Path

RECORD_VERSION = 1
KEYS = ("module", "optimizer", "rng", "step", "losses")


def checkpoint_path(checkpoint_dir: str | Path, stage: int) -> Path:
    return Path(checkpoint_dir) / f"stage{stage}.pt"


def checkpoint_record(config, stage: int) -> dict:
    """What a stage's checkpoint belongs to: the model (and its input sizes) and the plan's cut
    into stages. `config` is the run's TrainConfig."""
    plan = config.plan
    return {"version": RECORD_VERSION, "model": config.model, "seq_len": config.seq_len,
            "image_size": config.image_size, "n_layers": plan.n_layers,
            "stages": [[s.layers.start, s.layers.stop] for s in plan.stages], "stage": stage}


def _describe(record: dict) -> str:
    sizes = "".join(f", {k.replace('_', ' ')} {record[k]}" for k in ("seq_len", "image_size")
                    if record.get(k) is not None)
    return f"{record.get('model')!r}{sizes}, stages {record.get('stages')}"


def check_resume(config) -> int:
    """Before any rank starts: each stage's checkpoint in config.checkpoint_dir exists, loads, was
    written for this plan and model, and all stopped at the same step (returned). Raises
    FieldError("resume", ...) naming the bad file."""
    import torch

    from paraplan.errors import FieldError

    if not config.checkpoint_dir:
        raise FieldError("resume", "needs a checkpoint directory")
    steps = {}
    for stage in range(config.plan.n_stages):
        path = checkpoint_path(config.checkpoint_dir, stage)
        if not path.is_file():
            what = "is not a file" if path.exists() else "does not exist"
            raise FieldError("resume", f"{path} {what}: resuming needs a checkpoint of each of the plan's "
                                       f"{config.plan.n_stages} stages")
        try:
            state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception as exc:  # whatever a damaged file raises, it is one line
            text = str(exc).strip()
            detail = text.splitlines()[0].split(". ")[0] if text else type(exc).__name__
            raise FieldError("resume", f"{path} does not load as a checkpoint: {detail}") from None
        if not isinstance(state, dict) or any(k not in state for k in KEYS):
            raise FieldError("resume", f"{path} is not a paraplan train checkpoint (expected {', '.join(KEYS)})")
        record, expected = state.get("paraplan"), checkpoint_record(config, stage)
        if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
            raise FieldError("resume", f"{path} has no record of its plan and model (written by an older "
                                       "paraplan); start again without resuming")
        if record != expected:
            raise FieldError("resume", f"{path} belongs to another run: stage {record.get('stage')} of "
                                       f"{_describe(record)}; this is stage {stage} of {_describe(expected)}")
        steps[path] = int(state["step"])
        del state
    if len(set(steps.values())) > 1:
        listed = ", ".join(f"{p.name} at step {s}" for p, s in steps.items())
        raise FieldError("resume", f"the stages' checkpoints are from different steps ({listed}): "
                                   "a run stopped while saving; start again without resuming")
    return next(iter(steps.values()))
