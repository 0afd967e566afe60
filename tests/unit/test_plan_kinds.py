"""A plan's kind is one object (plans/kinds.py: Plan.kind): code asks it instead of testing the
plan's shape, and the kind of every committed example is what its method makes."""

import pathlib
import re

import pytest

import paraplan
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan_file import read_plan

SRC = pathlib.Path(paraplan.__file__).parent
ROOT = SRC.parents[1]
# the places that define the shapes: the kinds, the Plan and its validation, the plan file
DEFINED_HERE = {SRC / "plans" / "kinds.py", SRC / "plans" / "plan.py", SRC / "plans" / "plan_file.py"}
SHAPE_TESTS = re.compile(r"""schedule\s*([!=]=|is(\s+not)?)\s*(["']dag["']|Schedule\.DAG)"""
                         r"""|(["']dag["']|Schedule\.DAG)\s*[!=]=\s*\w+\.schedule"""
                         r"""|any\(\s*\w+\.strategies\s+(for|or)\b|backward_layers\s+is\s+(not\s+)?None""")


def shape_tests(path: pathlib.Path) -> list[str]:
    return [f"{path}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
            if SHAPE_TESTS.search(line) and not line.lstrip().startswith("#")]


def test_no_plan_kind_is_told_by_its_shape_outside_the_plans_package():
    found = [hit for path in sorted(SRC.rglob("*.py")) if path not in DEFINED_HERE for hit in shape_tests(path)]
    assert not found, "tests of a plan's shape (ask plan.kind):\n" + "\n".join(found)


def test_the_check_sees_each_shape_test(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('if plan.schedule == "dag":\n    pass\nx = any(s.strategies for s in p.stages)\n'
                      'y = stage.backward_layers is not None\nz = plan.kind is PlanKind.LAYERS\n'
                      'v = Schedule.DAG == plan.schedule\nu = plan.schedule is Schedule.DAG\n'
                      'w = any(st.zero for s in plan.stages for st in s.strategies)\n')  # a question of the data
    assert len(shape_tests(sample)) == 5


@pytest.mark.parametrize("name, kind", [
    ("resnet-50-fddps-8xp100", PlanKind.OPERATORS), ("gpt2-tiny-local-tp2", PlanKind.LAYERS),
    ("bert-huge-32-dp8", PlanKind.PIPELINE), ("gpt2-xl-1f1b-4x8", PlanKind.PIPELINE),
    ("resnet-50-gropipe-2x4", PlanKind.PIPELINE),
])
def test_the_examples_have_their_methods_kind(name, kind):
    assert read_plan(ROOT / "examples" / f"{name}.json").kind is kind


def test_a_bipartition_plan_is_of_its_kind():
    from paraplan.plans.plan import LayerRange, Plan, Stage

    plan = Plan(model="m", cluster="c", n_layers=4, global_batch=4, n_micro=2, schedule="1f1b",
                stages=(Stage(LayerRange(0, 2), (0,), backward_layers=LayerRange(0, 3)),
                        Stage(LayerRange(2, 4), (1,), backward_layers=LayerRange(3, 4))))
    assert plan.kind is PlanKind.BIPARTITION


def test_an_operator_placement_runs_with_the_dag_schedule_only():
    """A plan is one kind at a time: operators beside a 1f1b pipeline are refused, naming the field
    (before, the file loaded and the operators were ignored by some readers and not by others)."""
    from dataclasses import replace

    from paraplan.plans.plan import OperatorPlacement, PlanError, validate

    plan = read_plan(ROOT / "examples" / "gpt2-tiny-local-1f1b-2x4.json")
    with pytest.raises(PlanError, match=r"^operators: an operator placement runs with schedule 'dag', not 1f1b"):
        validate(replace(plan, operators=(OperatorPlacement(0, ("x",)),)))
