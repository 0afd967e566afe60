"""Link contention while scheduling (links="ports", ours, beyond the FD-DPS paper): the port model
of fddps/ports.py's PortLedger against `replay_ports` and the simulator's engine, by hand and on random
DAGs; transfers into (and out of) one device serialize; the contention-free default is unchanged;
the `links` option and the `fddps-ports` planner.

Booking order vs the simulator: the engine serves each port first come, first served by ready time
(ties: task id, i.e. edge index). The scheduler books in placement order; a booking is exact (the
engine times it as booked) unless it would have to go behind a booked transfer that became ready
later (an "inversion", counted in stats["port_inversions"]). With no inversion the booked port
orders are the engine's and the schedule equals the simulation bit for bit; with inversions no
bound is claimed (the engine serves the earlier-ready transfer first and delays the other; on the
dense random DAGs below the ratio ranged 0.8-1.6, on real models' graphs 1.00-1.10:
benchmarks/fddps_contention.py)."""

import math
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costs.model import analytic_cost_model
from paraplan.errors import FieldError
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.models.op_trace import build_op_graph
from paraplan.planners.fddps.baselines import schedule_fastt, schedule_heft, schedule_mpdps
from paraplan.planners.fddps.dps import schedule_fddps
from paraplan.planners.fddps.port_replay import port_sequences, replay_ports
from paraplan.planners.fddps.problem import DagProblem, DagProblemError, replay
from paraplan.planners.registry import make_plan, planner
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import OperatorPlacement
from paraplan.simulator.dag import OpEdge, build_dag_graph
from paraplan.simulator.engine import simulate
from paraplan.simulator.predict import simulate_plan


def problem_of(exec_s, edges, *, alpha=0.0, beta=math.inf, capacity=math.inf):
    exec_s = np.asarray(exec_s, dtype=float)
    n, d = exec_s.shape
    src, dst, nbytes = (list(x) for x in zip(*edges, strict=True)) if edges else ([], [], [])
    return DagProblem(exec_s, src, dst, nbytes, np.broadcast_to(alpha, (d, d)), np.broadcast_to(beta, (d, d)),
                      np.zeros(n), np.zeros(n), np.broadcast_to(capacity, (d,)))


def random_problem(seed, n, d, *, p_edge=0.35, capacity=math.inf, shared=False):
    """As test_dag_sched's: heterogeneous devices, a tenth of the nodes free, links of 0-1 s latency.
    shared: every edge out of a node carries the same tensor (its output, as in real graphs), so
    consumers on one device share its transfer."""
    rng = np.random.default_rng(seed)
    out = rng.uniform(0, 4e3, size=n) if shared else None
    edges = [(a, b, float(out[a]) if shared else float(rng.uniform(0, 4e3)))
             for a in range(n) for b in range(a + 1, n) if rng.random() < p_edge]
    exec_s = rng.uniform(0.5, 6.0, size=(n, d))
    exec_s[rng.random(n) < 0.1] = 0.0
    return DagProblem(exec_s, [e[0] for e in edges], [e[1] for e in edges], [e[2] for e in edges],
                      rng.uniform(0.0, 1.0, size=(d, d)), rng.uniform(1e3, 4e3, size=(d, d)),
                      rng.uniform(0, 10, n), rng.uniform(0, 5, n), np.full(d, capacity))


def ports(fn, **kw):
    return lambda problem: fn(problem, links="ports", **kw)


PORT_SCHEDULERS = [ports(schedule_fddps), ports(schedule_fddps, fallback="earliest_finish"), ports(schedule_heft),
                   ports(schedule_fastt)]
PORT_IDS = ["fddps", "fddps-ef", "heft", "fastt"]


def engine_run(problem, device, order):
    """The simulator with contention on the plan (device, order): simulator/dag.py builds the task
    graph exactly as for a real plan; the links are priced by the problem's own alpha-beta."""
    names = [f"op{i}" for i in range(problem.n_nodes)]
    placement = [OperatorPlacement(k, tuple(names[i] for i in seq)) for k, seq in enumerate(order) if seq]
    edges = [OpEdge(names[a], names[b], nb) for a, b, nb in
             zip(problem.edge_src.tolist(), problem.edge_dst.tolist(), problem.edge_bytes.tolist(), strict=True)]
    graph, task = build_dag_graph(placement, edges, lambda op, k: float(problem.exec_s[int(op[2:]), k]),
                                  problem.transfer_s, problem.n_devices)
    timeline = simulate(graph, contention=True)
    tasks = [task[name] for name in names]
    moved = np.array(graph.edge_transfers)
    t_start = np.full(problem.n_edges, np.nan)
    t_end = np.full(problem.n_edges, np.nan)
    remote = moved >= 0
    t_start[remote], t_end[remote] = timeline.start[moved[remote]], timeline.end[moved[remote]]
    return timeline.start[tasks], timeline.end[tasks], t_start, t_end


def check_port_schedule(problem, schedule):
    """The schedule is `replay_ports` of its own placement, order and booked transfer order, bit for
    bit; transfers respect data, and never overlap on a port."""
    again = replay_ports(problem, schedule.device, schedule.order, schedule.transfer_order())
    assert np.array_equal(again.start_s, schedule.start_s)
    assert np.array_equal(again.finish_s, schedule.finish_s)
    assert np.array_equal(again.transfer_start_s, schedule.transfer_start_s, equal_nan=True)
    assert np.array_equal(again.transfer_finish_s, schedule.transfer_finish_s, equal_nan=True)
    assert again.makespan_s == schedule.makespan_s
    dev, ts, tf = schedule.device, schedule.transfer_start_s, schedule.transfer_finish_s
    for e, (a, b) in enumerate(zip(problem.edge_src.tolist(), problem.edge_dst.tolist(), strict=True)):
        if dev[a] == dev[b]:
            assert math.isnan(ts[e]) and schedule.start_s[b] >= schedule.finish_s[a]
        else:
            assert ts[e] >= schedule.finish_s[a] and schedule.start_s[b] >= tf[e]
            assert tf[e] == ts[e] + problem.transfer_s(int(dev[a]), int(dev[b]), float(problem.edge_bytes[e]))
    for seq in port_sequences(problem, dev, schedule.transfer_order()).values():
        for x, y in zip(seq, seq[1:], strict=False):
            same = (problem.edge_src[x], dev[problem.edge_dst[x]], problem.edge_bytes[x]) == \
                   (problem.edge_src[y], dev[problem.edge_dst[y]], problem.edge_bytes[y])
            assert (ts[x], tf[x]) == (ts[y], tf[y]) if same else tf[x] <= ts[y]  # one tensor goes once


# --- (a) the port model: scheduler = replay_ports; replay_ports (FIFO) = the engine -------------------

@pytest.mark.parametrize("scheduler", PORT_SCHEDULERS, ids=PORT_IDS)
@pytest.mark.parametrize("seed", range(24))
def test_a_port_aware_schedule_is_its_port_replay(scheduler, seed):
    problem = random_problem(seed, 11, 3, capacity=math.inf if seed % 3 else 25.0, shared=seed % 2 == 0)
    check_port_schedule(problem, scheduler(problem))


@pytest.mark.parametrize("seed", range(30))
def test_the_fifo_port_replay_is_the_simulator_engine(seed):
    """replay_ports without a transfer order is simulator/engine.py with contention, bit for bit, on any
    placement and order (here random ones and the free-links FD-DPS schedule)."""
    problem = random_problem(100 + seed, 10, 3, shared=seed % 2 == 0)
    rng = np.random.default_rng(seed)
    device = rng.integers(0, 3, problem.n_nodes)
    order = [tuple(int(i) for i in np.flatnonzero(device == k)) for k in range(3)]  # index order is topological
    for dev, seqs in ((device, order), (schedule_fddps(problem).device, schedule_fddps(problem).order)):
        fifo = replay_ports(problem, dev, seqs)
        start, finish, t_start, t_end = engine_run(problem, dev, seqs)
        assert np.array_equal(fifo.start_s, start) and np.array_equal(fifo.finish_s, finish)
        assert np.array_equal(fifo.transfer_start_s, t_start, equal_nan=True)
        assert np.array_equal(fifo.transfer_finish_s, t_end, equal_nan=True)
        # and an explicit order equal to the engine's own reproduces it
        again = replay_ports(problem, dev, seqs, fifo.transfer_order)
        assert np.array_equal(again.start_s, start)


def test_the_scheduler_equals_the_simulator_wherever_it_booked_no_inversion():
    exact = inverted = 0
    for seed in range(40):
        problem = random_problem(200 + seed, 11, 3, shared=seed % 2 == 0)
        for scheduler in PORT_SCHEDULERS:
            schedule = scheduler(problem)
            start, finish, t_start, _ = engine_run(problem, schedule.device, schedule.order)
            booked = port_sequences(problem, schedule.device, schedule.transfer_order())
            served = port_sequences(problem, schedule.device, replay_ports(problem, schedule.device,
                                                                           schedule.order).transfer_order)
            if schedule.stats["port_inversions"] == 0:
                exact += 1
                assert booked == served
                assert np.array_equal(start, schedule.start_s) and np.array_equal(finish, schedule.finish_s)
                assert np.array_equal(t_start, schedule.transfer_start_s, equal_nan=True)
            else:
                inverted += 1
    assert exact >= 20 and inverted >= 1  # both kinds occur on these dense, communication-heavy DAGs


def test_replay_ports_checks_its_transfer_order():
    p = problem_of([[1, 1], [1, 1], [1, 1]], [(0, 1, 1.0), (0, 2, 1.0)], alpha=1.0)
    with pytest.raises(DagProblemError, match="every edge between two devices"):
        replay_ports(p, [0, 1, 1], ((0,), (1, 2)), (0,))
    # 0 (device 0) -> 1 (device 1) -> 2 (device 0) -> 3 (device 1): 2 -> 3 cannot leave device 0's
    # send port before 0 -> 1, which it depends on
    chain = problem_of([[1, 1]] * 4, [(0, 1, 0.0), (1, 2, 0.0), (2, 3, 0.0)], alpha=1.0)
    with pytest.raises(DagProblemError, match="deadlock"):
        replay_ports(chain, [0, 1, 0, 1], ((0, 2), (1, 3)), (2, 1, 0))
    assert replay_ports(chain, [0, 1, 0, 1], ((0, 2), (1, 3)), (0, 1, 2)).start_s.tolist() == [0, 2, 4, 6]
    # no transfer at all: the contention-free replay
    r = replay_ports(p, [0, 0, 0], ((0, 1, 2), (), ))
    assert r.start_s.tolist() == replay(p, [0, 0, 0], ((0, 1, 2), ())).start_s.tolist() == [0, 1, 2]
    assert r.transfer_order == () and np.isnan(r.transfer_start_s).all()


# --- (b) transfers into one device, and out of one device, serialize ------------------------------

SLOW = 100.0  # a node's time on the devices it should not use


@pytest.mark.parametrize("scheduler", PORT_SCHEDULERS, ids=PORT_IDS)
def test_two_transfers_into_one_device_serialize(scheduler):
    """0 (device 0) and 1 (device 1) both feed 2 (device 2), each tensor 3 s on the wire: device 2's
    one receive port takes them one after the other, 2 starts at 1 + 3 + 3, not 1 + 3."""
    p = problem_of([[1, SLOW, SLOW], [SLOW, 1, SLOW], [SLOW, SLOW, 1]], [(0, 2, 3.0), (1, 2, 3.0)], beta=1.0)
    free = schedule_fddps(p)
    assert free.device.tolist() == [0, 1, 2] and free.start_s.tolist() == [0, 0, 4] and free.transfer_start_s is None
    s = scheduler(p)
    assert s.device.tolist() == [0, 1, 2]
    assert s.start_s.tolist() == [0, 0, 7] and s.makespan_s == 8
    assert s.transfer_start_s.tolist() == [1, 4] and s.transfer_finish_s.tolist() == [4, 7]  # edge order: FIFO tie
    assert s.stats["port_inversions"] == 0 and s.stats["port_wait_s"] == 3
    check_port_schedule(p, s)
    start, _, t_start, _ = engine_run(p, s.device, s.order)  # and so does the simulator
    assert start.tolist() == [0, 0, 7] and t_start.tolist() == [1, 4]
    # the contention-free schedule, simulated with contention, waits just the same
    assert replay_ports(p, free.device, free.order).start_s.tolist() == [0, 0, 7]


@pytest.mark.parametrize("scheduler", PORT_SCHEDULERS, ids=PORT_IDS)
def test_two_transfers_out_of_one_device_serialize(scheduler):
    p = problem_of([[1, SLOW, SLOW], [SLOW, 1, SLOW], [SLOW, SLOW, 1]], [(0, 1, 3.0), (0, 2, 3.0)], beta=1.0)
    s = scheduler(p)
    assert s.device.tolist() == [0, 1, 2] and s.start_s.tolist() == [0, 4, 7]
    assert s.transfer_start_s.tolist() == [1, 4]
    check_port_schedule(p, s)
    assert engine_run(p, s.device, s.order)[0].tolist() == [0, 4, 7]


@pytest.mark.parametrize("scheduler", PORT_SCHEDULERS, ids=PORT_IDS)
def test_a_tensor_goes_to_a_device_once(scheduler):
    """1 and 2 (both on device 1) read 0's output (device 0): one transfer, as in the simulator."""
    p = problem_of([[1, SLOW], [SLOW, 1], [SLOW, 1]], [(0, 1, 3.0), (0, 2, 3.0)], beta=1.0)
    s = scheduler(p)
    assert s.device.tolist() == [0, 1, 1] and s.start_s.tolist() == [0, 4, 5]
    assert s.transfer_start_s.tolist() == [1, 1] and s.stats["port_wait_s"] == 0
    check_port_schedule(p, s)
    start, _, t_start, _ = engine_run(p, s.device, s.order)
    assert start.tolist() == [0, 4, 5] and t_start.tolist() == [1, 1]


def test_transfers_on_disjoint_ports_do_not_wait():
    """0 -> 1 goes from device 0 to 1, 2 -> 3 from device 1 to 0: full duplex (one send and one
    receive port per device), so both run at once."""
    p = problem_of([[1, SLOW], [SLOW, 1], [SLOW, 1], [1, SLOW]], [(0, 1, 3.0), (2, 3, 3.0)], beta=1.0)
    s = schedule_heft(p, links="ports")
    assert s.device.tolist() == [0, 1, 1, 0]
    assert s.transfer_start_s.tolist() == [1, 1] and s.stats["port_wait_s"] == 0
    check_port_schedule(p, s)


def test_contention_changes_the_choice():
    """Two producers on devices 0 and 1 feed a consumer that runs 1 s faster on device 2: without
    ports device 2 wins (start 4, finish 5); with ports its second transfer waits 3 s there, and
    running on device 0 (one transfer, finish 1 + 3 + 2 = 6) beats device 2 (finish 8)."""
    p = problem_of([[1, SLOW, SLOW], [SLOW, 1, SLOW], [2, SLOW, 1]], [(0, 2, 3.0), (1, 2, 3.0)], beta=1.0)
    assert schedule_heft(p).device.tolist() == [0, 1, 2]
    assert replay_ports(p, *_placement(schedule_heft(p))).makespan_s == 8
    s = schedule_heft(p, links="ports")
    assert s.device.tolist() == [0, 1, 0] and s.makespan_s == 6
    assert engine_run(p, s.device, s.order)[1].max() == 6


def _placement(schedule):
    return schedule.device, schedule.order


def test_an_inversion_is_counted_and_the_simulator_differs():
    """1 and 2 both wait for 0's output on device 0 (tensors ready at the same time: FIFO by edge,
    0 -> 1 first); 2 has the longer tail, so HEFT places it first and books 0 -> 2 on device 0's
    send port first. 0 -> 1 then has to go behind it: an inversion. The simulator sends 0 -> 1
    first, as its ports are first come, first served."""
    exec_s = [[1, SLOW, SLOW], [SLOW, 1, SLOW], [SLOW, SLOW, 1], [SLOW, SLOW, 5]]
    p = problem_of(exec_s, [(0, 1, 3.0), (0, 2, 3.0), (2, 3, 0.0)], beta=1.0)
    s = schedule_heft(p, links="ports")
    assert s.device.tolist() == [0, 1, 2, 2]
    assert s.stats["port_inversions"] == 1
    assert s.transfer_start_s.tolist()[:2] == [4, 1]  # booked: 0 -> 2 first
    check_port_schedule(p, s)
    start = engine_run(p, s.device, s.order)[0]
    assert start.tolist() == [0, 4, 7, 8]  # simulated: 0 -> 1 first, 2 waits
    assert s.start_s.tolist() == [0, 7, 4, 5] and s.makespan_s == 10 < 13


# --- (c) the contention-free default is unchanged ------------------------------------------------

# makespans of the contention-free schedulers, recorded when links were added (that code reproduced
# bench-out/fddps_search_speed.json, written before, bit for bit: makespans and stats)
GOLDEN = {
    0: {"fddps": 19.645877724751294, "heft": 18.22364937601601, "fastt": 18.22364937601601},
    1: {"fddps": 12.706528978891733, "heft": 13.945219042277227, "fastt": 14.88024329374175},
    2: {"fddps": 10.555111061365558, "heft": 11.63899194484841, "fastt": 11.63899194484841},
}


@pytest.mark.parametrize("seed", sorted(GOLDEN))
def test_free_links_are_the_default_and_unchanged(seed):
    p = random_problem(300 + seed, 12, 3)
    for name, fn in (("fddps", schedule_fddps), ("heft", schedule_heft), ("fastt", schedule_fastt)):
        default, free = fn(p), fn(p, links="free")
        assert default.makespan_s == free.makespan_s == GOLDEN[seed][name]
        assert np.array_equal(default.start_s, free.start_s) and np.array_equal(default.device, free.device)
        assert default.transfer_start_s is None and default.transfer_order() is None
        assert "port_wait_s" not in default.stats and "port_inversions" not in default.stats
        again = replay(p, default.device, default.order)
        assert np.array_equal(again.start_s, default.start_s)
    assert schedule_mpdps(p).transfer_start_s is None


def test_bad_links_and_debug_check():
    p = random_problem(0, 6, 2)
    with pytest.raises(ValueError, match="links must be one of"):
        schedule_fddps(p, links="wires")
    with pytest.raises(ValueError, match="links must be one of"):
        schedule_heft(p, links="wires")
    with pytest.raises(ValueError, match="needs links='free'"):
        schedule_fddps(p, links="ports", debug_check=True)


# --- the planners --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet_tiny():
    cluster = load_cluster("fddps-8xp100")
    four = replace(cluster, name="fddps-4xp100", nodes=(replace(cluster.nodes[0], devices=cluster.nodes[0].devices[:4]),))
    built = zoo.build("resnet-tiny")
    return built.ref, replace(analytic_cost_model(measure.measure(built), four), operators=build_op_graph(built))


def _request(model, cm, **kw):
    return PlanRequest(costs=cm, model_name=model, cluster_name=cm.cluster.name, batch=8, **kw)


def test_fddps_ports_is_fddps_with_links_ports_and_the_earliest_finish_fallback(resnet_tiny):
    model, cm = resnet_tiny
    spec = planner("fddps-ports")
    assert spec.needs_operators and spec.options["links"].default == "ports" and "not the paper" in spec.summary
    for name in ("fddps", "fddps-nosplit", "heft", "fastt"):
        assert planner(name).options["links"].default == "free"
    # the paper's free placement (runnable=False): with backward kept on its forward's device the
    # two planners' placements coincide on this model (docs/runtime.md, operator placements)
    free = {"runnable": False}
    ours = make_plan(_request(model, cm, options=free), "fddps-ports")
    assert spec.options["fallback"].default == "earliest_finish"
    same = make_plan(_request(model, cm, options={"links": "ports", "fallback": "earliest_finish", **free}), "fddps")
    assert ours.operators == same.operators
    options = dict(ours.search.options)
    assert options["links"] == "ports" and options["port_inversions"] == 0 and len(ours.operators) > 1
    # no inversion: the schedule's own length is the contended simulation's iteration, exactly
    assert ours.prediction.iteration_s == pytest.approx(options["schedule_length_s"] + cm.overheads.step_s,
                                                        rel=1e-12, abs=1e-15)
    assert simulate_plan(ours, cm, contention=False).prediction.iteration_s <= ours.prediction.iteration_s
    paper = make_plan(_request(model, cm, options=free), "fddps")
    assert dict(paper.search.options)["links"] == "free"
    assert ours.prediction.iteration_s < paper.prediction.iteration_s  # contention-aware wins under contention
    with pytest.raises(FieldError, match="options.links"):
        make_plan(_request(model, cm, options={"links": "wires"}), "fddps")
    with pytest.raises(FieldError, match="options.fallback"):
        make_plan(_request(model, cm, options={"fallback": "random"}), "fddps-ports")
    lp = make_plan(_request(model, cm, options={"fallback": "lowest_priority"}), "fddps-ports")
    assert dict(lp.search.options)["fallback"] == "lowest_priority" and options["fallback"] == "earliest_finish"
    with pytest.raises(FieldError, match="has no such option"):
        make_plan(_request(model, cm, options={"links": "ports"}), "mpdps")
