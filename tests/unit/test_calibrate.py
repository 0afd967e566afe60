"""paraplan calibrate's pure parts: the compute fit, the cluster file's [runtime] table, how the
measured runtime figures enter the cost model and the simulator; runtime/launcher/prove.py's helpers."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.costs.calibration_fit import LayerSamples, _predict, fit_compute
from paraplan.costs.model import RuntimeOverheads, analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.hardware.cluster_file import read_cluster_file
from paraplan.hardware.cluster_write import write_cluster_file
from paraplan.models import measure, zoo
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.runtime.launcher.prove import check_runs_here, one_process_plan, spearman
from paraplan.simulator.predict import simulate_plan


def _samples(e, k, m, rng, noise=0.0) -> LayerSamples:
    n = 120
    # log-uniform sizes: small layers (dispatch-bound) beside large ones, as in the real zoo models
    flops = 10 ** rng.uniform(3, 8.7, n) * (rng.random(n) > 0.1)  # some rows without FLOPs (lookups)
    traffic = 10 ** rng.uniform(3, 7.6, n)
    ops = rng.integers(1, 40, n).astype(float)
    s = LayerSamples(flops, traffic, ops, np.zeros(n), np.array(["m"] * n), np.full(n, 8))
    t = _predict(s, e, k, m) * (1 + noise * rng.standard_normal(n))
    return replace(s, seconds=t)


@pytest.mark.parametrize("e,k,m", [(2e10, 3e-5, 1.5e9), (8e10, 5e-6, 2e10), (3e9, 1e-4, 5e8)])
def test_the_fit_recovers_the_device_figures_that_made_the_times(e, k, m):
    rng = np.random.default_rng(0)
    fit = fit_compute(_samples(e, k, m, rng))
    assert fit.flops_per_s == pytest.approx(e, rel=0.05)
    assert fit.kernel_overhead_s == pytest.approx(k, rel=0.1)
    assert fit.memory_bandwidth_bytes_per_s == pytest.approx(m, rel=0.1)
    assert fit.median_abs_error < 0.03


def test_the_fit_stays_close_under_noise():
    rng = np.random.default_rng(1)
    fit = fit_compute(_samples(2e10, 3e-5, 1.5e9, rng, noise=0.1))
    assert fit.flops_per_s == pytest.approx(2e10, rel=0.15)
    assert abs(fit.step_errors["m"][8]) < 0.05


def test_the_runtime_table_round_trips_and_enters_the_cost_model(tmp_path):
    o = RuntimeOverheads(rendezvous=True, action_s=3e-4, step_s=5e-3, compute_scale=1.3, tp_kernel_s=1e-3,
                         sdp_layer_s=2e-3, dp_sync_s=1e-3, source="test")
    cluster = replace(load_cluster("local"), overheads=o)
    write_cluster_file(cluster, tmp_path / "c.toml", calibration={"note": {"x": 1.0}})
    back = read_cluster_file(tmp_path / "c.toml")
    assert back.overheads == o
    spec = measure.measure(zoo.build("gpt2-tiny"))
    assert analytic_cost_model(spec, back).overheads == o
    mine = RuntimeOverheads(action_s=1e-3)
    assert analytic_cost_model(spec, back, overheads=mine).overheads == mine  # the caller's wins
    assert analytic_cost_model(spec, load_cluster("local")).overheads.step_s == 0.0  # uncalibrated: none


def test_the_optimizer_step_follows_its_measured_curve(tmp_path, capsys):
    """Inside the cache the step is cheap per byte, beyond it dear (1.0 and 3.5 ns per Adam parameter
    measured here): the curve is read linearly between its points, from (0, 0) to the first and
    with its last slope beyond the last; without a curve the per-byte rate. It round-trips through
    the cluster file; a curve out of order is one line."""
    curve = ((16e6, 1e-3), (64e6, 14e-3))
    o = RuntimeOverheads(optimizer_s_per_byte=2e-10, optimizer_curve=curve)
    assert o.optimizer_step_s(8e6) == pytest.approx(0.5e-3)
    assert o.optimizer_step_s(40e6) == pytest.approx(1e-3 + 13e-3 / 2)
    assert o.optimizer_step_s(112e6) == pytest.approx(14e-3 + 13e-3)
    assert o.optimizer_step_s(0.0) == 0.0
    assert RuntimeOverheads(optimizer_s_per_byte=2e-10).optimizer_step_s(1e6) == pytest.approx(2e-4)
    cluster = replace(load_cluster("local"), overheads=o)
    write_cluster_file(cluster, tmp_path / "c.toml")
    assert read_cluster_file(tmp_path / "c.toml").overheads == o
    text = (tmp_path / "c.toml").read_text().replace("16000000.0", "99000000.0")
    (tmp_path / "bad.toml").write_text(text)
    assert main(["simulate", "examples/gpt2-tiny-local-1f1b-2x4.json", "--cluster", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runtime.optimizer_curve" in err[0] and "ascending" in err[0]


def test_a_malformed_runtime_table_is_one_line(tmp_path, capsys):
    cluster = replace(load_cluster("local"), overheads=RuntimeOverheads(action_s=1e-4))
    write_cluster_file(cluster, tmp_path / "c.toml")
    text = (tmp_path / "c.toml").read_text().replace("compute_scale = 1.0", "compute_scale = -2")
    (tmp_path / "bad.toml").write_text(text)
    assert main(["simulate", "examples/gpt2-tiny-local-1f1b-2x4.json", "--cluster", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runtime.compute_scale" in err[0]


def _gpt2(n_micro, devices, strategies=()):
    return Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=16, n_micro=n_micro, schedule="gpipe",
                grad_sync="none", stages=(Stage(LayerRange(0, 6), devices, strategies=strategies),))


def test_the_compute_scale_applies_to_plans_on_several_devices_only():
    spec = measure.measure(zoo.build("gpt2-tiny"))
    plain = analytic_cost_model(spec, load_cluster("local"))
    scaled = analytic_cost_model(spec, replace(load_cluster("local"), overheads=RuntimeOverheads(compute_scale=2.0)))
    one = _gpt2(1, (0,))
    assert simulate_plan(one, scaled).prediction.iteration_s == pytest.approx(
        simulate_plan(one, plain).prediction.iteration_s, rel=1e-12)
    pipe = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=16, n_micro=1, schedule="gpipe",
                grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
    # one micro-batch through two stages: compute doubles, the transfers do not
    a, b = simulate_plan(pipe, plain).prediction.iteration_s, simulate_plan(pipe, scaled).prediction.iteration_s
    costs = plain.compute(0)
    compute = sum(float(costs.forward[i](16)) + float(costs.backward[i](16)) for i in range(6))
    assert b - a == pytest.approx(compute, rel=1e-6)


def test_tensor_parallel_layers_pay_the_measured_machinery_per_pass():
    spec = measure.measure(zoo.build("gpt2-tiny"))
    base = replace(load_cluster("local"), overheads=RuntimeOverheads())
    with_tp = replace(load_cluster("local"), overheads=RuntimeOverheads(tp_kernel_s=1e-5, sdp_layer_s=5e-3))
    tp = _gpt2(1, (0, 1), (LayerStrategy(tp=2),) * 6)
    gap = (simulate_plan(tp, analytic_cost_model(spec, with_tp)).prediction.iteration_s
           - simulate_plan(tp, analytic_cost_model(spec, base)).prediction.iteration_s)
    kernels = sum(max(1, lay.forward_ops) + max(1, lay.backward_ops) for lay in spec.layers)
    assert gap == pytest.approx(kernels * 1e-5, rel=1e-6)  # every kernel of both passes; SDP not charged
    sdp = _gpt2(1, (0, 1), (LayerStrategy(sdp=2),) * 6)
    gap = (simulate_plan(sdp, analytic_cost_model(spec, with_tp)).prediction.iteration_s
           - simulate_plan(sdp, analytic_cost_model(spec, base)).prediction.iteration_s)
    assert gap == pytest.approx(6 * 2 * 5e-3, rel=1e-6)  # per layer and pass


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [5, 5, 6]) == pytest.approx(np.corrcoef([0, 1, 2], [0.5, 0.5, 2])[0, 1])


def test_the_one_process_plan_and_the_machine_check():
    plan = one_process_plan(_gpt2(2, (0, 1)))
    assert plan.devices == (0,) and plan.n_micro == 1 and plan.global_batch == 16
    with pytest.raises(Exception, match="this machine"):
        check_runs_here(10_000, "big")


def test_prove_on_a_cluster_larger_than_this_machine_is_one_line(capsys):
    assert main(["plan", "--model", "gpt2-tiny", "--cluster", "galvatron-64xa100", "--batch", "8", "--prove",
                 "--out", "/tmp/never-written-prove.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "this machine" in err[0]


def test_the_compute_inside_a_run_is_read_off_its_timeline(tmp_path):
    """calibrate's in-run compute scale starts from the compute a measured step ran, every rank's
    forwards and backwards summed, the median over the steps after the first two (transfers and
    waits on other lanes not counted)."""
    import json

    from paraplan.runtime.measure.compare import measured_compute_s

    spans = [0.5, 0.5, 1.0, 2.0, 1.5, 1.2]  # per step: each rank's forward and backward take this much each
    for rank in range(2):
        events = []
        for step, span in enumerate(spans):
            t = 10.0 * step
            events += [{"step": step, "lane": "compute", "kind": "forward", "micro": 0, "start": t, "end": t + span},
                       {"step": step, "lane": "p2p", "kind": "send", "micro": 0, "start": t + span,
                        "end": t + span + 3.0},
                       {"step": step, "lane": "compute", "kind": "backward", "micro": 0, "start": t + 4.0,
                        "end": t + 4.0 + span}]
        (tmp_path / f"timeline_rank{rank}.json").write_text(json.dumps({"rank": rank, "events": events}))
        (tmp_path / f"steps_rank{rank}.json").write_text(json.dumps([10.0] * len(spans)))
    assert measured_compute_s(tmp_path) == pytest.approx(4 * 1.35)  # median of 1.0, 2.0, 1.5, 1.2, 4 spans a step


def test_the_gradient_sync_machinery_is_charged_once_per_step_where_gradients_sync():
    """RuntimeOverheads.dp_sync_s (calibrate's DP2 run: DDP's hooks, bucket copies and an
    all-reduce waiting on the slower replica, beyond the link time): once per step of a plan whose
    replicas sync gradients, nothing where none do; it round-trips through the cluster file."""
    spec = measure.measure(zoo.build("gpt2-tiny"))
    base = replace(load_cluster("local"), overheads=RuntimeOverheads())
    charged = replace(load_cluster("local"), overheads=RuntimeOverheads(dp_sync_s=4e-3))
    dp = replace(_gpt2(1, (0, 1), (LayerStrategy(dp=2),) * 6), grad_sync="bucketed")
    gap = (simulate_plan(dp, analytic_cost_model(spec, charged)).prediction.iteration_s
           - simulate_plan(dp, analytic_cost_model(spec, base)).prediction.iteration_s)
    assert gap == pytest.approx(4e-3, rel=1e-9)
    one = _gpt2(1, (0,))
    assert simulate_plan(one, analytic_cost_model(spec, charged)).prediction.iteration_s == pytest.approx(
        simulate_plan(one, analytic_cost_model(spec, base)).prediction.iteration_s, rel=1e-12)


def test_a_one_process_plan_pays_its_own_measured_step():
    """RuntimeOverheads.solo_step_s (calibrate's one-process run): a one-device plan's cost outside
    its schedule where it was measured apart, step_s for every other plan; it round-trips."""
    spec = measure.measure(zoo.build("gpt2-tiny"))
    o = RuntimeOverheads(step_s=5e-3, solo_step_s=1e-3)
    cm = analytic_cost_model(spec, replace(load_cluster("local"), overheads=o))
    plain = analytic_cost_model(spec, replace(load_cluster("local"), overheads=RuntimeOverheads()))
    one = _gpt2(1, (0,))
    dp = _gpt2(1, (0, 1), (LayerStrategy(dp=2),) * 6)
    for plan, step in ((one, 1e-3), (dp, 5e-3)):
        gap = simulate_plan(plan, cm).prediction.iteration_s - simulate_plan(plan, plain).prediction.iteration_s
        assert gap == pytest.approx(step, rel=1e-9)
    assert RuntimeOverheads(step_s=5e-3).step_for(1) == 5e-3  # not measured apart: step_s
    assert o.step_for(2) == 5e-3


@pytest.fixture(scope="module")
def doubling():
    """The overhead plan (gpt2-tiny, 2 stages, 1F1B, 4 micro-batches) and its doubled plan as calibrate
    runs them, the model, the cluster, and `at(alpha)`: both plans' predicted steps at a message
    latency of alpha (what message_and_step_costs fits against)."""
    from paraplan.hardware.cluster import LinkSpec, NodeSpec

    spec = measure.measure(zoo.build("gpt2-tiny"))
    cluster = replace(load_cluster("local"), overheads=RuntimeOverheads(rendezvous=True))  # as calibrate has it
    plan = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=32, n_micro=4, schedule="1f1b",
                grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
    doubled = replace(plan, global_batch=64, n_micro=8)

    def at(alpha):
        link = LinkSpec(cluster.nodes[0].intra_link.bandwidth_bytes_per_s, alpha)
        c = replace(cluster, nodes=tuple(NodeSpec(n.name, n.devices, link, link) for n in cluster.nodes))
        cm = analytic_cost_model(spec, c)
        return simulate_plan(plan, cm).prediction.iteration_s, simulate_plan(doubled, cm).prediction.iteration_s

    return plan, doubled, spec, cluster, at


def test_a_message_costs_the_ping_pong_unless_the_doubling_says_more_than_its_noise(doubling):
    """profiling/calibrate: message_and_step_costs. The doubled plan's addition, as the simulator
    makes it at a known latency, is given back as the measurement: with pairs that agree the fit
    finds that latency; with pairs whose spread covers the excess it keeps the floor."""
    from paraplan.profiling.calibrate import message_and_step_costs

    plan, doubled, spec, cluster, at = doubling
    floor, true = 5e-5, 1e-3
    step, twice = at(true)
    alpha, extra = message_and_step_costs(plan, doubled, spec, None, cluster, step, (twice - step,) * 3, floor)
    assert alpha == pytest.approx(true, rel=1e-3) and extra == pytest.approx(0.0, abs=1e-6)
    excess = (twice - step) - (at(floor)[1] - at(floor)[0])
    noisy = (twice - step - 1.5 * excess, twice - step, twice - step + 1.5 * excess)
    alpha, extra = message_and_step_costs(plan, doubled, spec, None, cluster, step, noisy, floor)
    assert alpha == floor and extra == pytest.approx(step - at(floor)[0], rel=1e-6)


def test_a_message_costs_no_more_than_the_plans_own_step_leaves_it(doubling):
    """profiling/calibrate: message_and_step_costs. A doubling whose addition only a large latency
    explains, while the plan itself ran as fast as the simulator predicts at the ping-pong's latency:
    the messages are capped where the plan's predicted step meets its measured one (the per-step
    cost 0), not where the doubling alone puts them (make demo once fitted 1,217 us this way)."""
    from paraplan.profiling.calibrate import message_and_step_costs

    plan, doubled, spec, cluster, at = doubling
    floor = 5e-5
    step_small = at(3e-4)[0]  # the plan ran as the simulator predicts it at 300 us a message
    added_large = at(1.5e-3)[1] - at(1.5e-3)[0]  # what 1.5 ms a message adds to the doubling
    alpha, extra = message_and_step_costs(plan, doubled, spec, None, cluster, step_small, (added_large,) * 3, floor)
    assert alpha == pytest.approx(3e-4, rel=1e-3) and extra == pytest.approx(0.0, abs=1e-6)
