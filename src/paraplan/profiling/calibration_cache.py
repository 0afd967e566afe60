"""This machine measured once, then always used (issue 33): the calibration `paraplan calibrate
--quick` makes, cached in the user's cache directory and found again by what identifies the
measurement.

The key: the CPU model, the core count, torch's version, the thread settings a run inherits
(OMP_NUM_THREADS, MKL_NUM_THREADS), paraplan's version, and the precision (bf16 on a CPU is not
fp32's speed: the fp32 calibration is made first, then each other precision's compute is measured
when a plan in it first needs it). The entry is a calibrated cluster file,
`$XDG_CACHE_HOME/paraplan/local-<key hash>-<precision>.toml` (~/.cache without XDG_CACHE_HOME),
its key written beside it for the record. Two processes that find no entry at once (two test
workers, two terminals) make one: the maker holds an exclusive lock (fcntl.flock) on
`<entry>.lock`, the other waits on it and then reads what was made.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

APP = "paraplan"


@dataclass(frozen=True)
class CachedCalibration:
    path: Path  # the calibrated cluster file
    made: bool  # measured now (False: found in the cache)
    seconds: float  # how long the measurement took (0 when found)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / APP


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> dict:
    """What identifies a measurement of this machine (the precision apart)."""
    import torch

    from paraplan.version import __version__

    return {"cpu": cpu_model(), "cores": os.cpu_count() or 1, "torch": torch.__version__,
            "threads": {k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
            "paraplan": __version__}


def entry_path(key: dict, precision: str) -> Path:
    import hashlib

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"local-{digest}-{precision}.toml"


def cached(precision: str, make: Callable[[Path], None], *, key: dict | None = None,
           allowed: bool = True) -> CachedCalibration | None:
    """The cache entry of this machine in `precision`: found, or made by `make(path)` (which
    writes the calibrated cluster file at `path`, atomically) under the entry's lock. None when
    there is none and `allowed` is False (the Python API measures only when asked)."""
    import fcntl
    import time

    key = key if key is not None else machine_key()
    path = entry_path(key, precision)
    if path.is_file():
        return CachedCalibration(path, False, 0.0)
    if not allowed:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a+")
    except OSError as exc:
        from paraplan.errors import ParaplanError

        raise ParaplanError(f"cannot keep this machine's calibration in {path.parent} ({exc.strerror}): set "
                            "XDG_CACHE_HOME to a writable directory, or plan on the analytic preset") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another maker's measurement finishes first
        try:
            if path.is_file():
                return CachedCalibration(path, False, 0.0)
            t0 = time.perf_counter()
            make(path)
            write_key(path, key, precision)
            return CachedCalibration(path, True, time.perf_counter() - t0)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_key(path: Path, key: dict, precision: str) -> None:
    from paraplan.system.fileio import atomic_write_text

    atomic_write_text(path.with_suffix(".key.json"), json.dumps({**key, "precision": precision}, indent=1) + "\n")


def key_precision(precision: str | None) -> str:
    """The precision a calibration is kept for: a CPU computes tf32 as fp32."""
    return precision if precision in ("bf16", "fp16") else "fp32"


def machine_calibration(precision: str | None, *, allowed: bool = True,
                        on_start: Callable[[Path], None] = lambda path: None,
                        progress: Callable[[str], None] = lambda text: None) -> CachedCalibration | None:
    """This machine's calibration in `precision`: the cached one, or (when `allowed`) one made now
    with `paraplan calibrate --quick` on every core (fp32), then, for bf16 / fp16, that precision's
    compute measured (profiling/calibrate_precision.py). `on_start(path)` is called before a
    measurement starts (to say so)."""
    from paraplan.hardware.cluster_file import read_cluster_file
    from paraplan.hardware.cluster_write import write_cluster_file

    precision = key_precision(precision)

    def make_fp32(path: Path) -> None:
        from paraplan.profiling.calibrate import calibrate

        on_start(path)
        result = calibrate(quick=True, progress=progress)
        write_cluster_file(result.cluster, path, calibration=result.evidence)

    base = cached("fp32", make_fp32, allowed=allowed)
    if base is None or precision == "fp32":
        return base

    def make_other(path: Path) -> None:
        from paraplan.profiling.calibrate_precision import calibrate_precision

        on_start(path)
        write_cluster_file(calibrate_precision(read_cluster_file(base.path), precision, progress), path)

    other = cached(precision, make_other, allowed=allowed)
    if other is None:
        return None
    return CachedCalibration(other.path, other.made or base.made, other.seconds + base.seconds)


def local_cluster(name: str | None, precision: str | None, *, skip: bool = False, make: bool = True,
                  on_start: Callable[[Path], None] = lambda path: None,
                  on_made: Callable[[CachedCalibration], None] = lambda found: None) -> str | None:
    """What a cluster name means where a prediction is asked for (issue 33), for the Python API and
    the command line alike: `name` itself, or for `local` (unless `skip`: a profile, or the analytic
    preset asked for) the path of this machine's calibration in `precision`, the cached one or, when
    `make`, one measured now (`on_start(path)` before, `on_made(found)` after); `local` itself
    when there is none."""
    if name != "local" or skip:
        return name
    found = machine_calibration(precision, allowed=make, on_start=on_start)
    if found is None:
        return name
    if found.made:
        on_made(found)
    return str(found.path)


def store(cluster_file: Path) -> Path:
    """`paraplan calibrate` (on every core): its cluster file becomes this machine's fp32 entry; the
    other precisions' entries, measured against the previous one, go."""
    import shutil

    key = machine_key()
    path = entry_path(key, "fp32")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from paraplan.errors import ParaplanError

        raise ParaplanError(f"cannot keep this machine's calibration in {path.parent} ({exc.strerror}): set "
                            "XDG_CACHE_HOME to a writable directory") from None
    for old in path.parent.glob(path.name.replace("-fp32.toml", "-*.toml")):
        old.unlink(missing_ok=True)
    tmp = path.with_suffix(".tmp")
    shutil.copyfile(cluster_file, tmp)
    tmp.replace(path)
    write_key(path, key, "fp32")
    return path
