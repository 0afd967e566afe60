"""A plan as torchtitan 0.3.0's command-line overrides (`--section.key value`).

torchtitan 0.3.0 takes a registered config (`--module llama3 --config llama3_8b`, a function in
`torchtitan/models/llama3/config_registry.py`) and overrides on top of it; the job TOML of earlier
versions is gone. The overrides here set every parallel setting of the plan; the model's config is
left to the user (paraplan names a shape, not a torchtitan registry entry). Keys and values as
torchtitan 0.3.0's `config/configs.py` defines them:

- data parallelism: `parallelism.data_parallel_replicate_degree` (replicas) and
  `parallelism.data_parallel_shard_degree` (FSDP2: parameters, gradients and optimizer states
  sharded, ZeRO-3). torchtitan has no optimizer-only sharding: ZeRO-1 and ZeRO-2 over dp replicas
  run as FSDP2 without resharding after the forward (`fsdp_reshard_after_forward never`: the
  parameters stay gathered from forward to backward, gradients and optimizer states sharded), which
  is ZeRO-2's memory and traffic (Megatron-LM's `--torch-fsdp2-no-reshard-after-forward` says the
  same: "Set to enable FSDP ZeRO-2"); ZeRO-3 (sdp) reshards always;
- tensor parallelism with `parallelism.enable_sequence_parallel` (on by default in 0.3.0);
- the pipeline: degree, schedule class (torch.distributed.pipelining's names), micro-batch size,
  and the plan's own cut as `parallelism.module_fqns_per_model_part` (llama3's modules:
  tok_embeddings, layers.<i>, norm, lm_head; a name that does not exist is dropped silently by
  torchtitan, so `output` must not be used), and a plan's own per-rank order of actions as
  `parallelism.pipeline_parallel_schedule_csv` (row = pipeline rank, cell = `<stage><F|B|I|W><micro>`);
- `parallelism.context_parallel_degree`;
- `parallelism.expert_parallel_degree` (a mixture of experts' ep), under 0.3.0's rule dp_shard x cp x
  tp = efsdp x ep: EP borrows FSDP, CP and TP ranks, never plain replicas; 0.3.0 has no expert
  tensor parallelism (etp refused); DeepEP's dispatcher is a model argument in 0.3.0
  (`moe_comm_backend = "deepep"`), named in a note;
- activation checkpointing as tyro's subcommand `activation_checkpoint:{none,selective,full}`
  (torchtitan's selective is per operator: it saves the expensive kernels and every other matmul,
  not Korthikanti et al.'s attention core: its memory differs from paraplan's prediction, noted);
- `training.mixed_precision_param` (bfloat16 / float32); fp16 is refused (torchtitan has none);
- fp8: bf16 (`training.mixed_precision_param=bfloat16`) with the linears swapped by a converter, which
  0.3.0 does not take on its command line: `Trainer.Config.model_spec` is `tyro.conf.Suppress`ed and
  converters are `model_registry(flavor, converters=[...])`'s argument in a config function
  (config_registry.py's llama3_405b: `Float8LinearConverter.Config(filter_fqns=["lm_head"])`). The
  converter is named in a note (`fp8_converter`): rowwise is components/quantization/float8.py's
  `Float8LinearConverter` with `recipe_name="rowwise"` and `filter_fqns=["lm_head"]` (llama3's output
  projection, bf16 as priced); mxfp8 is mx.py's `MXFP8LinearConverter` with `fqns=["layers"]` (the
  blocks' linears only: the head bf16), which refuses anything before Blackwell (SM100). 0.3.0's
  Float8 converter runs `recipe_name` rowwise or rowwise_with_gw_hp only: tensorwise (with FSDP's FP8
  all-gather, in earlier torchtitan), delayed and blockwise are refused;
- `training.local_batch_size` (per data-parallel rank per step) and `training.global_batch_size`
  (gradient accumulation follows: global / (local x data-parallel ranks));
- `training.disable_cuda_graphs` with a pipeline (torchtitan refuses pipelines with CUDA graphs);
- `compile.no-enable` and `compile.no-enable_async_tensor_parallel`: eager, as the prediction prices it
  (torch.compile and AsyncTP not priced; llama3_405b turns both on, and CompileConfig refuses AsyncTP
  without compile).
"""

from __future__ import annotations

from paraplan.engines.layout import EngineLayout, ExportRefused
from paraplan.engines.shape import ModelShape
from paraplan.plans.plan import Recompute
from paraplan.plans.schedules import Schedule, stage_ranks
from paraplan.precision import Precision, compute_precision

ENGINE = "torchtitan"
VERSION = "0.3.0"
SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED_1F1B: "Interleaved1F1B",
             Schedule.LOOPED_BFS: "LoopedBFS", Schedule.INTERLEAVED_ZB: "InterleavedZeroBubble",
             Schedule.ZBV: "ZBVZeroBubble", Schedule.DUALPIPE_V: "DualPipeV"}


# torchtitan 0.3.0's registered Llama 3 configs (torchtitan/models/llama3/config_registry.py, whose
# model flavors are llama3/__init__.py's _8b, _70b, _405b): (blocks, dim, heads, kv heads, FFN,
# vocabulary, rotary base), all untied; tests/engines checks the table against the installed registry
LLAMA3_CONFIGS = {"llama3_8b": (32, 4096, 32, 8, 14336, 128256, 500000.0),
                  "llama3_70b": (80, 8192, 64, 8, 28672, 128256, 500000.0),
                  "llama3_405b": (126, 16384, 128, 8, 53248, 128256, 500000.0)}


# an fp8 plan's recipe that torchtitan 0.3.0 has no converter for: why, in one line each
FP8_REFUSALS = {
    "tensorwise": (f"the fp8 recipe tensorwise (torchtitan {VERSION}'s Float8 converter runs rowwise and "
                   "rowwise_with_gw_hp only: tensorwise scaling, with FSDP's FP8 all-gather, is gone)"),
    "delayed": (f"the fp8 recipe delayed (Transformer Engine's delayed scaling: torchtitan {VERSION}'s Float8 "
                "converter runs rowwise and rowwise_with_gw_hp only)"),
    "blockwise": (f"the fp8 recipe blockwise (torchtitan {VERSION}'s Float8 converter runs rowwise and "
                  "rowwise_with_gw_hp only; Megatron-LM runs blockwise)"),
}


def fp8_converter(layout: EngineLayout) -> tuple[str, dict] | None:
    """The converter an fp8 plan trains with (a class of torchtitan.components.quantization, its
    Config's keyword arguments), the output head left in bf16 as priced; None for another precision."""
    if layout.precision != Precision.FP8:
        return None
    if layout.fp8_recipe == "rowwise":
        return "Float8LinearConverter", {"recipe_name": "rowwise", "filter_fqns": ["lm_head"]}
    return "MXFP8LinearConverter", {"fqns": ["layers"]}


def _fp8_notes(layout: EngineLayout, shape: ModelShape) -> list[str]:
    """How the launch gets the plan's converter (none on the command line), or that it must not."""
    config = registered_config(shape)
    if layout.precision != Precision.FP8:
        return [f"torchtitan's llama3_405b config swaps the linears for Float8 rowwise (its converter): this "
                f"{layout.precision.value} plan wants a 405B config without it"] if config == "llama3_405b" else []
    name, kwargs = fp8_converter(layout)
    if config == "llama3_405b" and layout.fp8_recipe == "rowwise":
        return ["fp8 rowwise: torchtitan's llama3_405b config carries the plan's converter "
                "(Float8LinearConverter.Config(filter_fqns=[\"lm_head\"]), recipe rowwise)"]
    arguments = ", ".join(f"{k}={_python(v)}" for k, v in kwargs.items())
    flavor = _python(config.split("_")[1].upper()) if config else "<flavor>"
    note = (f"fp8 {layout.fp8_recipe}: torchtitan {VERSION} takes converters from the config function, not the "
            f"command line: launch a config whose model_spec is model_registry({flavor}, "
            f"converters=[{name}.Config({arguments})])" + (f" in place of {config}" if config else ""))
    if layout.fp8_recipe == "mxfp8":
        note += "; MXFP8 runs on Blackwell only (the converter refuses below SM100), and llama3_8b_mxfp8 converts lm_head too"
    return [note + "; torchao needed"]


def _python(value) -> str:
    """A string or a list of strings as Python source with double quotes (as the notes show them)."""
    if isinstance(value, list):
        return "[" + ", ".join(_python(v) for v in value) + "]"
    return '"' + str(value) + '"'


def registered_config(shape: ModelShape) -> str | None:
    """The torchtitan config function of the model's exact shape, or None."""
    key = (shape.layers, shape.hidden, shape.heads, shape.query_groups, shape.ffn, shape.vocab, shape.rope_theta)
    if shape.family != "llama" or shape.tied_embeddings:
        return None
    return next((name for name, dims in LLAMA3_CONFIGS.items() if dims == key), None)


def refusal(layout: EngineLayout, shape: ModelShape) -> str | None:
    """The first feature of the plan torchtitan cannot run, or None."""
    if not shape.decoder:  # its trainer builds its own model definitions only (torchtitan/models/)
        return (f"the model: torchtitan {VERSION} trains its own model definitions only (llama3, qwen3, deepseek_v3, "
                f"gpt_oss, ...: decoder-only language models), and {shape.name} ({shape.family}) is not one; "
                "export a GPT-2 or Llama-like model, or use --to deepspeed, which wraps your own module")
    if layout.pp > 1 and layout.schedule not in SCHEDULES:
        return f"the {layout.schedule} schedule (torchtitan runs {', '.join(SCHEDULES.values())})"
    if layout.pp > 1 and layout.schedule == Schedule.ONE_F_ONE_B and layout.n_micro < layout.pp:
        # torch's Schedule1F1B refuses it (torchtitan only warns, then builds that class)
        return f"1F1B with {layout.n_micro} micro-batches on {layout.pp} pipeline ranks (torch needs at least one per rank)"
    if layout.precision == Precision.FP16:
        return "fp16 mixed precision (torchtitan trains in bf16 or fp32)"
    if layout.precision == Precision.FP8 and layout.fp8_recipe in FP8_REFUSALS:
        return FP8_REFUSALS[layout.fp8_recipe]
    if layout.fp8_param_gather:
        return (f"an FP8 parameter all-gather (torchtitan {VERSION}'s Float8 converter gathers bf16: its FSDP FP8 "
                "all-gather went with the tensorwise recipe)")
    if layout.etp > 1:
        return f"expert tensor parallelism (ETP{layout.etp}: torchtitan {VERSION} has expert_parallel_degree only)"
    if layout.expert_overlap:
        return (f"Megatron-LM's all-to-all overlap (torchtitan {VERSION}'s trainer runs the all-to-alls in line; "
                "its graph_trainer's EP overlap is an experiment): plan without it for torchtitan")
    if layout.ep > 1:
        shard = layout.dp_replicate if layout.zero else layout.dp_shard  # ZeRO-1/2 export as FSDP (below)
        if (shard * layout.cp * layout.tp) % layout.ep:
            return (f"EP{layout.ep} over dp_shard {shard} x cp {layout.cp} x tp {layout.tp} (torchtitan's EP borrows FSDP, "
                    "CP and TP ranks, never plain data-parallel replicas: dp_shard x cp x tp = efsdp x ep)")
    if layout.zero and layout.dp_shard > 1:
        return f"ZeRO-{layout.zero} over the replicas of a sharded group (torchtitan shards with FSDP2 only)"
    if layout.pp > 1 and not layout.actions and tuple(layout.stage_ranks) != stage_ranks(layout.schedule, layout.pp,
                                                                                          layout.virtual):
        return "stages placed on pipeline ranks in an order of the plan's own without an order of actions"
    if shape.decoder and layout.tp > 1 and (shape.heads % layout.tp or shape.query_groups % layout.tp):
        return f"{shape.heads} heads ({shape.query_groups} key/value heads) over tensor parallelism {layout.tp}"
    # trainer.py checks it at start-up: the sequence split over the SP ranks and 2 x the CP ranks
    split = (layout.tp if layout.tp > 1 and layout.sequence_parallel else 1) * (2 * layout.cp if layout.cp > 1 else 1)
    if shape.seq_len and shape.seq_len % split:
        return f"sequence length {shape.seq_len} over {split} sequence shards (tp with SP x 2 cp)"
    return None


def overrides(layout: EngineLayout, shape: ModelShape) -> tuple[list[str], list[list[str]], list[str]]:
    """(the override arguments, the schedule CSV's rows or [], notes). Raises ExportRefused."""
    problem = refusal(layout, shape)
    if problem:
        raise ExportRefused(ENGINE, problem)
    notes = list(layout.notes)
    replicate, shard = layout.dp_replicate, layout.dp_shard
    reshard = "always" if shard > 1 else "default"
    if layout.zero:
        replicate, shard, reshard = 1, layout.dp_replicate, "never"
        notes.append(f"ZeRO-{layout.zero} runs as FSDP2 without resharding after the forward (ZeRO-2's memory and "
                     "traffic)" + (": the gradients are sharded too, less memory than the plan's ZeRO-1"
                                   if layout.zero == 1 else ""))
    args = [f"--parallelism.data_parallel_replicate_degree={replicate}",
            f"--parallelism.data_parallel_shard_degree={shard}",
            f"--parallelism.fsdp_reshard_after_forward={reshard}",
            f"--parallelism.tensor_parallel_degree={layout.tp}"]
    if layout.tp > 1 and not layout.sequence_parallel:
        args.append("--parallelism.no-enable_sequence_parallel")
    args.append(f"--parallelism.context_parallel_degree={layout.cp}")
    if layout.cp > 1 and shard == 1 and not layout.zero:
        # 0.3.0's FSDP mesh is dp_shard x cp (distributed/parallel_dims.py: "fsdp" = dp_shard * cp)
        notes.append(f"torchtitan shards FSDP over dp_shard x cp (1 x {layout.cp}), where the plan keeps the model "
                     "states whole on the cp ranks (its sdp 1): expect less memory than predicted")
    if layout.ep > 1:
        args.append(f"--parallelism.expert_parallel_degree={layout.ep}")
    if layout.expert_dispatcher == "deepep":  # a model argument in 0.3.0, not an override (plans/expert_dispatch.py)
        notes.append("the plan prices DeepEP's dispatcher: build the model with moe_comm_backend=\"deepep\" (torchtitan "
                     f"{VERSION}'s model_registry argument, as config_registry.py's qwen3_moe_deepep does)")
    args.append(f"--parallelism.pipeline_parallel_degree={layout.pp}")
    csv_rows: list[list[str]] = []
    if layout.pp > 1:
        args += [f"--parallelism.pipeline_parallel_schedule={SCHEDULES[layout.schedule]}",
                 f"--parallelism.pipeline_parallel_microbatch_size={layout.micro_batch}",
                 "--parallelism.module_fqns_per_model_part", *[",".join(part) for part in _fqns(layout, shape)],
                 "--training.disable_cuda_graphs"]
        if layout.actions:
            csv_rows = [[_csv_cell(action) for action in rank] for rank in layout.actions]
        if shape.family != "llama":
            notes.append(f"the module names per stage are llama3's (tok_embeddings, layers.<i>, norm, lm_head); "
                         f"{shape.name} is not a model torchtitan 0.3.0 builds: rename them for yours")
        local = layout.micro_batch * layout.n_micro  # every micro-batch in one step
    else:
        local = layout.micro_batch  # the micro-batches as gradient accumulation steps
    args += [f"--training.local_batch_size={local}", f"--training.global_batch_size={layout.global_batch}"]
    if shape.seq_len:
        args.append(f"--training.seq_len={shape.seq_len}")
    param = "bfloat16" if compute_precision(layout.precision) == Precision.BF16 else "float32"  # fp8: bf16
    args += [f"--training.mixed_precision_param={param}", "--training.mixed_precision_reduce=float32"]
    # eager, as the prediction prices it (costs/engine_profile.py: torch.compile and AsyncTP, which
    # only compile enables, are not priced): said, not left to a config file's default
    args += ["--compile.no-enable", "--compile.no-enable_async_tensor_parallel"]
    notes += _fp8_notes(layout, shape)
    if layout.precision == Precision.TF32:
        notes.append("tf32: torchtitan's float32 matmuls follow torch.backends.cuda.matmul.allow_tf32")
    if layout.recompute == Recompute.SELECTIVE:
        notes.append("torchtitan's selective activation checkpointing is per operator (it keeps the expensive kernels' "
                     "outputs and every other matmul's), not the attention core alone: its memory differs from the "
                     "prediction")
    args.append(f"activation_checkpoint:{layout.recompute.value}")  # a tyro subcommand: last
    return args, csv_rows, notes


def _fqns(layout: EngineLayout, shape: ModelShape) -> list[list[str]]:
    """The plan's cut as torchtitan's module names per model part (stage order)."""
    parts, block = [], 0
    for layers in layout.layers_per_stage:
        names = []
        for i in layers:
            kind = shape.kinds[i]
            if kind == "embedding":
                names.append("tok_embeddings")
            elif kind == "head":
                names += ["norm", "lm_head"]
            else:  # a block, or a layer of a model torchtitan does not build (noted): never dropped
                names.append(f"layers.{block}")
                block += 1
        parts.append(names)
    return parts


def _csv_cell(action: str) -> str:
    """A plan action "F<micro>.<stage>" as torch's "<stage>F<micro>"."""
    computation, rest = action[0], action[1:]
    micro, stage = rest.split(".")
    return f"{stage}{computation}{micro}"
