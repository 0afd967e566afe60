"""User-facing errors.

Anything a person can get wrong (a model name, a cluster file, a plan, a size) raises a
`ParaplanError`; the CLI prints its one line on stderr and exits with status 2. Everything else
is a bug and keeps its traceback.
"""


class ParaplanError(Exception):
    """Bad input from a person: printed as one line, exit status 2."""


class UnknownNameError(ParaplanError):
    """A model, cluster, planner or device type that does not exist. The message names only the
    close matches (difflib), never the whole list: with none close, it says how many there are,
    and the CLI adds where to see them (`kind` tells it which list)."""

    def __init__(self, kind: str, name: str, known: list[str]):
        import difflib

        self.kind, self.name = kind, name
        self.close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(self.close)}?" if self.close else f" (none of the {len(known)} known is close)"
        super().__init__(f"unknown {kind} {name!r}{hint}")


class FieldError(ParaplanError):
    """A request or configuration field with a value that makes no sense; `field` names it (the CLI
    maps fields to its flags, so library messages never quote a flag)."""

    def __init__(self, field_name: str, detail: str):
        self.field = field_name
        self.detail = detail
        super().__init__(f"{field_name}: {detail}")


class NothingFits(FieldError):
    """A planner's method finds no plan of the request that fits (every division over its workers is
    out of memory): in a comparison its row says so as "infeasible", not as a planner's failure."""


def require_positive(value: float, what: str) -> None:
    """Sizes that make no sense (zero, negative) are input errors, not asserts."""
    if not value > 0:
        raise ParaplanError(f"{what} must be positive, got {value}")
