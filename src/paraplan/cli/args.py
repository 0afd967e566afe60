"""The command line's argument types and early checks, the parser class, and the map from library
fields to flags.

Everything here runs before any measurement, planning or training, so bad input costs nothing.
"""

from __future__ import annotations

import argparse

from paraplan.errors import FieldError, ParaplanError, UnknownNameError, require_positive
from paraplan.sizes import SizeError, memory_by_kind, size_gib

# library fields (PlanRequest, TrainConfig) and the flags that set them
FLAGS = {"batch": "--batch", "stages": "--stages", "micro_batches": "--micro-batches", "schedule": "--schedule",
         "options.eta": "--eta", "options.seed": "--seed", "options.method": "--method", "options.mode": "--mode", "steps": "--steps",
         "lr": "--lr", "timeout_s": "--timeout", "clip_norm": "--clip-norm", "optimizer": "--optimizer",
         "checkpoint_every": "--checkpoint-every", "resume": "--resume", "planner": "--planner",
         "module": "--module", "layers": "--layers", "exact_stages": "--exact-stages", "backend": "--backend", "nproc": "--nproc", "max_bytes": "--max-bytes",
         "seq_len": "--seq-len", "image_size": "--image-size", "precision": "--precision",
         "memory_bytes": "--memory-gib", "memory_by_kind": "--memory", "batch_sizes": "--batch-sizes"}

# where each kind of name is listed (an unknown name with no close match points here)
SEE_NAMES = {"model": "paraplan models", "cluster": "paraplan clusters", "planner": "paraplan plan --help",
             "engine": "paraplan export --help"}

# the help of the arguments several commands share
MODEL_HELP = ("a zoo name (paraplan models), hf:TYPE?key=value&... or hf:path/config.json (a transformers config), "
              "or path/to/file.py:build_fn returning (model, sample inputs[, sample targets])")
LAYERS_HELP = "dotted path of the model's list of repeated blocks, where paraplan cannot find it (e.g. model.blocks)"
JSON_HELP = "print JSON instead of a table"


def add_precision(parser: argparse.ArgumentParser) -> None:
    """--precision: what the plans train in."""
    from paraplan.precision import FP8_RECIPES, PRECISIONS

    parser.add_argument("--precision", default=None, choices=PRECISIONS,
                        help="fp32, tf32 (TF32 matmuls), bf16 or fp16 (mixed precision: 16-bit compute, fp32 master "
                             "weights and optimizer states), fp8 (bf16 with the transformer blocks' linears on FP8 "
                             "tensor cores: Hopper, Ada or Blackwell); default: the cluster's default_precision")
    parser.add_argument("--fp8-recipe", default=None, choices=FP8_RECIPES,
                        help="with --precision fp8: how the FP8 casts are scaled (tensorwise, delayed, rowwise, "
                             "blockwise; mxfp8 on Blackwell); default: tensorwise")
    parser.add_argument("--fp8-param-gather", action="store_true",
                        help="with --precision fp8: FSDP and the distributed optimizer gather the blocks' parameters "
                             "in FP8 (Megatron-LM's --fp8-param-gather)")


def add_sizes(parser: argparse.ArgumentParser) -> None:
    """--seq-len and --image-size: the model's input sizes, where it has them."""
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--image-size", type=int, default=None)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, where it has one worth showing (not None, not
    False) and the help does not already say it; descriptions and epilogs keep their lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default is argparse.SUPPRESS or "%(default)" in text
                or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2), and every option's help
    shows its default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # "paraplan plan: ..." names the subcommand; main() adds the one "paraplan: error:" prefix
        sub = self.prog.removeprefix("paraplan").strip()
        raise ParaplanError(f"{sub}: {message}" if sub else message)


def check_output(flag: str, path, *, directory: bool = False, figure: bool = False) -> None:
    """An output that cannot be written is refused now, in one line, not after the measuring,
    planning or training (a figure's extension too: matplotlib picks the format from it)."""
    from paraplan.system.fileio import output_problem

    problem = output_problem(path, directory=directory)
    if problem is None and figure:
        from paraplan.simulator.export import figure_format_problem

        problem = figure_format_problem(path)
    if problem:
        raise ParaplanError(f"{flag}: {problem}")


def batch_arg(text: str):
    """A whole number of samples, "max" (the planner searches the largest batch that fits) or "best"
    (the batch of the highest throughput)."""
    if text in ("max", "best"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, max or best, got {text!r}") from None


def memory_arg(text: str):
    """'16GiB' -> 16.0 (GiB); 'a100=36GiB,v100=28GiB' -> (('a100', bytes), ('v100', bytes)), a budget
    per device type; read by sizes.py; a refusal is argparse's one-line usage error."""
    try:
        return memory_by_kind(text) or size_gib(text)
    except (SizeError, FieldError) as exc:
        raise argparse.ArgumentTypeError(getattr(exc, "detail", str(exc))) from None


def flags_in(text: str) -> str:
    """A planner's note names request fields (exact_stages); on the command line they are flags."""
    return text.replace("exact_stages", "--exact-stages")


def check_plan_sizes(args) -> None:
    """The request's sizes, checked before the model is measured (PlanRequest checks them again
    against the cluster, which needs the measurement)."""
    from paraplan.plans.plan import Schedule

    if args.batch not in ("max", "best") and args.batch < 1:
        raise ParaplanError(f"--batch: must be a positive whole number, got {args.batch}")
    for flag, value in (("--stages", args.stages), ("--micro-batches", args.micro_batches)):
        if value is not None and value < 1:
            raise ParaplanError(f"{flag}: must be positive, got {value}")
    if args.schedule is not None and args.schedule not in (*tuple(Schedule), "best"):
        raise UnknownNameError("schedule", args.schedule, [*(str(s) for s in Schedule), "best"])
    if args.exact_stages and args.stages is None:
        raise ParaplanError("--exact-stages needs --stages")
    if args.memory_gib is not None:
        require_positive(args.memory_gib, "--memory-gib")


def parse_sizes(text: str) -> list[int]:
    """--batch-sizes: '1,2,4' -> [1, 2, 4], sorted, each positive."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ParaplanError(f"--batch-sizes: expected comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] <= 0:
        raise ParaplanError(f"--batch-sizes: sizes must be positive, got {text!r}")
    return sizes
