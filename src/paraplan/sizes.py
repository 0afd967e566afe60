"""Memory sizes written by a person: '16GiB', '12GB', '512MiB'.

The Python API (`memory="16GiB"`) and the command line (`--memory 16GiB`) read them here; the
command line only turns a refusal into its usage error.
"""

from __future__ import annotations

import re

from paraplan.errors import FieldError, ParaplanError

GIB = 2**30
_UNITS = {"gib": 2**30, "gb": 2**30, "g": 2**30, "mib": 2**20, "mb": 2**20, "m": 2**20, "tib": 2**40, "tb": 2**40}


class SizeError(ParaplanError):
    """A size that cannot be read, or one that is not positive and finite."""


def size_gib(text: str) -> float:
    """'16GiB' -> 16.0 (GiB); a bare number is GiB. GB is read as GiB, as the papers' tables mean it
    (a 24 GB TITAN holds 24 GiB of memory)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in {**_UNITS, "": 1}:
        raise SizeError(f"expected a size such as 16GiB or 512MiB, got {text!r}")
    value = float(m.group(1)) * (_UNITS.get(m.group(2).lower(), GIB))
    if not 0 < value < float("inf"):  # 400 digits read as a float are infinite
        raise SizeError(f"must be a positive, finite size, got {text!r}")
    return value / GIB


def gib_bytes(gib: float) -> int:
    """A budget in GiB (--memory-gib, a parsed size) as whole bytes."""
    return int(gib * GIB)


def memory_bytes(memory) -> int | None:
    """A memory budget as the API takes it: None, whole bytes, or a size such as '16GiB' (one
    budget for every device; per device kind: `memory_by_kind`)."""
    if memory is None or isinstance(memory, int):
        return memory
    if by_kind(memory):
        return None
    try:
        return gib_bytes(size_gib(str(memory)))
    except Exception:
        raise FieldError("memory", f"expected bytes or a size like 16GiB, got {memory!r}") from None


def by_kind(memory) -> bool:
    """Whether a budget names device kinds: a mapping, or text such as 'a100=36GiB,v100=28GiB'."""
    return isinstance(memory, dict) or (isinstance(memory, str) and "=" in memory)


def memory_by_kind(memory) -> tuple[tuple[str, int], ...]:
    """A budget per device kind, as (kind, bytes) pairs: from {'a100': '36GiB', 'v100': 28 * 2**30}
    or 'a100=36GiB,v100=28GiB' (kinds as the cluster names its device types, or a prefix naming
    one: planners/request.py resolves them); () for a budget of every device or none."""
    if not by_kind(memory):
        return ()
    items = memory.items() if isinstance(memory, dict) else [part.split("=", 1) for part in memory.split(",")]
    out = []
    for item in items:
        if len(item) != 2 or not str(item[0]).strip():
            raise FieldError("memory", f"expected kind=size pairs such as a100=36GiB,v100=28GiB, got {memory!r}")
        kind, size = str(item[0]).strip(), item[1]
        try:
            nbytes = size if isinstance(size, int) else gib_bytes(size_gib(str(size)))
        except SizeError as exc:
            raise FieldError("memory", f"{kind}: {exc}") from None
        if nbytes < 1 or kind in dict(out):
            raise FieldError("memory", f"{kind}: {'given twice' if kind in dict(out) else 'must be positive'}")
        out.append((kind, nbytes))
    return tuple(out)
