"""One rank of a Bi-Partition plan: separate forward and backward ranges per worker, under 1F1B
(or GPipe), following the paper's task types (Bi-Partition §"Task Types"):

  1) forward and backward: layers in both of a worker's ranges run as in any pipeline stage;
  2) forward only: the worker computes the layer without keeping its activations, sends its output
     on, and after the iteration receives the layer's updated weights from the backward owner;
  3) backward only: the worker runs the layer's backward, updates its weights (it holds the
     gradients and the optimizer state) and sends them to the forward owner.

Where this differs from the paper, and why: the paper's forward owner sends the layer's saved
activations to the backward owner. PyTorch's autograd graph cannot cross processes, so the
backward owner rebuilds the graph by recomputing the layer's forward from the tensor that enters
it, as activation checkpointing does (plans/worker_roles.py says which tensor and from whom). What
crosses is one activation per micro-batch into a worker whose backward range starts before its
forward range, not the saved activations of every split layer; what it costs is one more forward
of each split layer on its backward owner. The planner and the simulator charge exactly this for
plans with `split_layers="recompute"` (planners/bipartition/planner.py `mode=runtime`, the default);
plans costed with the paper's idealised scheme (`mode=paper`) are refused before launch.

Weights stay consistent as the paper's scheme has them, with 1F1B's flush making it exact: within
an iteration every forward uses the weights of the previous step (the update happens once, after
the last backward), the backward owner updates, then sends the new values of every forward-only
layer to its forward owner, which copies them before the next iteration. So a run equals one
process. Dropout: every layer is run under a seed fixed by (seed, step, micro-batch, layer), so a
recomputed forward draws the masks of the original. Buffers (BatchNorm statistics) are restored
after a recomputation: the forward owner's forward is the one that counts.

Messages: blocking receives where the data is needed, non-blocking sends waited on at the end of
the step (gloo pairs them by tag), so the side activations add no wait that the pipeline's own
dependencies do not already imply: a backward of micro-batch m always follows every forward of m.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from paraplan.plans.worker_roles import WorkerRole, worker_roles
from paraplan.runtime.measure.memory_meter import note_checkpoint_input
from paraplan.runtime.rank.boundaries import boundary_shapes
from paraplan.runtime.rank.materialize import StageModule, materialize
from paraplan.runtime.rank.rank_base import RankSetup, RunConfig

# message tags: kind * TAG_STRIDE + micro-batch
FORWARD_TAG, GRAD_TAG, SIDE_TAG, WEIGHT_TAG = 1, 2, 3, 4
TAG_STRIDE = 1 << 16


def bipartition_refusal(plan, layers) -> str | None:
    """Why this Bi-Partition plan cannot run (one line), or None. `layers`: the model's layer list."""
    if plan.split_layers != "recompute":
        return ("planned with the paper's idealised cost (its forward owners send saved activations, which "
                "cannot cross processes in PyTorch): plan again with the option mode=runtime (the default)")
    if any(len(s.devices) != 1 for s in plan.stages):
        return "Bi-Partition workers are one device each"
    # a parameter shared by several layers must be updated by one worker
    owner: dict[int, tuple[int, str]] = {}
    for k, stage in enumerate(plan.stages):
        for i in stage.backward:
            name, _, module = layers[i]
            for path, p in module.named_parameters(remove_duplicate=False):
                first = owner.setdefault(id(p), (k, f"{name}.{path}"))
                if first[0] != k:
                    return (f"parameter {first[1]} is shared by layers whose backward runs on workers {first[0]} "
                            f"and {k}; tied weights across Bi-Partition workers are not supported")
    return None


def _rank_of(plan, worker: int) -> int:
    return plan.stages[worker].devices[0]


class _Layers:
    """The layers this rank holds, run under per-layer seeds (see the module docstring)."""

    def __init__(self, modules: dict[int, torch.nn.Module], seed: int, seeded: set[int]):
        self.modules, self.seed, self.seeded = modules, seed, seeded
        self.step = 0

    def run(self, x, start: int, stop: int, micro: int, grad: bool, recompute: bool = False):
        saved = None
        if recompute:
            saved = {(i, n): b.clone() for i in range(start, stop) for n, b in self.modules[i].named_buffers()}
        with torch.set_grad_enabled(grad):
            for i in range(start, stop):
                if i in self.seeded:
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed((self.seed * 1_000_003 + self.step * 10_007 + micro * 101 + i) % 2**63)
                        x = self.modules[i](x)
                else:
                    x = self.modules[i](x)
        if saved:
            for (i, n), value in saved.items():
                dict(self.modules[i].named_buffers())[n].copy_(value)
        return x


def _leaf(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return x.requires_grad_() if x.is_floating_point() else x


class BipartitionStep:
    """Runs one step's schedule on this worker: its forwards and backwards in the plan's order."""

    def __init__(self, config: RunConfig, role: WorkerRole, layers: _Layers, shapes, built, device, recorder):
        from paraplan.plans.schedules import ORDERS

        self.config, self.role, self.layers, self.shapes, self.built, self.device, self.recorder = \
            config, role, layers, shapes, built, device, recorder
        plan = config.plan
        self.plan, self.n = plan, plan.n_stages
        self.order = ORDERS[plan.schedule](self.n, plan.n_micro, role.index)
        self.last = role.index == self.n - 1

    def _recv(self, kind: int, micro: int, boundary: int, src_worker: int) -> torch.Tensor:
        shape, dtype = self.shapes[boundary]
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        t0 = time.time()
        dist.recv(buf, src=_rank_of(self.plan, src_worker), tag=kind * TAG_STRIDE + micro)
        self.recorder.add("comm", {FORWARD_TAG: "recv forward", GRAD_TAG: "recv backward",
                                   SIDE_TAG: "recv activation"}[kind], micro, t0, time.time())
        return buf

    def _send(self, t: torch.Tensor, kind: int, micro: int, dst_worker: int) -> None:
        self.works.append(dist.isend(t.detach().contiguous(), dst=_rank_of(self.plan, dst_worker),
                                     tag=kind * TAG_STRIDE + micro))

    def __call__(self, x, y, micro_losses: list) -> None:
        """x, y: the whole batch (every rank reads it: the first worker feeds it, a worker whose
        recomputation starts at layer 0 reads its input, the last computes the loss)."""
        plan = self.plan
        size = plan.global_batch // plan.n_micro
        self.works: list = []
        state: dict[int, dict] = {}
        for action in self.order:
            m = action.micro
            xs = x[m * size:(m + 1) * size]
            ys = None if y is None else y[m * size:(m + 1) * size]
            t0 = time.time()
            if action.computation == "F":
                state[m] = self._forward(m, xs)
                self.recorder.add("compute", "forward", m, t0, time.time())
            else:
                self._backward(m, state.pop(m), xs, ys, micro_losses)
                self.recorder.add("compute", "backward", m, t0, time.time())
        for w in self.works:
            w.wait()

    def _forward(self, m: int, xs) -> dict:
        role = self.role
        f0, f1 = role.forward
        h = xs.to(self.device) if role.index == 0 else self._recv(FORWARD_TAG, m, f0, role.index - 1)
        kept: dict = {}
        i = f0
        segments = []
        if role.graph is not None:
            c0, c1 = role.graph
            segments = [(f0, c0, False), (c0, c1, True), (c1, f1, False)]
        else:
            segments = [(f0, f1, False)]
        for start, stop, grad in segments:
            for j in range(start, stop):
                if grad and j == start:
                    h = _leaf(h)
                    kept["graph_in"] = h
                h = self.layers.run(h, j, j + 1, m, grad)
                i = j + 1
                for s, w in role.side_outputs:
                    if s == i:
                        self._send(h, SIDE_TAG, m, w)
            if grad:
                kept["graph_out"] = h
        if role.graph is None and role.before is not None and role.side_input is None and role.before[0] != 0:
            kept["own_out"] = h.detach()  # the start of this worker's recomputation
            note_checkpoint_input(kept["own_out"])
        if self.last:
            kept["out"] = h
        elif role.index + 1 < self.n:
            self._send(h, FORWARD_TAG, m, role.index + 1)
        return kept

    def _backward(self, m: int, kept: dict, xs, ys, micro_losses: list) -> None:
        role, plan = self.role, self.plan
        b0, b1 = role.backward
        grad_top = None
        if not self.last and b1 > 0:
            grad_top = self._recv(GRAD_TAG, m, b1, role.index + 1)

        def finish(top: torch.Tensor) -> None:
            if self.last:
                target = None if ys is None else ys.to(self.device)
                loss = self.built.loss(top, target) / plan.n_micro
                loss.backward()
                micro_losses.append(loss.detach())
            else:
                torch.autograd.backward(top, grad_top)

        g = grad_top
        if b0 == b1:  # an empty backward range relays the gradient (the last worker makes it from the loss)
            if self.last:
                top = _leaf(kept["out"])
                finish(top)
                g = top.grad
        elif role.graph is not None:
            top = kept["graph_out"]
            if role.after is not None:
                top = self.layers.run(top, *role.after, m, grad=True, recompute=True)
            finish(top)
            g = kept["graph_in"].grad
            if role.before is not None:
                start = self._recompute_input(m, kept, xs)
                a_out = self.layers.run(start, *role.before, m, grad=True, recompute=True)
                torch.autograd.backward(a_out, g)
                g = start.grad
        else:
            start = self._recompute_input(m, kept, xs)
            top = self.layers.run(start, *role.before, m, grad=True, recompute=True)
            finish(top)
            g = start.grad
        if role.index > 0 and b0 > 0:
            self._send(g, GRAD_TAG, m, role.index - 1)

    def _recompute_input(self, m: int, kept: dict, xs) -> torch.Tensor:
        b0 = self.role.backward[0]
        if b0 == 0:
            return xs.to(self.device)
        if self.role.side_input is not None:
            return _leaf(self._recv(SIDE_TAG, m, b0, self.role.side_input))
        return _leaf(kept["own_out"])


class WeightSync:
    """After the optimizer step: every forward-only layer's weights go from its backward owner
    (which updated them) to its forward owner (the paper's task types 2 and 3)."""

    def __init__(self, plan, roles, index: int, modules: dict[int, torch.nn.Module]):
        self.plan, self.index = plan, index
        backward_owner = {i: r.index for r in roles for i in range(*r.backward)}
        self.outgoing: dict[int, list] = {}  # forward owner -> my parameters it copies
        self.incoming: dict[int, list] = {}  # backward owner -> my copies it updates
        for r in roles:
            for i in r.forward_only:
                b = backward_owner[i]
                if b == index:
                    self.outgoing.setdefault(r.index, []).extend(modules[i].parameters())
                elif r.index == index:
                    self.incoming.setdefault(b, []).extend(modules[i].parameters())

    def __call__(self) -> None:
        works, bufs = [], []
        with torch.no_grad():
            for w, params in sorted(self.outgoing.items()):
                flat = torch.cat([p.detach().reshape(-1) for p in params])
                works.append(dist.isend(flat, dst=_rank_of(self.plan, w), tag=WEIGHT_TAG * TAG_STRIDE))
            for w, params in sorted(self.incoming.items()):
                flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
                works.append(dist.irecv(flat, src=_rank_of(self.plan, w), tag=WEIGHT_TAG * TAG_STRIDE))
                bufs.append((flat, params))
            for work in works:
                work.wait()
            for flat, params in bufs:
                offset = 0
                for p in params:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()


class _NoSync:
    def finish(self) -> None:
        pass


def bipartition_setup(config: RunConfig, rank: int, device, built, layers, names, recorder) -> RankSetup:
    plan = config.plan
    roles = worker_roles(plan)
    index = next(k for k, s in enumerate(plan.stages) if rank in s.devices)
    role = roles[index]
    held = {i: layers[i][2] for i in role.holds}
    shapes = boundary_shapes(built, layers, plan.global_batch // plan.n_micro)
    materialize([held[i] for i in sorted(held)], names, config.seed, device)
    # only layers that draw random numbers run under their own seed (fork_rng costs ~0.1 ms)
    run = _Layers(held, config.seed, seeded={i for i, m in held.items() if config.dropout and _random(m)})
    step = BipartitionStep(config, role, run, shapes, built, device, recorder)
    owned = {names.get(id(p)): p for i in range(*role.backward) for p in held[i].parameters()}
    module = StageModule([held[i] for i in sorted(held)])
    copies = tuple(p for i in role.forward_only for p in held[i].parameters())
    sync = WeightSync(plan, roles, index, held)

    def run_step(x, y, micro_losses):
        run.step = recorder.step
        step(x, y, micro_losses)

    return RankSetup(module=module, stage_index=index, position=0, pp_group=dist.group.WORLD, named=owned,
                     sync=_NoSync(), loss=None, local_batch=lambda inputs, targets: (inputs, targets),
                     loss_weight=1.0, full_state=lambda: {n: p.detach().clone() for n, p in owned.items()},
                     writes=True, run_step=run_step, after_step=sync, copies=copies)


def _random(layer) -> bool:
    """Whether a layer draws random numbers in training (dropout as a module, or as a float
    probability applied functionally, which runtime/rank/materialize.without_dropout also zeroes)."""
    for m in layer.modules():
        if isinstance(m, torch.nn.Dropout) and m.p > 0:
            return True
        if any(isinstance(v, float) and v > 0 and ("dropout" in k or "pdrop" in k) for k, v in vars(m).items()):
            return True
    return False

