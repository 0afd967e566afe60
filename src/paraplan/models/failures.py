"""What a failure inside a model's build or measurement tells the user: one line, not a traceback.

paraplan runs code it did not write: transformers' modelling code, a user's module, torch's meta
kernels. Any of them can raise while paraplan builds the model, cuts it, measures it on the meta
device, traces its operator graph or profiles it, and a 134-line traceback from inside
transformers tells a user neither which step failed nor what to do (issue 46: MoE configs ended in
`RuntimeError: Expected inputs of BF16 type`). `model_step` turns such a failure into a
ParaplanError naming the model, the step and what to try; `PARAPLAN_TRACEBACK=1` keeps the
original traceback for whoever debugs paraplan itself.

KeyboardInterrupt and SIGTERM (BaseExceptions) pass untouched, as do paraplan's own one-line
errors and failures raised by paraplan's own code (a bug there keeps its traceback); a zoo model's
failure (paraplan's own definition) is one line saying it is paraplan's to fix.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from paraplan.errors import ParaplanError


class ModelStepError(ParaplanError):
    """A step on a model (build, cut, measure, trace, profile) failed inside code paraplan runs."""


def first_line(exc: BaseException) -> str:
    """The exception's type and the first non-empty line of its message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _raised_by_paraplan(exc: BaseException) -> bool:
    """Whether the innermost frame of the failure is paraplan's own code: a bug in paraplan keeps
    its traceback (errors.py), while one raised inside torch, transformers or a user's module is
    the model's and gets one line."""
    import traceback
    from pathlib import Path

    frames = traceback.extract_tb(exc.__traceback__)
    here = Path(__file__).resolve().parent.parent  # src/paraplan
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(here)


def _ours(model: str) -> bool:
    """A zoo model is paraplan's own definition: its failure is paraplan's bug (or a transformers
    version paraplan was not checked with), which the user cannot fix: the line says so."""
    from paraplan.models import ref as refs

    try:
        return refs.parse(model).kind == refs.ZOO
    except ParaplanError:
        return False


@contextmanager
def model_step(model: str, step: str, advice: str):
    """Around one step on `model`: any failure that is not already a ParaplanError becomes one line,
    "model M: STEP failed (Type: message); ADVICE"."""
    try:
        yield
    except ParaplanError:
        raise
    except Exception as exc:
        if os.environ.get("PARAPLAN_TRACEBACK") or isinstance(exc, SyntaxError) or _raised_by_paraplan(exc):
            raise
        if _ours(model):  # the user cannot fix paraplan's own definition: say whose it is
            advice = ("it is a zoo model, paraplan's own definition: a bug of paraplan's or of this transformers "
                      "version; please report it with the traceback")
        raise ModelStepError(f"model {model}: {step} failed ({first_line(exc)}); {advice} "
                             "(PARAPLAN_TRACEBACK=1 shows where)") from exc


# what to try, per step: the model itself is the user's to change, paraplan's flags the way around
BUILD_ADVICE = ("check the config or build function; paraplan builds every model on the meta device, "
                "with no weights")
MEASURE_ADVICE = ("its layers must run on meta tensors (no .item(), .tolist() or data-dependent shapes); "
                  "name its list of blocks with --layers PATH, or measure it on a real device with "
                  "`paraplan profile` and plan with --profile")
TRACE_ADVICE = "plan it with the layer planners (the operator-placement planners need the traced graph)"
PROFILE_ADVICE = "check that the model trains on this machine in one process first"
