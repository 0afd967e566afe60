"""One rank of a plan with per-layer strategies (Galvatron-BMW): its stage built under
runtime/layers/parallelize.py's apply steps, what it feeds the schedule, how its loss counts.

Every device of a stage takes the whole global batch (token ids or images: small) and the stage's
first layer cuts its own slice; the last layer's devices each compute the loss of their slice.
"""

from __future__ import annotations

import torch

from paraplan.costs.slice_gather import data_rank
from paraplan.runtime.layers.grad_sync import DataParallelSync
from paraplan.runtime.layers.meshes import Meshes
from paraplan.runtime.layers.parallelize import parallelize_stage
from paraplan.runtime.layers.regroup import data_rows
from paraplan.runtime.rank.rank_base import RankSetup, RunConfig, full_value, make_groups, stage_and_position


def hybrid_setup(config: RunConfig, rank: int, device, built, layers, names, recorder) -> RankSetup:
    plan = config.plan
    stage_index, position = stage_and_position(plan, rank)
    # collective creation, the same order on every rank: pipelines, stage groups, then the meshes
    pp_groups, stage_groups = make_groups(plan)
    meshes = Meshes(plan, device.type)
    # every stage this rank runs: one, or several chunks under an interleaved schedule (the loop
    # mapping: the chunks of one rank are stages r, r + p, ...; runtime/kinds.py refuses the V-shaped and
    # zero-bubble kinds with per-layer strategies), built one after another in stage order
    held = [s for s, st in enumerate(plan.stages) if rank in st.devices]
    chunks, owns, all_paths, strategies, dp_params, sequence_params = [], [], [], [], [], []
    named: dict[str, torch.nn.Parameter] = {}
    for s in held:
        stage = plan.stages[s]
        own = [m for _, _, m in layers[stage.layers.start:stage.layers.stop]]  # still on meta
        # each parameter's name in the whole model, by its path in its layer (paths survive TP and FSDP2)
        paths = [{path: names[id(p)] for path, p in layer.named_parameters(remove_duplicate=False)} for layer in own]
        hybrid = parallelize_stage(plan, s, position, own, meshes, stage_groups[s], names, config.seed, device)
        for layer, by_path in zip(own, paths, strict=True):
            for path, p in layer.named_parameters(remove_duplicate=False):
                named.setdefault(by_path[path], p)
        chunks.append((s, hybrid.module))
        owns += own
        all_paths += paths
        strategies += list(hybrid.strategies)
        dp_params += hybrid.dp_params
        sequence_params += hybrid.sequence_params
        last = hybrid.last  # the layout of the last held stage's output: the model's, where the loss is
    slices = last.data_degree
    representative = all(data_rank(last, q) != data_rank(last, position) for q in range(position))

    def loss(out, target):
        if target is not None:
            target = target[data_rows(last, position, target.shape[0])]
        # the slices' losses add up to the micro-batch's: every data-parallel reduction is a sum
        return built.loss(out, target) / (plan.n_micro * slices)

    def full_state() -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for layer, st, by_path in zip(owns, strategies, all_paths, strict=True):
            if st.tp > 1:
                from paraplan.runtime.layers.tp_apply import full_parameters
            values = full_parameters(layer) if st.tp > 1 else {
                path: full_value(p.detach()) for path, p in layer.named_parameters(remove_duplicate=False)}
            for path, value in values.items():
                state.setdefault(by_path[path], value.detach().clone())
        return state

    sync = DataParallelSync(dp_params, recorder, sequence_params)
    module = chunks[0][1] if len(chunks) == 1 else torch.nn.ModuleList([m for _, m in chunks])
    return RankSetup(module=module, stage_index=stage_index, position=position,
                     pp_group=pp_groups[position], named=named, sync=sync,
                     optimizer_params=sync.optimizer_params if sync.zero else None,
                     after_step=sync.gather if sync.zero else None, extra_grad_bytes=sync.held_grad_bytes,
                     loss=loss, local_batch=lambda inputs, targets: (inputs, targets),
                     loss_weight=1.0 if representative else 0.0, full_state=full_state, writes=position == 0,
                     chunks=tuple(chunks) if len(chunks) > 1 else ())
