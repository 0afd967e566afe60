"""What the distributed tests compare a run with: the model's parameters before any step (as every
rank and the reference materialise them), and the memory model's prediction of a plan on `local`."""

import torch


def initial_parameters(config) -> dict[str, torch.Tensor]:
    """Every parameter of config.model before training, by its name in the whole model."""
    from paraplan.runtime.rank.materialize import build_layers, materialize

    _, layers, names = build_layers(config.model, config.seed, dropout=False)
    modules = [m for _, _, m in layers]
    materialize(modules, names, config.seed, torch.device("cpu"))
    return {names.get(id(p)): p.detach().clone() for m in modules for p in m.parameters()}


def predicted_memory(plan) -> tuple:
    """costs/memory.py's breakdowns of `plan` on this machine's cores (one per pipeline rank)."""
    from paraplan.costs.memory import plan_memory
    from paraplan.workload import workload

    cm = workload(plan.model, "local", precision=plan.precision).costs
    capacities = {d: 2**34 for d in plan.devices}
    return plan_memory(plan, cm.model, capacities, cm.memory, device_kind="cpu-core")[1]
