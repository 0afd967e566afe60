"""Plans for the engines people already train with (issue 32): torchtitan, Megatron-LM, DeepSpeed.

`export(plan, to=...)` turns a plan into the engine's own configuration, or raises ExportRefused
naming, in one line, the feature the engine cannot express. `engine_problem(plan, engine, shape)`
says the same without building anything (`paraplan plan --engine` keeps only the plans an engine
can run). docs/engines.md has the table of what goes where and what is refused, and why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from paraplan.engines import deepspeed, megatron, torchtitan
from paraplan.engines.layout import ENGINE_NAMES, ENGINES, ExportRefused, engine_layout
from paraplan.engines.shape import ModelShape, model_shape
from paraplan.errors import UnknownNameError
from paraplan.plans.plan import Plan

FORMAT = "paraplan.export/1"


@dataclass(frozen=True)
class Exported:
    engine: str
    text: str  # the main file: torchtitan's arguments (one per line), Megatron's JSON, DeepSpeed's config
    suffix: str  # the main file's usual extension
    notes: tuple[str, ...]  # what runs differently in the engine than in the plan's prediction
    command: str  # how the engine is started with it (printed)
    schedule_csv: str = ""  # torchtitan: the plan's order of actions, for --parallelism.pipeline_parallel_schedule_csv


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise UnknownNameError("engine", name, list(ENGINES))
    return name


def engine_problem(plan: Plan, engine: str, shape: ModelShape) -> str | None:
    """Why `engine` cannot run `plan` (one line), or None."""
    try:
        layout = engine_layout(plan, shape.kinds)
    except ExportRefused as exc:
        return exc.feature
    if engine == "torchtitan":
        return torchtitan.refusal(layout, shape)
    if engine == "megatron":
        return megatron.refusal(layout, shape)
    return deepspeed.refusal(layout, shape, shape.params)


def export(plan: Plan, to: str, shape: ModelShape | None = None, schedule_csv_path: str = "schedule.csv",
           placement: tuple[int, int] | None = None) -> Exported:
    """The plan as `to`'s configuration. `shape`: the model's (built on meta from the plan's model
    when not given); `schedule_csv_path`: where torchtitan's arguments say the order of actions is;
    `placement`: (nodes, GPUs per node) the plan's devices take (Cluster.placement), written into
    the launch command (placeholders <N>, <G> without it)."""
    engine = check_engine(to)
    shape = shape or model_shape(plan.model)
    try:
        layout = engine_layout(plan, shape.kinds)
    except ExportRefused as exc:
        raise ExportRefused(engine, exc.feature) from None
    header = f"paraplan plan for {ENGINE_NAMES[engine]}: {plan.model} on {plan.cluster}, batch {plan.global_batch}"
    nodes, per_node = (str(x) for x in placement) if placement else ("<N>", "<G>")
    if engine == "torchtitan":
        args, rows, notes = torchtitan.overrides(layout, shape)
        csv = ""
        if rows:
            args.insert(args.index("--training.disable_cuda_graphs"),
                        f"--parallelism.pipeline_parallel_schedule_csv={schedule_csv_path}")
            csv = "\n".join(",".join(row) for row in rows) + "\n"
        # the registered config of the model's shape where torchtitan has one (its other settings are
        # overridden by the arguments); else the user picks or adds one
        config = torchtitan.registered_config(shape) or "<a llama3 config of this shape, e.g. llama3_8b>"
        module = f"--module llama3 --config {config}"
        launch = f"torchrun --nproc-per-node {per_node} --nnodes {nodes} -m torchtitan.train {module}"
        lines = [f"# {header}", f"# torchtitan {torchtitan.VERSION}: {launch} $(grep -v '^#' THIS_FILE)",
                 *[f"# note: {n}" for n in notes], *args]
        return Exported(engine, "\n".join(lines) + "\n", ".args", tuple(notes), f"{launch} " + " ".join(args), csv)
    if engine == "megatron":
        args, config, notes, env = megatron.arguments(layout, shape)
        doc = {"format": FORMAT, "engine": f"Megatron-LM ({megatron.VERSION})", "plan": header, "arguments": args,
               "transformer_config": config, "environment": env, "world_size": layout.world, "notes": notes}
        prefix = "".join(f"{k}={v} " for k, v in env.items())
        return Exported(engine, json.dumps(doc, indent=1) + "\n", ".json", tuple(notes),
                        f"{prefix}torchrun --nproc-per-node {per_node} --nnodes {nodes} pretrain_gpt.py " + " ".join(args))
    config, notes = deepspeed.config(layout, shape, shape.params)
    return Exported(engine, json.dumps(config, indent=1) + "\n", ".json", tuple(notes),
                    f"deepspeed --num_gpus {per_node} --num_nodes {nodes} train.py --deepspeed_config ds_config.json "
                    f"({layout.dp} data-parallel ranks of {layout.world})")


__all__ = ["ENGINES", "ExportRefused", "Exported", "check_engine", "engine_problem", "export", "model_shape"]
