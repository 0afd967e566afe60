import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _machine_calibration_fixture() -> None:
    """Issue 33: `--cluster local` means this machine's cached calibration. The suite never reads a
    user's cache nor measures the machine: XDG_CACHE_HOME points at a directory of this run, holding
    the calibration committed with the tests (tests/fixtures/local-calibrated.toml, a
    `paraplan calibrate --quick` of a 2-core machine) with as many devices as this machine has
    cores, under this machine's key. Commands the tests start inherit it."""
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    cache = tempfile.mkdtemp(prefix="paraplan-test-cache-")
    os.environ["XDG_CACHE_HOME"] = cache
    from paraplan.hardware.cluster import NodeSpec
    from paraplan.hardware.cluster_file import read_cluster_file
    from paraplan.hardware.cluster_write import write_cluster_file
    from paraplan.profiling.calibration_cache import entry_path, machine_key, write_key

    fixture = read_cluster_file(Path(__file__).parent / "fixtures" / "local-calibrated.toml")
    node = fixture.nodes[0]
    cores = os.cpu_count() or 1
    cluster = replace(fixture, nodes=(NodeSpec(node.name, (node.devices[0],) * cores, node.intra_link, node.network),))
    key = machine_key()
    for precision in ("fp32", "bf16", "fp16"):  # the other precisions' compute as the fixture's device model has it
        path = entry_path(key, precision)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_cluster_file(cluster, path)
        write_key(path, key, precision)


_machine_calibration_fixture()

# The longest files first: `make test` hands whole files to its two workers in collection order, and
# a 3-minute file that starts last leaves one worker idle at the end (`--durations` lists them).
LONGEST_FIRST = ("distributed/test_guide_measure.py", "distributed/test_hybrid.py", "distributed/test_runtime.py",
                 "distributed/test_every_planner_runs.py", "distributed/test_mixed_precision.py",
                 "distributed/test_bipartition_runtime.py",
                 "unit/test_readme_commands.py", "distributed/test_guide_commands.py", "unit/test_zoo.py",
                 "distributed/test_dag_runtime.py", "distributed/test_any_model.py", "unit/test_planner_fit.py",
                 "unit/test_bench_paper.py", "distributed/test_tensor_parallel.py", "unit/test_schedule_search.py",
                 "unit/test_megatron_grid.py", "distributed/test_moe_runtime.py", "unit/test_published_moe_runs.py",
                 "engines/test_moe_exports.py", "unit/test_expert_search.py")


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
