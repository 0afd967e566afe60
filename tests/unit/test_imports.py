"""The import table of docs/architecture.md, enforced on the source: every arrow points down, and
the pure core touches no files, devices or processes."""

import ast
import pathlib
import re

import paraplan

SRC = pathlib.Path(paraplan.__file__).parent
DOC = SRC.parent.parent / "docs" / "architecture.md"
PURE = ["models/spec.py", "models/opspec.py", "costs/op_costs.py", "costs/op_memory.py", "hardware/cluster.py", "plans/plan.py", "costs/timefn.py", "costs/analytic.py",
        "costs/memory.py", "costs/memory_config.py", "costs/strategy.py", "costs/closed_forms.py",
        "costs/collectives.py", "costs/model.py", "costs/profile.py", "costs/transformer_memory.py", "precision.py",
        "planners/request.py", "planners/table.py", "planners/registry.py", "planners/bound.py", "planners/progress.py", "planners/divisors.py",
        "planners/stage_division.py", "planners/fit.py", "planners/pipeline_split.py",
        "planners/csimd/algorithms.py", "planners/csimd/bound.py", "planners/csimd/search.py", "planners/csimd/planner.py",
        "planners/baselines/partition.py", "planners/baselines/split.py", "planners/gropipe/planner.py",
        "planners/bipartition/division.py", "planners/bipartition/dp.py", "planners/bipartition/dp_memory.py",
        "planners/bipartition/algorithm2.py", "planners/bipartition/recompute.py", "planners/bipartition/planner.py",
        "planners/galvatron/space.py", "planners/galvatron/dp.py", "planners/galvatron/searcher.py",
        "planners/galvatron/batch.py", "planners/galvatron/planner.py",
        "planners/fddps/problem.py", "planners/fddps/port_replay.py", "planners/fddps/ports.py",
        "planners/fddps/list_scheduling.py", "planners/fddps/dps.py", "planners/fddps/baselines.py",
        "planners/fddps/planner.py",
        "planners/galvatron/arrays.py", "planners/galvatron/partitions.py", "planners/bipartition/prefix_dp.py",
        "planners/fddps/critical_path.py", "planners/fddps/device_state.py",
        "simulator/engine.py", "plans/schedules.py",
        "simulator/pipeline.py", "simulator/plan_work.py", "simulator/predict.py", "simulator/dag.py",
        "engines/layout.py", "engines/torchtitan.py", "engines/megatron.py", "engines/deepspeed.py"]
FORBIDDEN_MODULES = {"torch", "subprocess", "socket", "multiprocessing", "tomllib", "json", "pathlib", "shutil"}
FORBIDDEN_CALLS = {"open"}


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            for alias in node.names:  # `from paraplan.costs import strategy` imports paraplan.costs.strategy
                yield f"{node.module}.{alias.name}"


def _table() -> dict[str, set[str]]:
    text = DOC.read_text()
    block = text.split("<!-- import-table -->")[1].split("<!-- /import-table -->")[0]
    table = {}
    for line in block.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        unit = cells[0].strip("`")
        allowed = set(re.findall(r"`(paraplan[\w.]*)`", cells[2]))
        table[unit] = {"*"} if cells[2] == "everything" else allowed
    return table


def _unit(module: str, units) -> str | None:
    """The longest unit that prefixes a module name."""
    matches = [u for u in units if module == u or module.startswith(u + ".")]
    return max(matches, key=len) if matches else None


def test_the_table_covers_every_module():
    units = _table()
    assert len(units) >= 15
    for path in SRC.rglob("*.py"):
        module = "paraplan." + path.relative_to(SRC).with_suffix("").as_posix().replace("/", ".")
        module = module.removesuffix(".__init__")
        if module in ("paraplan", "paraplan.__main__"):
            continue
        assert _unit(module, units) is not None, f"{module} is in no row of the import table"


def test_every_import_follows_the_table():
    units = _table()
    bad = []
    for path in SRC.rglob("*.py"):
        module = "paraplan." + path.relative_to(SRC).with_suffix("").as_posix().replace("/", ".")
        module = module.removesuffix(".__init__")
        if module in ("paraplan", "paraplan.__main__"):
            continue
        unit = _unit(module, units)
        allowed = units[unit]
        if "*" in allowed:
            continue
        for imported in set(_imports(ast.parse(path.read_text()))):
            if not imported.startswith("paraplan.") or imported == "paraplan":
                continue
            target = _unit(imported, units)
            if target is None:  # `from paraplan.x import name`: the name is not a module
                continue
            if target == unit or target in allowed:
                continue
            # a unit may import the package it refines (paraplan.simulator.export -> paraplan.simulate)
            bad.append(f"{module} ({unit}) imports {imported} ({target})")
    assert not bad, "imports against docs/architecture.md:\n" + "\n".join(sorted(bad))


def test_the_pure_core_imports_no_io_or_torch():
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


def test_a_wrong_arrow_would_be_caught():
    # the checker itself: costs importing the simulator is against the table
    units = _table()
    assert _unit("paraplan.simulator.predict", units) == "paraplan.simulator"
    assert "paraplan.simulator" not in units["paraplan.costs"]
    assert "paraplan.simulator" in units["paraplan.planners.registry"]
    assert "paraplan.simulator" not in units["paraplan.planners"]
    # one folder per method, never importing another method's folder nor the registry (the judge)
    # (the registry, which builds the judge, and auto, which runs every method, its rows, and skips,
    # which says which of them auto runs, are not methods)
    methods = {u for u in units if u.startswith("paraplan.planners.")
               and u not in ("paraplan.planners.registry", "paraplan.planners.auto", "paraplan.planners.comparison_rows",
                             "paraplan.planners.skips")}
    assert _unit("paraplan.planners.gropipe.planner", units) == "paraplan.planners.gropipe"
    for method in methods:
        assert not units[method] & (methods | {"paraplan.planners.registry"}), method
    assert not units["paraplan.planners"] & methods
