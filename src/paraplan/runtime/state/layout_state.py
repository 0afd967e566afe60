"""A training state that belongs to the model, not to the plan (issue 32, item 4: re-plan a run in
progress): every parameter and its optimizer state keyed by the parameter's name in the whole
model, saved and loaded with torch.distributed.checkpoint (DCP).

Each rank offers what it holds under the whole model's names: a pipeline stage its layers'
parameters (plain tensors; the replicas of a stage offer the same keys, which DCP's planner writes
once), a stage with per-layer strategies its DTensors (FSDP2's shards, tensor parallelism's
shards and replicas), whose global shape and placement DCP records. Loading into another plan asks
for the same keys in the new layout (other stages, other DTensor placements) and DCP reads the
pieces each rank needs: the re-sharding is DCP's, not ours. The optimizer's state (Adam's
moments and step count) is keyed "optim/<name>/<key>" and follows its parameter's layout.

Kept outside the DCP files (in the manifest, runtime/state/checkpoints.py): the step, the losses so far,
fp16's loss scale. The data position is the step (every plan draws step s's global batch from
(seed, s): runtime/rank/data.py), and the random state of step s is a function of (seed, stage, s)
(stage_loop.step_seed), so a run resumed under another plan continues as that plan's own
uninterrupted run would.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystem

MODEL, OPTIM = "model/", "optim/"


def permuted(module) -> dict[int, tuple[torch.Tensor, int]]:
    """id(parameter) -> (column order, dim) for the parameters tensor parallelism stores with their
    columns permuted (GPT-2's fused QKV: runtime/layers/tensor_parallel.py's `_tp_column_order`). Their
    DTensor's global tensor is not the model's, and a rank's shard is not one block of the model's
    columns: such a parameter is saved whole, in the model's order, and sharded again on load."""
    out = {}
    for m in module.modules():
        order = getattr(m, "_tp_column_order", None)
        if order is not None:
            out[id(m.weight)] = (order, 1)
            if getattr(m, "bias", None) is not None:
                out[id(m.bias)] = (order, 0)
    return out


def state_dict(named: dict, optim, module=None, zero=()) -> dict:
    """This rank's parameters and optimizer state under the whole model's names (collective over a
    tensor-parallel mesh for its permuted parameters, gathered whole; over each ZeRO-1/2 group for
    its parameters' state, runtime/state/zero_state.py)."""
    from paraplan.runtime.state import zero_state

    orders = permuted(module) if module is not None else {}
    sharded = zero_state.gathered(zero, optim) if zero else {}
    out = {}
    for name, param in named.items():
        values = {MODEL + name: param.detach()}
        for key, value in (optim.state.get(param) or sharded.get(id(param), {})).items():
            if isinstance(value, torch.Tensor):
                values[f"{OPTIM}{name}/{key}"] = value
        if id(param) in orders:
            order, dim = orders[id(param)]
            values = {k: _unpermuted(v, order, dim) if v.dim() else v for k, v in values.items()}
        out.update(values)
    return out


def _unpermuted(t: torch.Tensor, order: torch.Tensor, dim: int) -> torch.Tensor:
    whole = t.full_tensor() if hasattr(t, "full_tensor") else t
    return whole.detach().index_select(dim, torch.argsort(order))


def init_optimizer_state(optim) -> None:
    """Give every parameter its optimizer state (zeros) so that DCP can load into it: one step with a
    learning rate of 0 on zero gradients (what torch.distributed.checkpoint.state_dict does for the
    same purpose), the gradients and learning rates put back."""
    lrs = [group["lr"] for group in optim.param_groups]
    for group in optim.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optim.step()
    for group, lr in zip(optim.param_groups, lrs, strict=True):
        group["lr"] = lr
        for p in group["params"]:
            p.grad = None


def save(named: dict, optim, directory: str, module=None, zero=()) -> None:
    """Collective over every rank: DCP writes this plan's state into `directory`. A write that met
    a full disk raises that OSError (DCP's files go through torch.save's writer, which reports a
    failed write as RuntimeError("... unexpected pos ...") and loses the errno a person needs)."""
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(directory, sync_files=True)
    writer.fs = _RecordingFileSystem()
    try:
        dcp.save(state_dict(named, optim, module, zero), storage_writer=writer)
    except BaseException as exc:
        if writer.fs.errors:
            raise writer.fs.errors[0] from exc
        raise


class _RecordingFileSystem(FileSystem):
    """DCP's file system, keeping the OSError any write of its streams met."""

    def __init__(self):
        super().__init__()
        self.errors: list[OSError] = []

    @contextmanager
    def create_stream(self, path, mode):
        with super().create_stream(path, mode) as stream:
            yield _Recorded(stream, self.errors) if "w" in mode else stream


class _Recorded:
    def __init__(self, stream, errors: list):
        self._stream, self._errors = stream, errors

    def write(self, data):
        try:
            return self._stream.write(data)
        except OSError as exc:
            self._errors.append(exc)
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def load(named: dict, optim, directory: str, module=None, zero=()) -> None:
    """Collective over every rank: this plan's parameters and optimizer state read from a state
    saved under any plan of the same model (DCP re-shards). DCP loads in place into the tensors it
    is given: the parameters (detached views of their storage) and the optimizer's states, except
    the permuted ones, loaded whole and sharded here."""
    import torch.distributed.checkpoint as dcp

    from paraplan.runtime.state import zero_state

    init_optimizer_state(optim)
    orders = permuted(module) if module is not None else {}
    sharded = zero_state.targets(zero, optim) if zero else {}  # ZeRO-1/2's whole states, scattered below
    targets = {}  # key -> the tensor (a parameter or an optimizer state) the loaded value belongs in
    for name, param in named.items():
        targets[MODEL + name] = (param, id(param))
        for key, value in (optim.state.get(param) or sharded.get(id(param), {})).items():
            if isinstance(value, torch.Tensor):
                targets[f"{OPTIM}{name}/{key}"] = (value, id(param))
    # a parameter that had no optimizer state when the checkpoint was written (it never had a
    # gradient: fp16's skipped first steps, an unused layer) has no optim/ keys: its state is
    # dropped again, as it was; a parameter missing from the checkpoint is another model's
    reader = dcp.FileSystemReader(directory)
    saved = set(reader.read_metadata().state_dict_metadata)
    missing = [k for k in targets if k.startswith(MODEL) and k not in saved]
    if missing:
        raise ValueError(f"the checkpoint has no {missing[0].removeprefix(MODEL)!r}: written for another model")
    absent = {k for k in targets if k not in saved}
    by_id = {id(p): p for p in named.values()}
    for key in absent:
        optim.state.pop(by_id[targets[key][1]], None)
    dropped = {targets[k][1] for k in absent}
    targets = {k: v for k, v in targets.items() if k not in absent}
    wanted = {k: (torch.empty(t.shape, dtype=t.dtype) if i in orders and t.dim() else
                  (t.detach() if isinstance(t, torch.nn.Parameter) else t)) for k, (t, i) in targets.items()}
    # one process without a group: the single-process reference continuing from a checkpoint
    dcp.load(wanted, storage_reader=reader, no_dist=not dist.is_initialized())
    with torch.no_grad():
        for key, (target, pid) in targets.items():
            if pid in orders and target.dim():
                order, dim = orders[pid]
                _local(target).copy_(_local(_sharded_like(wanted[key].index_select(dim, order), target)))
            elif _local(wanted[key]).data_ptr() != _local(target).data_ptr():
                _local(target).copy_(_local(wanted[key]))
    if zero:
        zero_state.scatter(zero, optim, sharded, dropped)
    if dist.is_initialized():
        dist.barrier()


def _sharded_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` (on every rank) placed as `like` is, without communication."""
    if not hasattr(like, "device_mesh"):
        return whole
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t
