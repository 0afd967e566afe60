"""User-facing errors.

Anything a person can get wrong (a model name, a cluster file, a plan, a size) raises a
`ParaplanError`; the CLI prints its one line on stderr and exits with status 2. Everything else
is a bug and keeps its traceback.
"""


class ParaplanError(Exception):
    """Bad input from a person: printed as one line, exit status 2."""


class UnknownNameError(ParaplanError):
    """A model, cluster, planner or device type that does not exist."""

    def __init__(self, kind: str, name: str, known: list[str]):
        import difflib

        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(sorted(known))}"
        super().__init__(f"unknown {kind} {name!r}{hint}")


def require_positive(value: float, what: str) -> None:
    """Sizes that make no sense (zero, negative) are input errors, not asserts."""
    if not value > 0:
        raise ParaplanError(f"{what} must be positive, got {value}")
