"""Fuzzing the readers of what people write: plan files (JSON), cluster files (TOML) and the
command line's sizes. Whatever comes in ends in a valid object or a ParaplanError (one line, exit
status 2), never another exception, and never a hang: valid documents mutated (a value replaced by
another type, a huge, negative or non-finite number, nested garbage; a key removed or added) and
raw text and bytes. Derandomized with fixed example counts, so every run tries the same inputs.

What it found when it was written: a plan whose stage spans more layers than a C long (len()
overflowed), non-UTF-8 files and integers of more than 4,300 digits (ValueError, not the decode
error caught), JSON and TOML nested too deeply (RecursionError), a device type name that is a list
(unhashable), `--memory` of 400 digits (an infinite size).
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.cli.args import batch_arg, memory_arg, parse_sizes
from paraplan.errors import ParaplanError
from paraplan.hardware.cluster import Cluster
from paraplan.hardware.cluster_file import cluster_from_dict, read_cluster_file
from paraplan.hardware.cluster_write import cluster_to_dict
from paraplan.hardware.presets import load_cluster
from paraplan.plans.plan import Plan
from paraplan.plans.plan_file import plan_from_dict, plan_from_json, plan_to_json, read_plan

FUZZ = settings(derandomize=True, max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# numbers that break readers: huge, negative, zero, non-finite, just past a C long, floats for ints
NASTY_NUMBERS = st.sampled_from([0, -1, 1, 2, -(10**30), 10**30, 2**63, -(2**63) - 1, 10**4000,
                                 float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 0.5, 1e-320, True, False])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=12), NASTY_NUMBERS)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)

PLANS = [
    {"format_version": 1, "model": "gpt2-tiny", "cluster": "local", "n_layers": 6, "global_batch": 8, "n_micro": 4,
     "schedule": "gpipe", "grad_sync": "none",
     "stages": [{"layers": [0, 3], "devices": [0]}, {"layers": [3, 6], "devices": [1]}],
     "prediction": {"iteration_s": 0.02, "throughput_samples_per_s": 400.0, "feasible": True, "reason": "",
                    "memory": [{"device": 0, "peak_bytes": 10, "capacity_bytes": 20}]},
     "search": {"planner": "csimd", "search_s": 0.1, "options": {"eta": "1000", "exact": True}, "note": ""}},
    {"format_version": 1, "model": "gpt2-tiny", "cluster": "local", "n_layers": 2, "global_batch": 8, "n_micro": 2,
     "schedule": "1f1b", "grad_sync": "after-backward",
     "stages": [{"layers": [0, 2], "devices": [0, 1],
                 "strategies": [{"dp": 2, "sdp": 1, "tp": 1, "checkpoint": False},
                                {"dp": 1, "sdp": 1, "tp": 2, "checkpoint": True, "order": "tp,sdp,dp"}]}]},
    {"format_version": 1, "model": "m", "cluster": "local", "n_layers": 3, "global_batch": 4, "n_micro": 4,
     "schedule": "1f1b", "grad_sync": "none", "split_layers": "recompute",
     "stages": [{"layers": [0, 2], "devices": [0], "backward_layers": [0, 1]},
                {"layers": [2, 3], "devices": [1], "backward_layers": [1, 3]}]},
    {"format_version": 1, "model": "m", "cluster": "local", "n_layers": 1, "global_batch": 2, "n_micro": 1,
     "schedule": "dag", "grad_sync": "none", "operators": [{"device": 0, "ops": ["a", "b"]}, {"device": 1, "ops": ["c"]}]},
]


def _paths(doc, prefix=()):
    """Every (path, value) inside a JSON-like document."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _mutated(draw, doc, values):
    """A copy of `doc` with one to three mutations: replace a value, delete a key or add one."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p, _ in _paths(doc)]
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        if not path:  # the document itself
            doc = draw(values) if action == "replace" else doc
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(values)
        elif action == "add" and isinstance(parent, list):
            parent.append(draw(values))
    return doc


@st.composite
def mutated_plans(draw):
    return _mutated(draw, draw(st.sampled_from(PLANS)), JSON_VALUES)


def assert_plan_or_one_line(read):
    try:
        plan = read()
    except ParaplanError as exc:
        assert str(exc) and "\n" not in str(exc)
        return None
    assert isinstance(plan, Plan)
    assert plan_from_json(plan_to_json(plan)) == plan  # a valid plan survives writing and reading back
    return plan


def test_the_base_plans_are_valid():
    for doc in PLANS:
        assert assert_plan_or_one_line(lambda doc=doc: plan_from_dict(doc)) is not None


@FUZZ
@given(doc=mutated_plans())
def test_a_mutated_plan_document_is_a_plan_or_one_line(doc):
    assert_plan_or_one_line(lambda: plan_from_dict(doc, "p.json"))


@FUZZ
@given(doc=mutated_plans())
def test_a_mutated_plan_file_is_a_plan_or_one_line(doc):
    text = json.dumps(doc, allow_nan=True)  # NaN and Infinity as Python's json writes them
    assert_plan_or_one_line(lambda: plan_from_json(text, "p.json"))


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.sampled_from(["[" * 200_000, '{"a":' * 100_000, "9" * 5000,
                                                              '{"format_version": 1e999}', "\ufeff{}"])))
def test_any_text_is_a_plan_or_one_line(text):
    assert_plan_or_one_line(lambda: plan_from_json(text, "p.json"))


@FUZZ
@given(data=st.binary(max_size=200))
def test_any_bytes_in_a_plan_file_are_a_plan_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("plan") / "p.json"
    path.write_bytes(data)
    assert_plan_or_one_line(lambda: read_plan(path))


def test_a_plan_with_more_layers_than_a_c_long_is_refused_in_one_line():
    doc = json.loads(json.dumps(PLANS[1]))
    doc["n_layers"] = 10**20
    doc["stages"][0]["layers"] = [0, 10**20]
    with pytest.raises(ParaplanError, match="2 strategies for 100000000000000000000 layers"):
        plan_from_dict(doc)


@pytest.mark.timeout(60)
def test_a_plan_of_10_to_the_12_layers_is_read_without_visiting_each():
    doc = json.loads(json.dumps(PLANS[0]))
    doc.update(n_layers=10**12, stages=[{"layers": [0, 10**12], "devices": [0]}], prediction=None)
    assert plan_from_dict(doc).stages[0].layers.stop == 10**12


# ------------------------------------------------------------------------------------ clusters
CLUSTER = cluster_to_dict(load_cluster("galvatron-16xa100"))
CLUSTER["nodes"][0]["count"] = 1  # the optional field too, for the mutations to reach
TOML_VALUES = st.recursive(  # TOML has no null, and a table's keys are strings
    st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
              NASTY_NUMBERS),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def assert_cluster_or_one_line(read):
    try:
        cluster = read()
    except ParaplanError as exc:
        assert str(exc) and "\n" not in str(exc)
        return None
    assert isinstance(cluster, Cluster) and cluster.n_devices >= 1
    for slot in cluster.devices:
        assert slot.spec.memory_bytes >= 0 and math.isfinite(slot.spec.peak_flops)
    return cluster


@st.composite
def mutated_clusters(draw):
    doc = _mutated(draw, CLUSTER, TOML_VALUES)
    if draw(st.booleans()):
        doc = dict(doc) if isinstance(doc, dict) else doc
        if isinstance(doc, dict):
            doc["runtime"] = draw(st.one_of(TOML_VALUES, st.just({"rendezvous": True, "action_s": 1e-3,
                                                                  "step_s": -1.0, "compute_scale": 0})))
    return doc


@FUZZ
@given(doc=mutated_clusters())
def test_a_mutated_cluster_document_is_a_cluster_or_one_line(doc):
    if isinstance(doc, dict):  # what tomllib gives: always a table at the top
        assert_cluster_or_one_line(lambda: cluster_from_dict(doc, "c.toml"))


@FUZZ
@given(doc=mutated_clusters())
def test_a_mutated_cluster_file_is_a_cluster_or_one_line(tmp_path_factory, doc):
    if not isinstance(doc, dict):
        return
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):  # no TOML for it (NaN keys are fine; mixed arrays and None are not)
        return
    path = tmp_path_factory.mktemp("cluster") / "c.toml"
    path.write_text(text)
    assert_cluster_or_one_line(lambda: read_cluster_file(path))


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                      st.sampled_from([b"a = " + b"[" * 5000, b"count = " + b"9" * 5000, b"\xff\xfe"])))
def test_any_bytes_in_a_cluster_file_are_a_cluster_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cluster") / "c.toml"
    path.write_bytes(data)
    assert_cluster_or_one_line(lambda: read_cluster_file(path))


# ---------------------------------------------------------------------------- command-line sizes
SIZE_TEXT = st.one_of(st.text(max_size=30), st.from_regex(r"\s*-?[0-9]{0,500}\.?[0-9]{0,5}\s*[A-Za-z]{0,4}\s*",
                                                           fullmatch=True),
                      st.sampled_from(["9" * 400 + "GiB", "9" * 5000, "0.0000000001MiB", "1e3GiB", "inf", "nan"]))


def _parsed_or_refused(parse, text):
    try:
        return parse(text)
    except (ParaplanError, argparse.ArgumentTypeError) as exc:  # argparse turns the latter into one line
        assert str(exc) and "\n" not in str(exc)
        return None


@FUZZ
@given(text=SIZE_TEXT)
def test_a_memory_size_is_positive_and_finite_or_refused(text):
    gib = _parsed_or_refused(memory_arg, text)
    assert gib is None or (0 < gib < math.inf)


@FUZZ
@given(text=st.one_of(SIZE_TEXT, st.sampled_from(["max", "best", "MAX", "1e3", "0x10", "10**12"])))
def test_a_batch_is_a_whole_number_max_or_best_or_refused(text):
    batch = _parsed_or_refused(batch_arg, text)
    assert batch is None or batch in ("max", "best") or isinstance(batch, int)


@FUZZ
@given(text=st.one_of(SIZE_TEXT, st.lists(st.integers(), max_size=5).map(lambda xs: ",".join(map(str, xs)))))
def test_batch_sizes_are_positive_whole_numbers_or_refused(text):
    sizes = _parsed_or_refused(parse_sizes, text)
    assert sizes is None or (sizes and all(isinstance(s, int) and s > 0 for s in sizes) and sizes == sorted(sizes))


# a layer profile (`paraplan profile`'s file, read by `plan --profile`): every field mutated
TIMING = {"median_s": 1e-4, "min_s": 1e-4, "max_s": 1e-4, "q1_s": 1e-4, "q3_s": 1e-4, "repeats": 1}
PROFILE = {"model": "lenet-5", "inputs": "image: 1x32x32, 10 classes", "device": "cpu", "device_name": "cpu",
           "machine": "vm", "torch_version": "2.13.0+cpu", "threads": 1, "date": "2026-11-27", "warmup": 3,
           "repeats": 1, "format_version": 1, "repeatability": [1.01],
           "step_check": {"batch": 4, "measured": TIMING, "sum_of_layers_s": 2e-4},
           "layers": [{"name": "conv1", "kind": "conv", "batch_sizes": [2, 4], "forward": [TIMING, TIMING],
                       "backward": [TIMING, TIMING], "output_bytes": [9408, 18816], "saved_bytes": [45824, 91648],
                       "peak_bytes": [55232, 110464]}]}


@pytest.mark.parametrize("bad", [None, -1, "x", [], {}, True, 1e400, 10**30, [1, "x"]])
def test_every_field_of_a_layer_profile_mutated_is_a_profile_or_one_line(bad):
    """Issue 46: `paraplan plan --profile` with a hand-edited profile, a byte count of null was a
    TypeError. Each value replaced in turn: a Profile comes back, or a ProfileFileError."""
    from paraplan.costs.profile import Profile
    from paraplan.profiling.profile_file import ProfileFileError, profile_from_dict

    assert isinstance(profile_from_dict(PROFILE), Profile)
    refused = 0
    for path, _ in list(_paths(PROFILE))[1:]:  # every value but the document itself
        doc = json.loads(json.dumps(PROFILE))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = bad
        try:
            assert isinstance(profile_from_dict(doc), Profile)
        except ProfileFileError:
            refused += 1
    assert refused > 0  # the byte counts, timings and sizes at least
