"""Operator profiles on disk (`paraplan profile --operators`): versioned JSON, validated on load.

    {"format_version": 1, "kind": "operator-profile", "model": <model reference>,
     "device": "cpu", "device_name": ..., "threads": 1, "batches": [2, 4], "repeats": 5,
     "seconds": {<operator name>: [fixed_s, per_sample_s], ...}, "unmeasured": [...]}
"""

from __future__ import annotations

import json
from pathlib import Path

from paraplan.costs.op_costs import OperatorProfile
from paraplan.errors import ParaplanError
from paraplan.system.fileio import atomic_write_text, is_finite_number, read_json

FORMAT_VERSION = 1
KIND = "operator-profile"


class OperatorProfileError(ParaplanError):
    pass


def is_operator_profile(path: str | Path) -> bool:
    """Whether the JSON file at `path` is an operator profile (a layer profile otherwise)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return False  # the layer-profile reader reports the problem
    return isinstance(data, dict) and data.get("kind") == KIND


def operator_profile_to_dict(times, device_name: str, threads: int, repeats: int) -> dict:
    """`times`: profiling/operators.py's OperatorTimes."""
    return {"format_version": FORMAT_VERSION, "kind": KIND, "model": times.model, "device": times.device,
            "device_name": device_name, "threads": threads, "batches": list(times.batches), "repeats": repeats,
            "seconds": {name: [a.fixed, a.per_sample] for name, a in times.seconds.items()},
            "unmeasured": list(times.unmeasured)}


def write_operator_profile(data: dict, path: str | Path) -> None:
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def read_operator_profile(path: str | Path) -> OperatorProfile:
    d = read_json(path, "operator profile", OperatorProfileError)
    if not isinstance(d, dict) or d.get("kind") != KIND:
        raise OperatorProfileError(f"{path}: not an operator profile (kind {KIND!r})")
    if d.get("format_version") != FORMAT_VERSION:
        raise OperatorProfileError(f"{path}: format_version: expected {FORMAT_VERSION}, got {d.get('format_version')!r}")
    for key in ("model", "device_name", "seconds"):
        if key not in d:
            raise OperatorProfileError(f"{path}: missing field {key!r}")
    seconds = {}
    for name, pair in d["seconds"].items():
        # times are never negative (the profiler clamps its fits): a negative fixed time would make
        # an operator's split parts cheaper than the whole, which the lower bound relies on not being
        ok = isinstance(pair, list) and len(pair) == 2 and all(is_finite_number(x) and x >= 0 for x in pair)
        if not ok:
            raise OperatorProfileError(f"{path}: seconds[{name!r}]: expected [fixed_s, per_sample_s], two seconds "
                                       f">= 0, got {pair!r}")
        seconds[name] = (float(pair[0]), float(pair[1]))
    return OperatorProfile(model=str(d["model"]), device_name=str(d["device_name"]), seconds=seconds)
