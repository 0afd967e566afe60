"""A fallback ladder's file (`paraplan plan --fallbacks F`, planners/ladder.py): format
"paraplan.ladder", version 1, its rungs each with what it drops, its nodes and its best plan (a plan
document, plans/plan_file.py). `paraplan train --plan LADDER --rung K` trains rung K's plan."""

from __future__ import annotations

import json
from pathlib import Path

from paraplan.plans.plan import Plan, PlanError
from paraplan.plans.plan_file import plan_from_dict, plan_from_json
from paraplan.system.fileio import read_text

LADDER_FORMAT, LADDER_VERSION = "paraplan.ladder", 1


def _read(path: str | Path) -> tuple[list[Plan | None] | None, Plan | None]:
    """(the ladder's rungs, None) or (None, the plan) the file holds; one line if it is neither."""
    text = read_text(path, "plan", PlanError)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None  # plan_from_json says what is wrong with it
    if not isinstance(data, dict) or data.get("format") != LADDER_FORMAT:
        return None, plan_from_json(text, str(path))
    if data.get("version") != LADDER_VERSION:
        raise PlanError(f"{path}: ladder version {data.get('version')!r}, this paraplan reads version {LADDER_VERSION}")
    rungs = data.get("rungs")
    if not isinstance(rungs, list) or not rungs:
        raise PlanError(f"{path}: field 'rungs' must list the ladder's rungs")
    out = []
    for k, entry in enumerate(rungs):
        if not isinstance(entry, dict):
            raise PlanError(f"{path}: rung {k} must be an object")
        out.append(None if entry.get("plan") is None else plan_from_dict(entry["plan"], f"{path}: rung {k}"))
    return out, None


def ladder_rungs(path: str | Path) -> list[Plan | None] | None:
    """A ladder's rungs, each its plan or None where nothing fit; None when `path` holds a plain plan."""
    return _read(path)[0]


def read_plan_or_rung(path: str | Path, rung: int | None = None) -> Plan:
    """The plan a file holds: a plan document, or rung `rung` (default 0, the whole cluster) of a
    ladder; a rung of a plain plan, or one the ladder lacks, is one line."""
    rungs, plan = _read(path)
    if rungs is None:
        if rung is not None:
            raise PlanError(f"rung {rung}: {path} is a plan, not a fallback ladder")
        return plan
    k = 0 if rung is None else rung
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(rungs):
        raise PlanError(f"rung {rung}: {path} has rungs 0 to {len(rungs) - 1}")
    if rungs[k] is None:
        raise PlanError(f"{path}: rung {k} holds no plan (nothing fit on what it leaves)")
    return rungs[k]
