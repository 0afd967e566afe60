"""What `paraplan train` writes into its output directory, checked before a run and cleared of an
earlier run's per-rank files before its ranks start."""

from __future__ import annotations

from pathlib import Path

from paraplan.cli.args import check_output
from paraplan.errors import ParaplanError

# what a run writes into --out-dir (runtime/pipeline/stage_loop.py, runtime/dag/dag_runtime.py, runtime/measure/compare.py): each must be a
# regular file if it is there already (writes never replace a device, a FIFO or a link)
RUN_FILES = ("losses.json", "steps_rank*.json", "timeline_rank*.json", "memory_rank*.json", "memory_dag_rank*.json",
             "stage*.pt", "overheads.json", "measured.trace.json", "simulated.trace.json", "compare.png")
# the files of one rank each: a run of another plan into the same directory (a resumed run under
# fewer ranks, an elastic run's next rung) would leave the ranks it no longer has beside its own
RANK_FILES = tuple(name for name in RUN_FILES if "rank" in name or name.startswith("stage"))


def check_outputs(args, out_dir: str) -> None:
    from paraplan.runtime.state.checkpoints import FILES
    from paraplan.system.fileio import output_problem

    check_output("--out-dir", out_dir, directory=True)
    if args.checkpoint_dir and not args.resume:
        check_output("--checkpoint-dir", args.checkpoint_dir, directory=True)
    for flag, directory, names in (("--out-dir", out_dir, RUN_FILES), ("--checkpoint-dir", args.checkpoint_dir, FILES)):
        problem = output_problem(directory, directory=True, files=names) if directory else None
        if problem:
            raise ParaplanError(f"{flag}: {problem}")


def clear_rank_files(out_dir: str | Path | None) -> None:
    """Remove an earlier run's per-rank files (RANK_FILES) from `out_dir`, just before the ranks start
    (after every check: a refused run changes nothing)."""
    if out_dir is None or not Path(out_dir).is_dir():
        return
    for pattern in RANK_FILES:
        for path in Path(out_dir).glob(pattern):
            if path.is_file():
                path.unlink()
