"""The axis table (plans/axes.py) is the one place a parallel axis is named, and what it says
matches what the layout code does with it."""

import ast
import itertools
import pathlib

import pytest

import paraplan
from paraplan.costs.slice_gather import context_rank, data_rank
from paraplan.costs.strategy import strategy_groups
from paraplan.plans.axes import (
    AXES,
    CONTEXT,
    DATA,
    LAYER_AXES,
    LAYOUT_AXES,
    SHARDED_DATA,
    TENSOR,
    default_order,
)
from paraplan.plans.plan import LayerStrategy

SRC = pathlib.Path(paraplan.__file__).parent
# Where an axis may be named as a string: the table only (the plan file's keys are the axes' names
# too). Engine flag names ("--tensor-parallel-size") and labels for people are not axis names.
NAMED_HERE = {SRC / "plans" / "axes.py"}
RESERVED = {"ep", "etp", "edp"}  # the expert view's axes (issue 50): named in the table when they come


def axis_literals(path: pathlib.Path, names: set[str]) -> list[str]:
    """Every string constant that is an axis name, or a comma-joined list of them (a layout order
    such as "tp,dp,sdp")."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and all(part in names for part in node.value.split(","))]


def test_no_axis_name_is_a_string_literal_outside_the_table():
    names = {a.name for a in AXES} | RESERVED
    found = [hit for path in sorted(SRC.rglob("*.py")) if path not in NAMED_HERE for hit in axis_literals(path, names)]
    assert not found, "axis names as string literals (use plans/axes.py):\n" + "\n".join(found)


def test_the_check_sees_a_literal(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('groups["tp"]\nlabel = "tp+sp"\norder = "tp,dp,sdp"\nsay = "tp, sdp, dp in some order"\n')
    assert len(axis_literals(sample, {"tp", "dp", "sdp"})) == 2  # the key and the order, not the labels


def test_a_layer_strategy_has_a_degree_field_per_axis_and_the_default_order_is_the_old_one():
    fields = LayerStrategy.__dataclass_fields__
    assert all(a.name in fields and fields[a.name].default == 1 for a in LAYER_AXES)
    assert default_order() == "tp,sdp,dp" == LayerStrategy().order  # plan files written before keep their meaning
    assert [a for a in LAYER_AXES if not a.in_layout] == [CONTEXT] and CONTEXT.outside == TENSOR.name


def _strategies(group: int):
    for degrees in itertools.product((1, 2, 4), repeat=len(LAYER_AXES)):
        kw = {a.name: k for a, k in zip(LAYER_AXES, degrees, strict=True)}
        if LayerStrategy(**kw).degree != group or (kw["cp"] > 1 and kw["sdp"] > 1):
            continue  # another group size, or what plan.validate refuses (CP with plain DP only)
        for order in itertools.permutations(LAYOUT_AXES):
            yield LayerStrategy(**kw, order=",".join(a.name for a in order))


@pytest.mark.parametrize("group", [4, 8])
def test_groups_and_ranks_follow_the_table_on_every_layout(group):
    """Brute force over every strategy of a group: each axis's group has its degree in devices; the
    devices of a batch-splitting axis's group hold distinct data slices; a tensor group's devices
    hold the same data slice and sequence part (they split the weights, not the data); the gradient
    group is exactly the devices that hold the same weights as the first one (same tp rank, the same
    sdp shard); data_rank covers every slice equally often."""
    devices = tuple(range(group))
    for st in _strategies(group):
        groups = strategy_groups(st, devices)
        assert len(groups[TENSOR]) == st.tp and len(groups[CONTEXT]) == st.cp
        assert len(groups[DATA]) == st.sync_degree and len(set(groups[DATA])) == st.sync_degree
        for axis in LAYER_AXES:
            if axis.splits_batch and axis is not DATA:
                ranks = [data_rank(st, p) for p in groups[axis]]
                assert len(set(ranks)) == st.degree_of(axis), (st, axis)
        assert sorted({context_rank(st, p) for p in groups[CONTEXT]}) == list(range(st.cp))
        assert len({(data_rank(st, p), context_rank(st, p)) for p in groups[TENSOR]}) == 1
        same_weights = [p for p in devices if tp_rank(st, p) == tp_rank(st, 0) and shard(st, p) == shard(st, 0)]
        assert sorted(groups[DATA]) == same_weights, st
        counts = [sum(data_rank(st, p) == r for p in devices) for r in range(st.data_degree)]
        assert counts == [group // st.data_degree] * st.data_degree, st


def _rank_on(st: LayerStrategy, axis, position: int) -> int:
    stride = 1
    for a, k in st.dims:
        if a is axis:
            return (position // stride) % k
        stride *= k
    return 0


def tp_rank(st, position):
    return _rank_on(st, TENSOR, position)


def shard(st, position):
    return _rank_on(st, SHARDED_DATA, position)
