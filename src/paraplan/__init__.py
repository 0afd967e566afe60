"""paraplan: plan, predict and run distributed training of PyTorch models.

The public API is small; see docs/architecture.md for the flow of data.
"""

from paraplan.errors import ParaplanError
from paraplan.version import __version__

__all__ = ["ParaplanError", "__version__", "compare", "export", "load_plan", "plan", "simulate", "train"]
_API = ("compare", "export", "load_plan", "plan", "simulate", "train")


def __getattr__(name: str):
    """paraplan.plan(...), .simulate, .train, .compare, .export, .load_plan (paraplan/api.py), imported on first
    use so that `import paraplan` (and the command line's start) stays light."""
    if name in _API:
        from paraplan import api

        return getattr(api, name)
    raise AttributeError(f"module 'paraplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    """`dir(paraplan)` shows the API, which is imported lazily (`__getattr__`)."""
    return sorted({*globals(), *__all__})
