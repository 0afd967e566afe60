"""paraplan: plan, predict and run distributed training of PyTorch models.

The public API is small; see docs/architecture.md for the flow of data.
"""

from paraplan.errors import ParaplanError

__all__ = ["ParaplanError", "__version__", "compare", "load_plan", "plan", "simulate", "train"]
__version__ = "0.1.0"
_API = ("compare", "load_plan", "plan", "simulate", "train")  # `plan`: the package paraplan/plan is callable


class _CallablePackage:
    """Mixed into a subpackage's module class so that calling the package calls the API function of
    the same name: `paraplan.plan(...)` and `paraplan.simulate(...)` are the API, while
    paraplan/plan and paraplan/simulate stay packages (Python sets the attribute `paraplan.plan` to
    the subpackage once it is imported, so a plain function of that name could not survive)."""

    def __call__(self, *args, **kwargs):
        from paraplan import api

        return getattr(api, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


def make_callable(module_name: str) -> None:
    import sys
    import types

    module = sys.modules[module_name]
    module.__class__ = type("CallablePackage", (_CallablePackage, types.ModuleType), {})


def __getattr__(name: str):
    """paraplan.plan(...), .simulate, .train, .compare, .load_plan (paraplan/api.py), imported on first
    use so that `import paraplan` (and the command line's start) stays light."""
    if name in _API:
        from paraplan import api

        return getattr(api, name)
    raise AttributeError(f"module 'paraplan' has no attribute {name!r}")
