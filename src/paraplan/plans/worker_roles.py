"""What each worker of a Bi-Partition plan does with the layers it holds, when a layer's forward
and backward run on different workers and the backward owner rebuilds the layer's autograd graph
by recomputing its forward (runtime/bipartition/bipartition_rank.py). Pure: the runtime, the simulator
(simulator/plan_work.py) and the memory model (costs/memory.py) read the same roles.

Worker w runs the forward of F = [f0, f1) and the backward of B = [b0, b1) (Bi-Partition §3;
either may be empty). In PyTorch the autograd graph cannot cross processes, so:
  - graph = F ∩ B = [c0, c1): w runs these forwards with autograd on and keeps their graph for
    its own backward, as any pipeline stage does;
  - the rest of F runs without a graph (no saved activations: the paper's "forward only" task
    needs none) and its output goes to the next worker;
  - recomputed = B \\ F: layers whose backward w runs but whose forward ran elsewhere. w reruns their
    forward just before their backward (as activation checkpointing does), from the tensor that
    enters them: `before` = [b0, c0) from x_b0, the output of layer b0 - 1 received from the worker
    that computed it (its `side_outputs`), or the model's input when b0 = 0 (every rank can read the
    batch); `after` = [c1, b1) straight on top of the graph's output (c1 = f1 then, so that is
    w's own forward output). With no graph, all of B is rebuilt from x_b0, w's own forward output
    when b0 = f1.
So the only extra transfer is one activation per micro-batch into a worker whose backward starts
before its forward (not the saved activations of every split layer, as the paper's scheme sends),
and the extra compute is one forward of every recomputed layer, on its backward owner.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.plans.plan import Plan


@dataclass(frozen=True)
class WorkerRole:
    index: int
    forward: tuple[int, int]  # F = [f0, f1)
    backward: tuple[int, int]  # B = [b0, b1)
    graph: tuple[int, int] | None  # F ∩ B, run with autograd in the forward
    before: tuple[int, int] | None  # recomputed from x_b0, below the graph (or all of B, without a graph)
    after: tuple[int, int] | None  # recomputed on top of the graph's output
    side_input: int | None  # the worker that sends x_b0 for `before` (None: local or no need)
    side_outputs: tuple[tuple[int, int], ...]  # (boundary s, worker) this worker sends x_s to

    @property
    def recomputed(self) -> tuple[int, ...]:
        """Layers whose forward this worker reruns before their backward, each micro-batch."""
        out: list[int] = []
        for seg in (self.before, self.after):
            if seg is not None:
                out.extend(range(*seg))
        return tuple(out)

    @property
    def forward_only(self) -> tuple[int, ...]:
        """Layers whose forward runs here and backward elsewhere: a copy of the latest weights."""
        return tuple(i for i in range(*self.forward) if not self.backward[0] <= i < self.backward[1])

    @property
    def holds(self) -> tuple[int, ...]:
        return tuple(sorted(set(range(*self.forward)) | set(range(*self.backward))))


def _producer(plan: Plan, boundary: int) -> int:
    """The worker that computes x_boundary, the output of layer boundary - 1."""
    for k, stage in enumerate(plan.stages):
        if stage.layers.start < boundary <= stage.layers.stop:
            return k
    raise ValueError(f"no worker computes the output of layer {boundary - 1}")


def worker_roles(plan: Plan) -> tuple[WorkerRole, ...]:
    """One role per stage (worker) of a plan; for a plan without separate backward ranges every
    worker's graph is its whole range and nothing is recomputed."""
    partial = []
    for k, stage in enumerate(plan.stages):
        f0, f1 = stage.layers.start, stage.layers.stop
        b0, b1 = stage.backward.start, stage.backward.stop
        c0, c1 = max(f0, b0), min(f1, b1)
        graph = (c0, c1) if c0 < c1 else None
        before = after = None
        needs = None  # the boundary whose value starts `before`, when another worker must send it
        if graph is not None:
            if b0 < c0:
                before = (b0, c0)
                needs = b0
            if c1 < b1:
                after = (c1, b1)
        elif b0 < b1:
            before = (b0, b1)
            if b0 != f1:  # else: w's own forward output (or the input it relays)
                needs = b0
        if needs == 0:  # the model's input: every rank reads the batch itself
            needs = None
        partial.append((k, (f0, f1), (b0, b1), graph, before, after, needs))
    sends: dict[int, list[tuple[int, int]]] = {}
    sides = {}
    for k, *_, needs in partial:
        if needs is not None:
            producer = _producer(plan, needs)
            sides[k] = producer
            sends.setdefault(producer, []).append((needs, k))
    return tuple(WorkerRole(k, fr, br, graph, before, after, sides.get(k), tuple(sorted(sends.get(k, ()))))
                 for k, fr, br, graph, before, after, _ in partial)
