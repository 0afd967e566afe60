"""Profiles on disk: versioned JSON, validated on load with errors naming the file and field."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from paraplan.costs.profile import LayerProfile, Profile, StepCheck, Timing
from paraplan.errors import ParaplanError
from paraplan.system.fileio import atomic_write_text, is_finite_number, read_json

FORMAT_VERSION = 1


class ProfileFileError(ParaplanError):
    pass


def profile_to_dict(profile: Profile) -> dict:
    """JSON-ready (lists, not tuples)."""
    return json.loads(json.dumps(asdict(profile)))


def _timing(d, where: str, origin: str) -> Timing:
    try:
        t = Timing(**{k: d[k] for k in ("median_s", "min_s", "max_s", "q1_s", "q3_s", "repeats")})
    except (KeyError, TypeError) as exc:
        raise ProfileFileError(f"{origin}: {where}: expected a timing with median_s, min_s, max_s, q1_s, q3_s, "
                               f"repeats ({exc})") from None
    if not all(is_finite_number(v) and v >= 0 for v in asdict(t).values()):
        raise ProfileFileError(f"{origin}: {where}: timings must be non-negative numbers")
    return t


def _byte_counts(values, where: str, origin: str, n: int | None) -> tuple[int, ...]:
    """Non-negative whole byte counts, `n` of them (any number when None)."""
    if not isinstance(values, list) or (n is not None and len(values) != n):
        raise ProfileFileError(f"{origin}: {where}: expected {n if n is not None else 'a list of'} byte counts"
                               + (", one per batch size" if n is not None else ""))
    if not all(is_finite_number(x) and x >= 0 for x in values):
        raise ProfileFileError(f"{origin}: {where}: byte counts must be non-negative numbers")
    return tuple(int(x) for x in values)


def _number(value, where: str, origin: str) -> float:
    if not is_finite_number(value) or value < 0:
        raise ProfileFileError(f"{origin}: {where}: expected a non-negative number, got {value!r}")
    return float(value)


def profile_from_dict(d: object, origin: str = "profile") -> Profile:
    if not isinstance(d, dict):
        raise ProfileFileError(f"{origin}: expected a JSON object")
    if d.get("format_version") != FORMAT_VERSION:
        raise ProfileFileError(f"{origin}: format_version: expected {FORMAT_VERSION}, got {d.get('format_version')!r}")
    for key in ("model", "device", "device_name", "machine", "torch_version", "date", "inputs"):
        if not isinstance(d.get(key), str):
            raise ProfileFileError(f"{origin}: {key}: expected a string")
    for key in ("threads", "warmup", "repeats"):
        if not isinstance(d.get(key), int) or d[key] < 0:
            raise ProfileFileError(f"{origin}: {key}: expected a non-negative integer")
    layers_in = d.get("layers")
    if not isinstance(layers_in, list) or not layers_in:
        raise ProfileFileError(f"{origin}: layers: expected a non-empty list")
    layers = []
    for i, layer in enumerate(layers_in):
        where = f"layers[{i}]"
        if not isinstance(layer, dict):
            raise ProfileFileError(f"{origin}: {where}: expected an object")
        sizes = layer.get("batch_sizes")
        if (not isinstance(sizes, list) or not sizes or not all(isinstance(b, int) and b > 0 for b in sizes)
                or sizes != sorted(set(sizes))):
            raise ProfileFileError(f"{origin}: {where}.batch_sizes: expected increasing positive integers")
        for key in ("forward", "backward", "output_bytes", "saved_bytes"):
            if not isinstance(layer.get(key), list) or len(layer[key]) != len(sizes):
                raise ProfileFileError(f"{origin}: {where}.{key}: expected {len(sizes)} entries, one per batch size")
        layers.append(LayerProfile(
            name=str(layer.get("name", i)), kind=str(layer.get("kind", "")), batch_sizes=tuple(sizes),
            forward=tuple(_timing(t, f"{where}.forward[{k}]", origin) for k, t in enumerate(layer["forward"])),
            backward=tuple(_timing(t, f"{where}.backward[{k}]", origin) for k, t in enumerate(layer["backward"])),
            output_bytes=_byte_counts(layer["output_bytes"], f"{where}.output_bytes", origin, len(sizes)),
            saved_bytes=_byte_counts(layer["saved_bytes"], f"{where}.saved_bytes", origin, len(sizes)),
            peak_bytes=_byte_counts(layer.get("peak_bytes", []), f"{where}.peak_bytes", origin, None)))
    check = None
    if d.get("step_check") is not None:
        c = d["step_check"]
        if not isinstance(c, dict) or not isinstance(c.get("batch"), int) or isinstance(c["batch"], bool) \
                or c["batch"] < 1:
            raise ProfileFileError(f"{origin}: step_check: expected an object with a positive whole batch")
        check = StepCheck(batch=c["batch"], measured=_timing(c.get("measured"), "step_check.measured", origin),
                          sum_of_layers_s=_number(c.get("sum_of_layers_s"), "step_check.sum_of_layers_s", origin))
    repeats = d.get("repeatability", [])
    if not isinstance(repeats, list):
        raise ProfileFileError(f"{origin}: repeatability: expected a list of numbers")
    return Profile(model=d["model"], inputs=d["inputs"], device=d["device"], device_name=d["device_name"],
                   machine=d["machine"], torch_version=d["torch_version"], threads=d["threads"], date=d["date"],
                   warmup=d["warmup"], repeats=d["repeats"], layers=tuple(layers), step_check=check,
                   repeatability=tuple(_number(x, "repeatability", origin) for x in repeats),
                   format_version=FORMAT_VERSION)


def read_profile(path: str | Path) -> Profile:
    return profile_from_dict(read_json(path, "profile", ProfileFileError), str(path))


def write_profile(profile: Profile, path: str | Path) -> None:
    atomic_write_text(path, json.dumps(profile_to_dict(profile), indent=1) + "\n")
