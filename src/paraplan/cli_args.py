"""The command line's argument types and early checks, and the map from library fields to flags.

Split from cli.py (which parses, calls the library and prints): everything here runs before any
measurement, planning or training, so bad input costs nothing.
"""

from __future__ import annotations

import argparse

from paraplan.errors import ParaplanError, UnknownNameError, require_positive

# library fields (PlanRequest, TrainConfig) and the flags that set them
FLAGS = {"batch": "--batch", "stages": "--stages", "micro_batches": "--micro-batches", "schedule": "--schedule",
         "options.eta": "--eta", "options.seed": "--seed", "options.method": "--method", "options.mode": "--mode", "steps": "--steps",
         "lr": "--lr", "timeout_s": "--timeout", "clip_norm": "--clip-norm", "optimizer": "--optimizer",
         "checkpoint_every": "--checkpoint-every", "resume": "--resume", "planner": "--planner",
         "module": "--module", "layers": "--layers", "exact_stages": "--exact-stages", "backend": "--backend", "nproc": "--nproc", "max_bytes": "--max-bytes",
         "seq_len": "--seq-len", "image_size": "--image-size",
         "memory_bytes": "--memory-gib", "batch_sizes": "--batch-sizes"}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, where it has one worth showing (not None, not
    False) and the help does not already say it; descriptions and epilogs keep their lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default is argparse.SUPPRESS or "%(default)" in text
                or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            return text
        return f"{text} (default: %(default)s)"


# where each kind of name is listed (an unknown name with no close match points here)
_SEE_NAMES = {"model": "paraplan models", "cluster": "paraplan clusters", "planner": "paraplan plan --help"}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2), and every option's help
    shows its default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # "paraplan plan: ..." names the subcommand; main() adds the one "paraplan: error:" prefix
        sub = self.prog.removeprefix("paraplan").strip()
        raise ParaplanError(f"{sub}: {message}" if sub else message)


def _check_output(flag: str, path, *, directory: bool = False, figure: bool = False) -> None:
    """An output that cannot be written is refused now, in one line, not after the measuring,
    planning or training (a figure's extension too: matplotlib picks the format from it)."""
    from paraplan.fileio import output_problem

    problem = output_problem(path, directory=directory)
    if problem is None and figure:
        from paraplan.simulate.export import figure_format_problem

        problem = figure_format_problem(path)
    if problem:
        raise ParaplanError(f"{flag}: {problem}")


def _batch_arg(text: str):
    """A whole number of samples, "max" (the planner searches the largest batch that fits) or "best"
    (the batch of the highest throughput)."""
    if text in ("max", "best"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, max or best, got {text!r}") from None


_UNITS = {"gib": 2**30, "gb": 2**30, "g": 2**30, "mib": 2**20, "mb": 2**20, "m": 2**20, "tib": 2**40, "tb": 2**40}


def _memory_arg(text: str) -> float:
    """'16GiB' -> 16.0 (GiB). GB is read as GiB, as the papers' tables mean it (a 24 GB TITAN holds
    24 GiB of memory)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in {**_UNITS, "": 1}:
        raise argparse.ArgumentTypeError(f"expected a size such as 16GiB or 512MiB, got {text!r}")
    value = float(m.group(1)) * (_UNITS.get(m.group(2).lower(), 2**30))
    if not 0 < value < float("inf"):  # 400 digits read as a float are infinite
        raise argparse.ArgumentTypeError(f"must be a positive, finite size, got {text!r}")
    return value / 2**30


def _flags_in(text: str) -> str:
    """A planner's note names request fields (exact_stages); on the command line they are flags."""
    return text.replace("exact_stages", "--exact-stages")


def _check_plan_sizes(args) -> None:
    """The request's sizes, checked before the model is measured (PlanRequest checks them again
    against the cluster, which needs the measurement)."""
    from paraplan.plan.plan import Schedule

    if args.batch not in ("max", "best") and args.batch < 1:
        raise ParaplanError(f"--batch: must be a positive whole number, got {args.batch}")
    for flag, value in (("--stages", args.stages), ("--micro-batches", args.micro_batches)):
        if value is not None and value < 1:
            raise ParaplanError(f"{flag}: must be positive, got {value}")
    if args.schedule is not None and args.schedule not in tuple(Schedule):
        raise UnknownNameError("schedule", args.schedule, [str(s) for s in Schedule])
    if args.exact_stages and args.stages is None:
        raise ParaplanError("--exact-stages needs --stages")
    if args.memory_gib is not None:
        require_positive(args.memory_gib, "--memory-gib")


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ParaplanError(f"--batch-sizes: expected comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] <= 0:
        raise ParaplanError(f"--batch-sizes: sizes must be positive, got {text!r}")
    return sizes
