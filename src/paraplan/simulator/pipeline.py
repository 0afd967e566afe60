"""Pipeline schedules as task graphs: replicas x stages x micro-batches, plus gradient sync.

Input is plain numbers per stage (`StageWork`), so the builder is tested with hand-made values
(CSIMD eq. (6) on random instances) and fed by `simulator/plan_work.py` for real plans.

Gradient synchronisation across replicas (data parallelism), after the last backward:
  - "after-backward": each stage's all-reduce waits for the whole pipeline to flush (every
    backward of every stage on every replica), as a hand-written all-reduce after the step does;
  - "gropipe-delayed": GroPipe's group-based delayed asynchronous all-reduce: each stage starts
    its all-reduce as soon as its own last backward has ended on every replica;
  - "bucketed": DDP-style overlap: the stage's last backward is split into buckets (reverse layer
    order) and each bucket's all-reduce starts when that part of the backward has ended;
  - "none".
"async-1f1b" (PipeDream) runs without a flush: 1F1B over several iterations back to back, and the
iteration time is the steady-state spacing of iteration ends on the first stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.plans import schedules
from paraplan.plans.schedules import Action, Computation
from paraplan.simulator import limits
from paraplan.simulator.engine import TaskGraph, Timeline, simulate

ASYNC_ITERATIONS = 4  # iterations simulated back to back for async-1f1b; the first and last are ramps


@dataclass(frozen=True)
class StageWork:
    """One stage of one pipeline replica at the plan's micro-batch size."""

    device: int
    forward_s: float  # F_i^P in CSIMD
    backward_s: float  # B_i^P
    send_forward_s: float  # F_i^M: this stage's output to the next stage (0 for the last)
    send_backward_s: float  # B_{i-1}^M: the gradient of this stage's input to the previous stage (0 for the first)
    layers: tuple[int, int] = (0, 0)
    backward_layers: tuple[int, int] = (0, 0)
    # Bi-Partition: a layer's forward and backward on different stages. The saved activations go
    # from the forward owner to the backward owner with every micro-batch, and the updated weights
    # come back once the last backward is done (the paper's Section "Pipeline parallelism").
    activation_sends: tuple[tuple[int, float], ...] = ()  # (backward owner's stage, seconds per micro-batch)
    weight_sends: tuple[tuple[int, float], ...] = ()  # (forward owner's stage, seconds per iteration)
    # zero-bubble schedules split backward_s into the input gradient (I, backward_s - weight_grad_s),
    # which the stage before waits for, and the weights' gradients (W), which nothing waits for
    weight_grad_s: float = 0.0


@dataclass(frozen=True)
class SyncBucket:
    backward_fraction: float  # share of the stage's last backward after which this bucket is ready
    allreduce_s: float


@dataclass(frozen=True)
class StageSync:
    devices: tuple[int, ...]  # the data-parallel group of this stage
    buckets: tuple[SyncBucket, ...]


@dataclass(frozen=True)
class StageHop:
    """Stages of unequal width (plans/stage_widths.py): device `sender` of a stage sends device
    `receiver` of the next its rows of every micro-batch's activation, and gets their gradient back."""

    sender: int  # position in the stage
    receiver: int  # position in the next stage
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class PipelineWork:
    schedule: str  # a Schedule: gpipe | 1f1b | async-1f1b | the multi-chunk kinds (plans/schedules.py)
    n_micro: int
    replicas: tuple[tuple[StageWork, ...], ...]  # [replica][stage]
    grad_sync: str = "none"
    sync: tuple[StageSync, ...] = ()  # one per stage when grad_sync is not "none"
    n_devices: int = 0  # 0: 1 + the largest device id used
    # Blocking point-to-point with a rendezvous, as torch.distributed.pipelining runs on gloo: a
    # transfer starts only once the receiver has finished the action before the one that needs it
    # (that is when it posts its receive), and the sender waits for its send to complete before
    # its next action (the schedule waits on sends and receives posted together).
    rendezvous: bool = False
    # model chunks per pipeline rank: replicas[r] lists all n_ranks x virtual_stages stages, stage s on
    # the device of its rank (plans/schedules.py: stage_ranks)
    virtual_stages: int = 1
    # with rendezvous: each message's cost beyond its link where the sender waits for it
    # (RuntimeOverheads.exchange_s: torch's Schedule1F1B)
    exchange_s: float = 0.0
    # stages of unequal width (plans/stage_widths.py): [stage][position in the stage] in place of
    # `replicas` (then empty), and per boundary s -> s + 1 its hops (StageHop); the stages' send_*_s unused
    lanes: tuple[tuple[StageWork, ...], ...] = ()
    boundary_hops: tuple[tuple[StageHop, ...], ...] = ()


def _grid(work: PipelineWork) -> tuple[tuple[tuple[StageWork, ...], ...], tuple[tuple[StageHop, ...], ...]]:
    """(every stage's devices' work [stage][position], every boundary's hops): `lanes` as given, or
    from `replicas`, where replica r's stage s hands its micro-batch to replica r's stage s + 1."""
    if work.lanes:
        return work.lanes, work.boundary_hops
    n_stages = len(work.replicas[0])
    lanes = tuple(tuple(rep[s] for rep in work.replicas) for s in range(n_stages))
    hops = tuple(tuple(StageHop(r, r, rep[s].send_forward_s, rep[s + 1].send_backward_s)
                       for r, rep in enumerate(work.replicas)) for s in range(n_stages - 1))
    return lanes, hops


@dataclass(frozen=True)
class PipelineResult:
    timeline: Timeline
    iteration_s: float


def _orders(work: PipelineWork, n_stages: int) -> tuple[list[list[schedules.Action]], int]:
    """(each pipeline rank's order of actions, micro-batches simulated)."""
    n_micro = work.n_micro * (ASYNC_ITERATIONS if work.schedule == "async-1f1b" else 1)
    n_ranks = n_stages // work.virtual_stages
    return schedules.rank_orders(work.schedule, n_ranks, work.virtual_stages, n_micro), n_micro


def task_count(work: PipelineWork) -> int:
    """The tasks build_graph makes, in closed form (counted before anything is built)."""
    return _task_count(work, *_grid(work))


def _task_count(work: PipelineWork, lanes, hops) -> int:
    n_micro = work.n_micro * (ASYNC_ITERATIONS if work.schedule == "async-1f1b" else 1)
    count = sum(len(lanes[s]) * (len(sync.buckets) - 1) for s, sync in enumerate(work.sync)) \
        if work.grad_sync == "bucketed" else 0
    count += sum(len(s.buckets) for s in work.sync if len(s.devices) > 1)
    passes = 3 if work.schedule in schedules.SPLIT_BACKWARD else 2  # F and B, or F, I and W
    for s, stage in enumerate(lanes):
        for st in stage:
            count += n_micro * (passes + len(st.activation_sends)) + len(st.weight_sends)
        # the two transfers of each hop to the next stage (none on the same device)
        count += sum(2 * n_micro for h in (hops[s] if s < len(hops) else ())
                     if lanes[s + 1][h.receiver].device != stage[h.sender].device)
    return count


def _passes(graph: TaskGraph, work: PipelineWork, orders: list[list[Action]], lanes):
    """Every rank's compute tasks in its order (the engine runs a device's tasks in the order added):
    per (position in the stage, stage, micro-batch) the forward, where the backward starts and where its input
    gradient is ready, and where the weights' gradients are; DDP's bucket parts; each rank's tasks."""
    split_last = work.grad_sync == "bucketed"
    fwd: dict[tuple[int, int, int], int] = {}
    bwd_first: dict[tuple[int, int, int], int] = {}  # the backward (or its input half) of (replica, stage, micro)
    bwd_last: dict[tuple[int, int, int], int] = {}  # where the input gradient is ready (sent to the stage before)
    weights_done: dict[tuple[int, int, int], int] = {}  # where the weights' gradients are (B's end, or W)
    bucket_parts: dict[tuple[int, int], list[int]] = {}
    # the last pass that computes a stage's weight gradients: DDP's buckets are cut from it, the
    # gradient sync waits for it (micro-batch n - 1 in most orders; 0 in looped BFS's reversed ones)
    last_weights: dict[int, Action] = {}
    for order in orders:
        for action in order:
            if action.computation in (Computation.BACKWARD, Computation.BACKWARD_WEIGHT):
                last_weights[action.stage] = action
    actions: dict[tuple[int, int], list[int]] = {}
    # a rank's devices: its stages' (one width per rank); position-major, as replica-major before
    rank_width = [len(lanes[order[0].stage]) if order else 0 for order in orders]
    for r in range(max(rank_width)):
        for p in range(len(orders)):
            if r >= rank_width[p]:
                continue
            first_task = len(graph)
            for action in orders[p]:
                s, j = action.stage, action.micro
                st = lanes[s][r]
                key = (r, s, j)
                kind = action.computation
                if kind == Computation.FORWARD:
                    fwd[key] = graph.compute(st.device, st.forward_s, "forward", j, st.layers)
                elif kind == Computation.BACKWARD_INPUT:
                    bwd_first[key] = bwd_last[key] = graph.compute(
                        st.device, st.backward_s - st.weight_grad_s, "backward", j, st.backward_layers)
                elif split_last and work.sync and last_weights[s] == action:
                    # DDP: the stage's last weight-gradient pass in parts, one per bucket
                    seconds = st.weight_grad_s if kind == Computation.BACKWARD_WEIGHT else st.backward_s
                    parts, done = [], 0.0
                    for bucket in work.sync[s].buckets:
                        share = bucket.backward_fraction - done
                        done = bucket.backward_fraction
                        parts.append(graph.compute(st.device, seconds * share, "backward_part", j,
                                                   st.backward_layers))
                    weights_done[key] = parts[-1]
                    if kind == Computation.BACKWARD:
                        bwd_first[key], bwd_last[key] = parts[0], parts[-1]
                    bucket_parts[(r, s)] = parts
                elif kind == Computation.BACKWARD_WEIGHT:
                    weights_done[key] = graph.compute(st.device, st.weight_grad_s, "backward_weight", j,
                                                      st.backward_layers)
                else:
                    tid = graph.compute(st.device, st.backward_s, "backward", j, st.backward_layers)
                    bwd_first[key] = bwd_last[key] = weights_done[key] = tid
            actions[(r, p)] = list(range(first_task, len(graph)))
    return fwd, bwd_first, bwd_last, weights_done, bucket_parts, actions, last_weights


def build_graph(work: PipelineWork) -> tuple[TaskGraph, dict]:
    if work.schedule not in schedules.ORDERS and work.schedule not in schedules.MULTI_CHUNK:
        raise ValueError(f"unknown schedule {work.schedule!r}")
    lanes, hops = _grid(work)
    n_stages = len(lanes)
    # before anything is built (the orders included): a graph beyond the memory available is refused in one line
    what = (f"{work.n_micro:,} micro-batch{'es' if work.n_micro != 1 else ''} over {n_stages} "
            f"stage{'s' if n_stages != 1 else ''}"
            + (f" and {len(work.replicas)} replicas" if len(work.replicas) > 1 else ""))
    limits.check_task_count(_task_count(work, lanes, hops), what)
    orders, n_micro = _orders(work, n_stages)
    used = [s.device for stage in lanes for s in stage] + [d for s in work.sync for d in s.devices]
    graph = TaskGraph(max(work.n_devices, max(used) + 1))
    fwd, bwd_first, bwd_last, weights_done, bucket_parts, actions, last_weights = _passes(graph, work, orders, lanes)
    position = {t: (key, i) for key, ts in actions.items() for i, t in enumerate(ts)}

    def neighbour(task: int, step: int) -> int | None:
        key, i = position[task]
        j = i + step
        return actions[key][j] if 0 <= j < len(actions[key]) else None

    # torch's multi-stage runtime (_PipelineScheduleRuntime) posts its sends and waits for them only
    # at the end of the step, and ScheduleGPipe waits for its forward sends only after the last
    # forward and for its backward sends after the last backward (torch 2.13 schedules.py:
    # "Delay send waits"): there the sender does not wait for its send. Schedule1F1B batches a
    # send with the next receive and waits for both. (Priced as waiting before 2026-11-28: a
    # message's latency then sat on the GPipe sender's path, and make demo's 8-micro-batch even
    # split was predicted 68 ms where it ran in 47-49.)
    sender_waits = work.schedule not in schedules.MULTI_CHUNK and work.schedule != schedules.Schedule.GPIPE
    exchange = work.exchange_s if work.rendezvous and sender_waits else 0.0

    def link(sender_task: int, transfer: int, receiver_task: int) -> None:
        """Rendezvous: the transfer waits for the receiver's previous action; the sender's next
        action waits for the transfer (single-stage schedules)."""
        if not work.rendezvous:
            return
        before = neighbour(receiver_task, -1)
        if before is not None:
            graph.depend(transfer, before)
        after = neighbour(sender_task, +1)
        if after is not None and sender_waits:
            graph.depend(after, transfer)

    widest = max(len(stage) for stage in lanes)
    sent_by = [{} for _ in hops]  # [boundary][sender] -> its hops
    for s, boundary in enumerate(hops):
        for h in boundary:
            sent_by[s].setdefault(h.sender, []).append(h)
    for r in range(widest):  # position-major, as replica-major before: the engine breaks ties by order
        for s, stage in enumerate(lanes):
            if r >= len(stage):
                continue
            st = stage[r]
            for j in range(n_micro):
                graph.depend(bwd_first[(r, s, j)], fwd[(r, s, j)])
                if weights_done[(r, s, j)] != bwd_last[(r, s, j)]:
                    graph.depend(weights_done[(r, s, j)], bwd_last[(r, s, j)])
                for h in sent_by[s].get(r, ()) if s + 1 < n_stages else ():
                    q = h.receiver
                    nxt = lanes[s + 1][q]
                    if nxt.device == st.device:  # the V's turn: the next stage is on this rank, no transfer
                        graph.depend(fwd[(q, s + 1, j)], fwd[(r, s, j)])
                        graph.depend(bwd_first[(r, s, j)], bwd_last[(q, s + 1, j)])
                        continue
                    t = graph.transfer(st.device, nxt.device, h.forward_s + exchange, "send_forward", j, st.layers,
                                       deps=[fwd[(r, s, j)]])
                    graph.depend(fwd[(q, s + 1, j)], t)
                    link(fwd[(r, s, j)], t, fwd[(q, s + 1, j)])
                    t = graph.transfer(nxt.device, st.device, h.backward_s + exchange, "send_backward", j,
                                       nxt.backward_layers, deps=[bwd_last[(q, s + 1, j)]])
                    graph.depend(bwd_first[(r, s, j)], t)
                    link(bwd_last[(q, s + 1, j)], t, bwd_first[(r, s, j)])
    for r in range(widest):
        for s, stage in enumerate(lanes):
            if r >= len(stage):
                continue
            st = stage[r]
            for dest, seconds in st.activation_sends:
                for j in range(n_micro):
                    t = graph.transfer(st.device, lanes[dest][r].device, seconds, "send_activation", j, st.layers,
                                       deps=[fwd[(r, s, j)]])
                    graph.depend(bwd_first[(r, dest, j)], t)
            for dest, seconds in st.weight_sends:
                graph.transfer(st.device, lanes[dest][r].device, seconds, "send_weights", n_micro - 1,
                               st.backward_layers, deps=[bwd_last[(r, s, n_micro - 1)]])
    marks = {"last_backward": bwd_last, "n_micro": n_micro}
    if work.grad_sync != "none" and work.sync:
        _sync_tasks(graph, work, lanes, weights_done, bucket_parts, last_weights)
    return graph, marks


def _sync_tasks(graph: TaskGraph, work: PipelineWork, lanes, weights_done: dict, bucket_parts: dict,
                last_weights: dict) -> None:
    """Each stage's gradient all-reduce (its buckets), after what its grad_sync waits for."""
    n_stages, widest = len(lanes), max(len(stage) for stage in lanes)
    last = {s: a.micro for s, a in last_weights.items()}
    flush = [weights_done[(r, s, last[s])] for r in range(widest) for s in range(n_stages) if r < len(lanes[s])]
    for s, sync in enumerate(work.sync):
        if len(sync.devices) < 2:
            continue
        for b, bucket in enumerate(sync.buckets):
            if work.grad_sync == "after-backward":
                deps = flush
            elif work.grad_sync == "bucketed":
                deps = [bucket_parts[(r, s)][b] for r in range(len(lanes[s]))]
            else:  # gropipe-delayed
                deps = [weights_done[(r, s, last[s])] for r in range(len(lanes[s]))]
            graph.collective(sync.devices, bucket.allreduce_s, "allreduce", last[s], lanes[s][0].layers,
                             deps=deps)


def alike_replicas(work: PipelineWork) -> PipelineWork:
    """The work with one pipeline replica where every replica's stages take the same times (a data-
    parallel plan on devices and links alike): replicas share no resource but their stages' gradient
    syncs (the engine's devices each have their own streams and channels), which they all reach at
    the same instant, so replica 0's timeline is every replica's and the iteration the same. GroPipe
    at 16,384 H100s judges plans of up to 16,384 replicas; each one's timeline was the whole cost."""
    if len(work.replicas) < 2 or work.lanes:
        return work
    first = [replace(st, device=0) for st in work.replicas[0]]
    if any([replace(st, device=0) for st in replica] != first for replica in work.replicas[1:]):
        return work
    return replace(work, replicas=work.replicas[:1])


def run(work: PipelineWork, overlap_slowdown: float = 1.0) -> PipelineResult:
    graph, marks = build_graph(work)
    timeline = simulate(graph, overlap_slowdown)
    if work.schedule != "async-1f1b":
        return PipelineResult(timeline, timeline.makespan)
    # Steady state: spacing between the ends of iterations 2 and ASYNC_ITERATIONS-1 on stage 0.
    m = work.n_micro
    first = timeline.end[marks["last_backward"][(0, 0, 2 * m - 1)]]
    later = timeline.end[marks["last_backward"][(0, 0, (ASYNC_ITERATIONS - 1) * m - 1)]]
    return PipelineResult(timeline, float(later - first) / (ASYNC_ITERATIONS - 3))
