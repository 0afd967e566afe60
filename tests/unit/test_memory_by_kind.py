"""Issue 52 item 4: a memory budget per device kind (`--memory a100=36GiB,v100=28GiB`, the API's
`memory={"a100": "36GiB", ...}`), applied to the devices of each kind only, and the mixed-cluster
presets people have."""

from __future__ import annotations

import json
import os

import pytest
from paraplan_process import run_paraplan

from paraplan.errors import FieldError
from paraplan.hardware import load_cluster
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.simulator.predict import simulate_plan
from paraplan.sizes import memory_by_kind
from paraplan.workload import workload

GIB = 2**30
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def test_budgets_per_kind_are_read_from_text_and_mappings():
    assert memory_by_kind("a100=36GiB,v100=28GiB") == (("a100", 36 * GIB), ("v100", 28 * GIB))
    assert memory_by_kind({"v100-32gb": "512MiB", "a100": 3 * GIB}) == (("v100-32gb", 512 * 2**20), ("a100", 3 * GIB))
    assert memory_by_kind("16GiB") == () and memory_by_kind(None) == ()
    for bad in ("a100=36GiB,a100=20GiB", "=3GiB", "a100=lots", "a100=0GiB"):
        with pytest.raises(FieldError, match="memory"):
            memory_by_kind(bad)


def test_each_kind_gets_its_budget_and_the_others_keep_their_memory():
    w = workload("gpt2-tiny", "mixed-a100-v100", batch=16, memory="v100=2GiB")
    capacities = {slot.spec.name: slot.spec.memory_bytes for slot in w.request.costs.cluster.devices}
    assert capacities == {"a100-40gb": 40 * GIB, "v100-32gb": 2 * GIB}
    assert w.request.memory_by_kind == (("v100-32gb", 2 * GIB),)  # the prefix resolved to the type
    assert w.request.headroom == 0  # a budget the user gave is planned to, as one for every device
    # the simulator judges each device against its own budget: DP over both nodes of a model whose
    # states fit 40 GiB and not 2 MiB runs out of memory on the V100s alone
    tight = workload("gpt2-tiny", "mixed-a100-v100", batch=16, memory={"a100": "36GiB", "v100": "2MiB"}).request
    n = tight.n_layers
    plan = Plan(model="gpt2-tiny", cluster="mixed-a100-v100", n_layers=n, global_batch=16, n_micro=1,
                schedule="gpipe", grad_sync="after-backward", stages=(Stage(LayerRange(0, n), tuple(range(16))),),
                precision="fp16")
    memory = simulate_plan(plan, tight.costs).prediction.memory
    over = {m.device for m in memory if m.peak_bytes > m.capacity_bytes}
    assert over == set(range(8, 16))
    assert {m.capacity_bytes for m in memory if m.device < 8} == {36 * GIB}


def test_a_kind_the_cluster_lacks_or_two_budgets_is_one_line():
    with pytest.raises(FieldError, match="'h100' names none of mixed-a100-v100's device types: a100-40gb, v100-32gb"):
        workload("gpt2-tiny", "mixed-a100-v100", batch=16, memory="h100=10GiB")
    with pytest.raises(FieldError, match="a100-40gb has two budgets"):
        workload("gpt2-tiny", "mixed-a100-v100", batch=16, memory="a100=10GiB,a100-40gb=12GiB")


def test_the_command_line_plans_to_each_kinds_budget(tmp_path):
    out = tmp_path / "plan.json"
    res = run_paraplan("plan", "--model", "gpt2-tiny", "--cluster", "mixed-a100-v100", "--batch", "16",
                       "--planner", "dp", "--memory", "a100=20GiB,v100=10GiB", "--out", str(out), env=ENV)
    assert res.returncode == 0, res.stderr
    capacities = {m["device"]: m["capacity_bytes"] for m in json.loads(out.read_text())["prediction"]["memory"]}
    assert {capacities[d] for d in range(8)} == {20 * GIB} and {capacities[d] for d in range(8, 16)} == {10 * GIB}
    one = run_paraplan("plan", "--model", "gpt2-tiny", "--cluster", "mixed-a100-v100", "--batch", "16",
                       "--planner", "dp", "--memory", "3GiB", "--out", str(out), env=ENV)  # one budget for all
    assert one.returncode == 0, one.stderr
    assert {m["capacity_bytes"] for m in json.loads(out.read_text())["prediction"]["memory"]} == {3 * GIB}
    # simulate takes the same budgets: the plan judged against each kind's own
    sim = run_paraplan("simulate", str(out), "--memory", "v100=1MiB", "--out", str(tmp_path / "sim.json"), env=ENV)
    assert sim.returncode == 0, sim.stderr
    memory = json.loads((tmp_path / "sim.json").read_text())["prediction"]["memory"]
    assert {m["capacity_bytes"] for m in memory if m["device"] >= 8} == {2**20}
    assert {m["capacity_bytes"] for m in memory if m["device"] < 8} == {40 * GIB}
    bad = run_paraplan("plan", "--model", "gpt2-tiny", "--cluster", "mixed-a100-v100", "--batch", "16",
                       "--planner", "dp", "--memory", "t4=10GiB", "--out", str(tmp_path / "no.json"), env=ENV)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--memory: device type 't4'" in bad.stderr
    assert not (tmp_path / "no.json").exists()


def test_the_two_generations_preset_trains_in_fp16():
    c = load_cluster("mixed-a100-v100")
    assert c.default_precision == "fp16"
    assert c.device_types() == {"a100-40gb": 8, "v100-32gb": 8}
    assert all(slot.spec.source for slot in c.devices)
