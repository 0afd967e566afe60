import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# The longest files first: `make test` hands whole files to its two workers in collection order, and
# a 3-minute file that starts last leaves one worker idle at the end (`--durations` lists them).
LONGEST_FIRST = ("distributed/test_guide_measure.py", "distributed/test_hybrid.py", "distributed/test_runtime.py",
                 "distributed/test_every_planner_runs.py", "distributed/test_mixed_precision.py",
                 "distributed/test_bipartition_runtime.py",
                 "unit/test_readme_commands.py", "distributed/test_guide_commands.py", "unit/test_zoo.py",
                 "distributed/test_dag_runtime.py", "distributed/test_any_model.py", "unit/test_planner_fit.py",
                 "unit/test_bench_paper.py", "distributed/test_tensor_parallel.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return next((i for i, name in enumerate(LONGEST_FIRST) if path.endswith(name)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the order within a file and among the rest is kept


def run_cli_here(capsys, *args):
    """`paraplan ARGS` in this process: its exit status and output as a subprocess would give them
    (argparse's own refusals included). The separate-process runs are the README's and guide's tests."""
    from types import SimpleNamespace

    from paraplan.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)
