"""Issue 53 item 2: a fallback ladder, the best plan for the cluster and for the cluster less 1 ... F
nodes (planners/ladder.py), written as a versioned file that `paraplan train --rung K` reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from paraplan_process import run_paraplan

from paraplan.errors import FieldError
from paraplan.hardware import load_cluster
from paraplan.planners.ladder import fallback_ladder, rung_clusters
from paraplan.plans.ladder_file import read_plan_or_rung
from paraplan.plans.plan import PlanError
from paraplan.workload import workload

MIXED = str(Path(__file__).resolve().parents[1] / "data" / "mixed-a100-v100.toml")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def test_rungs_drop_the_slowest_node_first_or_the_ones_named():
    mixed = load_cluster(MIXED)
    (dropped, left), = rung_clusters(mixed, 1)
    assert dropped == ("v100",) and [n.name for n in left.nodes] == ["a100"] and left.n_devices == 4
    assert rung_clusters(mixed, 1, drop=("a100",))[0][0] == ("a100",)
    one_node = load_cluster("galvatron-8xtitan")
    rungs = rung_clusters(one_node, 2)
    assert [d for d, _ in rungs] == [("device 7",), ("device 6", "device 7")]
    assert [c.n_devices for _, c in rungs] == [7, 6]
    for bad, kw, why in ((mixed, {"fallbacks": 2}, "at most 1 fallbacks"), (mixed, {"fallbacks": 1, "drop": ("x",)},
                         "no node 'x'"), (one_node, {"fallbacks": 8}, "at most 7"), (mixed, {"fallbacks": 0}, "at least 1")):
        with pytest.raises(FieldError, match=why):
            rung_clusters(bad, **kw)


def test_every_rung_plans_the_same_batch_on_what_is_left_within_its_share_of_the_time():
    seen = []

    def compare(request, time_limit_s):
        seen.append((request.costs.cluster.n_devices, request.batch, time_limit_s,
                     {s.spec.memory_bytes for s in request.costs.cluster.devices}))
        return "a comparison"

    w = workload("gpt2-tiny", MIXED, batch=16, memory="v100=2GiB")
    rungs = fallback_ladder(w.request, load_cluster(MIXED), 1, compare, time_limit_s=30.0, drop=("a100",))
    assert [r.dropped for r in rungs] == [(), ("a100",)]
    # the V100s keep their budget on the rung without the A100s: the request's budget applied again
    assert seen == [(8, 16, 15.0, {40 * 2**30, 2 * 2**30}), (4, 16, 15.0, {2 * 2**30})]


def test_the_command_writes_a_ladder_that_train_reads(tmp_path):
    out = tmp_path / "plan.json"
    res = run_paraplan("plan", "--model", "gpt2-tiny", "--cluster", MIXED, "--batch", "16", "--fallbacks", "1",
                       "--out", str(out), "--time-limit", "60", "--quiet", "--report", str(tmp_path / "report"),
                       env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    # the HTML report: rung 0's comparison, the rungs in a section of their own
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<h2>Fallback ladder</h2>" in page and "<td>v100</td>" in page and "Every planner, with every node" in page
    ladder = json.loads((tmp_path / "plan.ladder.json").read_text())
    assert (ladder["format"], ladder["version"], ladder["global_batch"]) == ("paraplan.ladder", 1, 16)
    full, fewer = ladder["rungs"]
    assert (full["dropped"], full["devices"], fewer["dropped"], fewer["devices"]) == ([], 8, ["v100"], 4)
    # what switching to the rung costs and each rung's goodput (default: Llama 3's node MTBF)
    assert fewer["switch"]["restart_s"] > fewer["switch"]["reload_s"] > 0 and full["switch"] is None
    assert ladder["node_mtbf_h"] == pytest.approx(5696, abs=1)
    assert 0 < fewer["goodput"]["samples_per_s"] <= fewer["throughput_samples_per_s"]
    assert min(r["goodput"]["samples_per_s"] for r in ladder["rungs"]) <= ladder["ladder_goodput_samples_per_s"] \
        <= max(r["goodput"]["samples_per_s"] for r in ladder["rungs"])
    plan = read_plan_or_rung(tmp_path / "plan.ladder.json", 1)
    assert set(plan.devices) <= set(range(4)) and plan.global_batch == 16
    for k in (0, 1):  # every rung's plan fits and keeps the global batch
        rung = read_plan_or_rung(tmp_path / "plan.ladder.json", k)
        assert rung.prediction.feasible and rung.global_batch == 16
    assert "rung" in res.stdout and "v100" in res.stdout
    with pytest.raises(PlanError, match="rung 2: .* has rungs 0 to 1"):
        read_plan_or_rung(tmp_path / "plan.ladder.json", 2)
    with pytest.raises(PlanError, match="is a plan, not a fallback ladder"):
        read_plan_or_rung(out, 1)
    assert read_plan_or_rung(tmp_path / "plan.ladder.json") == read_plan_or_rung(out)  # rung 0: the written plan
    res = run_paraplan("simulate", str(tmp_path / "plan.ladder.json"), env=ENV)  # a ladder is not a plan: one line
    assert res.returncode == 2 and "a fallback ladder, not a plan" in res.stderr and res.stderr.count("\n") == 1
    # on this machine: a ladder of `local` (one node of its cores), rung 1 trained on one fewer process
    local = tmp_path / "local.json"
    res = run_paraplan("plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--fallbacks", "1",
                       "--out", str(local), "--time-limit", "60", "--quiet", "--no-calibration", env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    rung = read_plan_or_rung(tmp_path / "local.ladder.json", 1)
    res = run_paraplan("train", "--plan", str(tmp_path / "local.ladder.json"), "--rung", "1", "--steps", "2",
                       "--out-dir", str(tmp_path / "run"), env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    assert len(json.loads((tmp_path / "run" / "losses.json").read_text())) == 2
    assert len(set(rung.devices)) <= load_cluster("local").n_devices - 1


def test_a_switch_reads_what_each_device_holds_at_the_storages_bandwidth(tmp_path):
    """Issue 53 item 3: each device reads the parameters and optimizer state it holds under the new
    plan (fp32 weights and Adam's two moments: 12 bytes a parameter), at the shared storage's
    bandwidth in all and each node's port, then one iteration."""
    from paraplan.costs.restart import switch_cost
    from paraplan.hardware.cluster import DEFAULT_STORAGE
    from paraplan.plans.plan import LayerRange, Plan, Stage

    w = workload("gpt2-tiny", MIXED, batch=16)
    n = w.request.n_layers
    params = sum(layer.param_count for layer in w.spec.layers)
    one = Plan(model="gpt2-tiny", cluster="m", n_layers=n, global_batch=16, n_micro=1, schedule="gpipe",
               grad_sync="none", stages=(Stage(LayerRange(0, n), (0,)),))
    cost = switch_cost(one, w.costs, iteration_s=0.5)
    assert cost.read_bytes == {0: pytest.approx(12 * params)}
    assert cost.reload_s == pytest.approx(12 * params / DEFAULT_STORAGE.shared_read_bytes_per_s)
    assert cost.restart_s == pytest.approx(cost.reload_s + 0.5)
    # two replicas on two nodes read a whole copy each: twice the bytes through the storage
    two = Plan(model="gpt2-tiny", cluster="m", n_layers=n, global_batch=16, n_micro=1, schedule="gpipe",
               grad_sync="after-backward", stages=(Stage(LayerRange(0, n), (0, 4)),))
    assert switch_cost(two, w.costs, 0.5).reload_s == pytest.approx(2 * cost.reload_s)
    # a cluster file's own storage, and a malformed one in one line
    text = Path(MIXED).read_text()
    slow = tmp_path / "slow.toml"
    slow.write_text(text.replace('description = "', 'storage = { shared_read_bytes_per_s = 1.0e6, source = "NFS" }\n'
                                 'description = "', 1))
    cluster = load_cluster(str(slow))
    assert cluster.storage.shared_read_bytes_per_s == 1.0e6
    from dataclasses import replace

    slow_cost = switch_cost(one, replace(w.costs, cluster=cluster), 0.5)
    assert slow_cost.reload_s == pytest.approx(12 * params / 1.0e6) and slow_cost.storage_source == "NFS"
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('description = "', 'storage = { shared_read_bytes_per_s = -1 }\ndescription = "', 1))
    from paraplan.hardware.cluster_file import ClusterFileError

    with pytest.raises(ClusterFileError, match="storage.shared_read_bytes_per_s: expected a positive number"):
        load_cluster(str(bad))


def test_what_a_switch_reads_depends_on_the_layout_the_checkpoint_was_saved_under():
    """torch.distributed.checkpoint reads each saved piece that overlaps a device's shard whole. Two
    plan pairs by hand: saved by one whole stage, loaded into TP2 (each TP rank reads every layer
    whole: twice what it holds); saved in FSDP shards of 1/2, loaded as SDP2 (each reads its own half:
    what it holds) or by one whole stage (both halves: what it holds, the whole)."""
    from paraplan.costs.restart import switch_cost
    from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage

    w = workload("gpt2-tiny", MIXED, batch=16)
    n = w.request.n_layers
    base = dict(model="gpt2-tiny", cluster="m", n_layers=n, global_batch=16, n_micro=1, schedule="gpipe",
                grad_sync="none")
    whole = Plan(**base, stages=(Stage(LayerRange(0, n), (0,)),))

    def one_stage(**degrees):
        return Plan(**base, stages=(Stage(LayerRange(0, n), (0, 1), strategies=(LayerStrategy(**degrees),) * n),))

    tp2, sdp2 = one_stage(tp=2), one_stage(sdp=2)
    held_tp2 = switch_cost(tp2, w.costs, 0.5).read_bytes
    assert switch_cost(tp2, w.costs, 0.5, saved_under=whole).read_bytes == pytest.approx(
        {d: 2 * b for d, b in held_tp2.items()})
    held_sdp2 = switch_cost(sdp2, w.costs, 0.5).read_bytes
    assert switch_cost(sdp2, w.costs, 0.5, saved_under=sdp2).read_bytes == pytest.approx(held_sdp2)
    assert switch_cost(whole, w.costs, 0.5, saved_under=sdp2).read_bytes == pytest.approx(
        switch_cost(whole, w.costs, 0.5).read_bytes)


def test_goodput_is_youngs_closed_form():
    """tau = sqrt(2 C M_job), M_job = M_node / N; waste = C / tau + (tau / 2 + R) / M_job; a ladder's
    expected useful throughput weights rung k's goodput by M_node / (N - k)."""
    from paraplan.costs.goodput import (
        LLAMA3_NODE_MTBF_H,
        checkpoint_write_s,
        goodput,
        ladder_goodput,
        young_interval,
    )

    assert LLAMA3_NODE_MTBF_H == pytest.approx(5696, abs=1)  # the "about 5,700 h per node"
    assert young_interval(30.0, 3600.0) == pytest.approx((2 * 30 * 3600) ** 0.5)
    g = goodput(100.0, nodes=4, node_mtbf_h=8.0, checkpoint_s=18.0, restart_s=60.0)
    job = 8 * 3600 / 4
    tau = (2 * 18 * job) ** 0.5
    assert (g.job_mtbf_s, g.interval_s) == (pytest.approx(job), pytest.approx(tau))
    assert g.waste == pytest.approx(18 / tau + (tau / 2 + 60) / job)
    assert g.goodput == pytest.approx(100 * (1 - g.waste))
    h = goodput(90.0, nodes=3, node_mtbf_h=8.0, checkpoint_s=18.0, restart_s=60.0)
    assert ladder_goodput([g, h], nodes=4, node_mtbf_h=8.0) == pytest.approx(
        (8 / 4 * g.goodput + 8 / 3 * h.goodput) / (8 / 4 + 8 / 3))
    # C: 12 bytes a parameter at the lesser of the storage's and the ports' bandwidth
    assert checkpoint_write_s(1e9, 10e9, 4e9) == pytest.approx(12e9 / 4e9)


def test_train_checkpoints_at_youngs_interval(tmp_path):
    """`train --checkpoint-every auto`: Young's interval over the plan's predicted iteration, in steps
    (a tiny model on this machine: a checkpoint in microseconds against a node failing every 5,696 h)."""
    from paraplan.costs.goodput import LLAMA3_NODE_MTBF_H, checkpoint_write_s, young_interval
    from paraplan.hardware.cluster import DEFAULT_STORAGE
    from paraplan.plans.plan_file import read_plan

    plan_path = tmp_path / "plan.json"
    res = run_paraplan("plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--planner", "even",
                       "--out", str(plan_path), "--no-calibration", env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    res = run_paraplan("train", "--plan", str(plan_path), "--steps", "2", "--checkpoint-every", "auto",
                       "--checkpoint-dir", str(tmp_path / "ck"), "--out-dir", str(tmp_path / "run"), env=ENV,
                       timeout=300)
    assert res.returncode == 0, res.stderr
    plan = read_plan(plan_path)
    local = load_cluster("local")
    spec = workload("gpt2-tiny", "local", batch=8).spec
    write = checkpoint_write_s(sum(x.param_count for x in spec.layers), DEFAULT_STORAGE.shared_read_bytes_per_s,
                               local.nodes[0].network.bandwidth_bytes_per_s)
    steps = max(1, round(young_interval(write, LLAMA3_NODE_MTBF_H * 3600) / plan.prediction.iteration_s))
    assert f"checkpoints every {steps} steps" in res.stdout
    assert (tmp_path / "ck" / "checkpoint.json").exists()  # the last step's, as ever
    bad = run_paraplan("train", "--plan", str(plan_path), "--steps", "2", "--checkpoint-every", "auto",
                       "--out-dir", str(tmp_path / "run2"), env=ENV, timeout=300)
    assert bad.returncode == 2 and "--checkpoint-every auto: needs --checkpoint-dir" in bad.stderr


def test_plans_ranked_by_goodput_and_said_when_that_changes_the_choice():
    """`plan --mtbf H`: the feasible plan of the highest goodput (its restart reads and its nodes'
    failures counted), and one line saying whether that is the fastest."""
    from paraplan.cli.plan_ladder import goodput_choice
    from paraplan.costs.goodput import plan_goodput
    from paraplan.planners.auto import compare

    w = workload("gpt2-tiny", MIXED, batch=16)
    result = compare(w.request, planners=["dp", "pp", "csimd", "dp+tp"], time_limit_s=120)
    for mtbf in (5696.0, 0.002):  # Llama 3's node MTBF, and one so short that restarts dominate
        chosen, line = goodput_choice(result, w.costs, mtbf)
        scored = {r.planner: plan_goodput(r.plan, r.throughput, r.iteration_s, w.costs, mtbf).goodput
                  for r in result.rows if r.status == "ok"}
        assert scored[chosen.planner] == max(scored.values())
        assert line.startswith(f"by goodput with a node failing every {mtbf:,.4g} h: {chosen.planner}")
        assert ("rather than the fastest" in line) == (chosen.planner != result.best)
