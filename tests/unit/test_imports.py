"""The pure core touches no files, devices or processes: checked on the source itself."""

import ast
import pathlib

import paraplan

SRC = pathlib.Path(paraplan.__file__).parent
PURE = ["models/spec.py", "hardware/cluster.py", "costs/timefn.py", "costs/analytic.py", "costs/memory.py",
        "costs/closed_forms.py", "costs/collectives.py", "costs/model.py", "costs/profile.py", "plan/plan.py",
        "planners/csimd.py", "planners/partition.py", "planners/pipeline_split.py", "planners/gropipe.py",
        "planners/bipartition.py", "planners/registry.py",
        "simulate/engine.py", "simulate/schedules.py", "simulate/pipeline.py", "simulate/plan_work.py",
        "simulate/predict.py", "simulate/dag.py"]
FORBIDDEN_MODULES = {"torch", "subprocess", "socket", "multiprocessing", "tomllib", "json", "pathlib", "shutil"}
FORBIDDEN_CALLS = {"open"}


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_pure_modules_import_no_io_or_torch():
    for rel in PURE:
        tree = ast.parse((SRC / rel).read_text())
        bad = {m for m in _imports(tree) if m.split(".")[0] in FORBIDDEN_MODULES}
        assert not bad, f"{rel} imports {bad}"
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not calls & FORBIDDEN_CALLS, f"{rel} calls {calls & FORBIDDEN_CALLS}"


def test_nothing_imports_torch_distributed_outside_runtime_and_profiling():
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("runtime/", "profiling/")):
            continue
        mods = set(_imports(ast.parse(path.read_text())))
        assert not any(m.startswith("torch.distributed") for m in mods), rel
