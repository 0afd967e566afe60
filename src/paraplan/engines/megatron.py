"""A plan as Megatron-LM's command-line arguments and megatron-core's `TransformerConfig` keyword
arguments (megatron-core 0.16.1; Megatron-LM's `megatron/training/arguments.py` at tag core_v0.16.1).

The megatron-core wheel has the configuration classes but not Megatron-LM's argument parser, so
both are exported: the arguments a user passes to `pretrain_gpt.py`, and the keyword arguments of
the `TransformerConfig` those arguments become (`core_transformer_config_from_args` copies every
field whose name matches an argument; the renamed ones are mapped in `FIELD_OF_ARGUMENT`).

What maps where (arguments.py and the config classes):
- `--tensor-model-parallel-size`, `--pipeline-model-parallel-size`, `--context-parallel-size`,
  `--sequence-parallel` (Megatron's sequence parallelism: the norms and dropouts split over the TP
  ranks, Korthikanti et al. 2022, the same as paraplan's);
- interleaved 1F1B: `--num-layers-per-virtual-pipeline-stage` (even cuts) or, for a cut of the
  plan's own, `--pipeline-model-parallel-layout` ("Et*3|t*4|...|t*2L": E the embedding, t a
  block, L the loss, `|` between stages in stage order, stage i on rank i mod p);
- `--micro-batch-size` (per data-parallel rank) and `--global-batch-size`: Megatron runs
  global / (micro x dp) micro-batches;
- recomputation: selective is `--recompute-granularity selective` (the attention core, Megatron's
  default `--recompute-modules core_attn`), full is `--recompute-granularity full
  --recompute-method uniform --recompute-num-layers 1` (every block's input kept);
- ZeRO-1 is `--use-distributed-optimizer` (optimizer states and fp32 master weights sharded over
  the data-parallel ranks, with context parallelism over dp x cp, as paraplan prices it); ZeRO-2
  and ZeRO-3 are Megatron FSDP's `--data-parallel-sharding-strategy optim_grads` /
  `optim_grads_params` (`megatron_fsdp.py`: "optim_grads ~ ZeRO-2"), which needs
  `--ckpt-format fsdp_dtensor`;
- `--bf16` / `--fp16`;
- fp8: `--bf16 --fp8-format=hybrid --fp8-recipe=R` (e4m3 forward, e5m2 gradients; R the plan's recipe:
  tensorwise, delayed, blockwise or mxfp8, Megatron's own names; rowwise has no Megatron recipe and is
  refused). Neither flag is written out in arguments.py: `_add_network_size_args` builds them from
  TransformerConfig's fields with `ArgumentGroupFactory(TransformerConfig)` (argument_utils.py), `fp8`
  under its `argparse_meta` name `--fp8-format` (e4m3, hybrid) and `fp8_recipe` as `--fp8-recipe`
  (tensorwise, delayed, mxfp8, blockwise, custom; default delayed); `core/fp8_utils.py`
  `get_fp8_recipe` turns them into Transformer Engine's recipes (Float8CurrentScaling,
  DelayedScaling, Float8BlockScaling, MXFP8BlockScaling). Transformer Engine's linears run FP8
  (`--transformer-impl transformer_engine`, Megatron's default); attention's core and the output
  layer (megatron-core's own ColumnParallelLinear) stay bf16, as priced;
- a mixture of experts (Mixtral, Qwen3-MoE): `--num-experts`, `--moe-router-topk`,
  `--moe-ffn-hidden-size`, `--moe-layer-freq` (its dense blocks), `--expert-model-parallel-size` and
  `--expert-tensor-parallel-size` (the plan's expert view; without one, etp = tp, Megatron's
  default folding, written out), `--overlap-moe-expert-parallel-comm` for a plan with the all-to-all
  overlap (plans/expert_overlap.py), `--moe-token-dispatcher-type alltoall` (the all-to-alls the
  prediction prices; `flex` with `--moe-flex-dispatcher-backend deepep` for a plan with DeepEP's
  dispatcher, plans/expert_dispatch.py), `--moe-grouped-gemm`, dropless (no capacity factor: every routed copy
  computed, as priced); Qwen3's `--qk-layernorm` and `--kv-channels`.
Megatron runs 1F1B (one chunk per rank) and interleaved 1F1B; GPipe, looped BFS, zero-bubble and
V-shaped schedules are refused, as is a plan's own order of actions.
"""

from __future__ import annotations

from paraplan.engines.layout import EngineLayout, ExportRefused
from paraplan.engines.shape import ModelShape
from paraplan.plans.plan import Recompute
from paraplan.plans.schedules import Schedule, stage_ranks
from paraplan.precision import Precision, compute_precision

ENGINE = "megatron"
VERSION = "megatron-core 0.16.1"
# arguments whose TransformerConfig field has another name (core_transformer_config_from_args)
FIELD_OF_ARGUMENT = {"--num-experts": "num_moe_experts",
                     "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
                     "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
                     "--num-layers-per-virtual-pipeline-stage": "virtual_pipeline_model_parallel_size",
                     "--swiglu": "gated_linear_unit", "--disable-bias-linear": "add_bias_linear",
                     "--group-query-attention": "num_query_groups", "--norm-epsilon": "layernorm_epsilon",
                     "--fp8-format": "fp8", "--fp8-param-gather": "fp8_param"}
# --fp8-recipe's choices (TransformerConfig.fp8_recipe's, less "custom": a quantizer factory of the user's)
FP8_RECIPES = ("tensorwise", "delayed", "blockwise", "mxfp8")


def refusal(layout: EngineLayout, shape: ModelShape) -> str | None:
    if not shape.decoder:
        return f"{shape.name} is not a decoder-only transformer (Megatron-LM's GPT model: GPT-2 or Llama-like)"
    if layout.precision == Precision.FP8 and layout.fp8_recipe not in FP8_RECIPES:
        return (f"the fp8 recipe {layout.fp8_recipe} (Megatron-LM's --fp8-recipe runs {', '.join(FP8_RECIPES)}; "
                "rowwise scaling is torchao's)")
    if layout.fp8_param_gather and not (layout.zero or layout.dp_shard > 1):
        # arguments.py: "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp"
        return "an FP8 parameter all-gather without sharded states (Megatron-LM's --fp8-param-gather needs the " \
               "distributed optimizer or FSDP)"
    if layout.pp > 1:
        if layout.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B):
            return f"the {layout.schedule} schedule (Megatron-LM runs 1F1B and interleaved 1F1B)"
        if layout.actions:
            return "a per-rank order of actions of the plan's own (Megatron-LM runs its own 1F1B order)"
        if tuple(layout.stage_ranks) != stage_ranks(layout.schedule, layout.pp, layout.virtual):
            return "stages placed on pipeline ranks in an order of the plan's own"
        if layout.virtual > 1 and (layout.n_micro < layout.pp or layout.n_micro % layout.pp):
            return (f"interleaved 1F1B with {layout.n_micro} micro-batches on {layout.pp} ranks (Megatron-LM needs a "
                    "multiple of the pipeline size)")
        for k, layers in enumerate(layout.layers_per_stage):
            # a stage of the embedding or the loss alone is Megatron's own layout ("Ettt|(tt|)*29,m|L",
            # pipeline_parallel_layer_layout.py; Llama 3's first chunk holds only the embedding)
            if layout.blocks_per_stage[k] == 0 and not {"embedding", "head"} & {shape.kinds[i] for i in layers}:
                return "a stage without transformer blocks, the embedding or the loss"
    if layout.pp > 1 and (layout.zero >= 2 or layout.dp_shard > 1):
        # arguments.py refuses torch FSDP2 with a pipeline; Megatron FSDP's own documentation
        # (docs/user-guide/features/megatron_fsdp.md) composes it with TP, CP and EP, not PP
        stage = 3 if layout.dp_shard > 1 else layout.zero
        return (f"ZeRO-{stage} (Megatron FSDP) with pipeline parallelism (documented with TP, CP and EP only; "
                "ZeRO-1, the distributed optimizer, is)")
    if layout.dp_shard > 1 and layout.dp_replicate > 1:
        return "hybrid sharding (sharded sdp ways, replicated dp ways)"
    if layout.zero and layout.dp_shard > 1:
        return f"ZeRO-{layout.zero} over the replicas of a sharded group"
    if layout.tp > 1 and (shape.heads % layout.tp or (shape.query_groups % layout.tp and layout.tp % shape.query_groups)):
        return f"{shape.heads} heads ({shape.query_groups} query groups) over tensor parallelism {layout.tp}"
    if shape.experts and layout.tp > 1 and not layout.sequence_parallel:
        return "a mixture of experts with tensor parallelism but no sequence parallelism (megatron-core requires it)"
    if shape.experts and (layout.experts_world % (layout.ep * layout.expert_tp) or shape.experts % layout.ep):
        return (f"EP{layout.ep} x ETP{layout.expert_tp} over {layout.experts_world} devices per pipeline rank and "
                f"{shape.experts} experts")
    if layout.cp > 1 and shape.seq_len % (2 * layout.cp):
        return f"sequence length {shape.seq_len} over context parallelism {layout.cp} (Megatron needs a multiple of 2 x cp)"
    return None


def arguments(layout: EngineLayout, shape: ModelShape) -> tuple[list[str], dict, list[str], dict]:
    """(Megatron-LM's arguments, TransformerConfig's keyword arguments with dtypes by name, notes,
    the environment the launch needs)."""
    problem = refusal(layout, shape)
    if problem:
        raise ExportRefused(ENGINE, problem)
    notes = list(layout.notes)
    compute = compute_precision(layout.precision)  # an fp8 plan: bf16 but for its FP8 linears
    dtype = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}.get(compute, "float32")
    args = [f"--tensor-model-parallel-size={layout.tp}", f"--pipeline-model-parallel-size={layout.pp}",
            f"--context-parallel-size={layout.cp}"]
    config = {"tensor_model_parallel_size": layout.tp, "pipeline_model_parallel_size": layout.pp,
              "context_parallel_size": layout.cp, "sequence_parallel": bool(layout.sequence_parallel and layout.tp > 1),
              "params_dtype": dtype}
    if config["sequence_parallel"]:
        args.append("--sequence-parallel")
    if layout.pp > 1:
        config["pipeline_dtype"] = dtype
        args += _cut(layout, shape, config)
    args += [f"--micro-batch-size={layout.micro_batch}", f"--global-batch-size={layout.global_batch}"]
    if layout.recompute == Recompute.SELECTIVE:
        args += ["--recompute-granularity=selective", "--recompute-modules", "core_attn"]
        config.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    elif layout.recompute == Recompute.FULL:
        args += ["--recompute-granularity=full", "--recompute-method=uniform", "--recompute-num-layers=1"]
        config.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    args += _sharding(layout)
    # the prediction overlaps the data-parallel gradient reduction with the backward and the
    # distributed optimizer's parameter all-gather with the next forward (Megatron: off by default)
    if layout.dp_replicate > 1 and layout.dp_shard == 1 and layout.zero < 2:
        args.append("--overlap-grad-reduce")
        if layout.zero == 1:
            args.append("--overlap-param-gather")
    if compute in (Precision.BF16, Precision.FP16):
        args.append(f"--{compute.value}")
        config[compute.value] = True
    if layout.precision == Precision.FP8:
        args += ["--fp8-format=hybrid", f"--fp8-recipe={layout.fp8_recipe}"]
        config.update(fp8="hybrid", fp8_recipe=layout.fp8_recipe)
        notes.append(_fp8_note(layout.fp8_recipe))
        if layout.fp8_param_gather:  # TransformerConfig.fp8_param: the parameters kept and gathered in FP8
            args.append("--fp8-param-gather")
            config["fp8_param"] = True
    if layout.precision == Precision.TF32:
        notes.append("tf32: Megatron-LM's float32 matmuls follow NVIDIA_TF32_OVERRIDE / torch's allow_tf32")
    model_args, model_config = _model(shape)
    if shape.experts:
        moe_args, moe_config = _experts(layout, shape)
        model_args, model_config = model_args + moe_args, {**model_config, **moe_config}
    env = {}
    if layout.expert_overlap:
        # the overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (megatron/core/transformer/moe/README.md);
        # Megatron-MoE-ModelZoo's A2A_OVERLAP=1 sets 32 (sbatch_benchmarking.sh)
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
        if layout.tp > 1 or layout.cp > 1:  # arguments.py: a warning, not a refusal
            notes.append("the all-to-all overlap with TP/CP: Megatron-LM warns that TP/CP want CUDA_DEVICE_MAX_CONNECTIONS=1 "
                         "and the overlap more (32 written: the plan's overlap first)")
    elif layout.tp > 1 or layout.cp > 1:
        if layout.zero >= 2 or layout.dp_shard > 1:  # arguments.py: a warning, not a refusal
            notes.append("Megatron FSDP with TP/CP: Megatron-LM warns that they want different "
                         "CUDA_DEVICE_MAX_CONNECTIONS (before Blackwell)")
        else:  # arguments.py asserts it before Blackwell
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return args + model_args, {**model_config, **config}, notes, env


def _fp8_note(recipe: str) -> str:
    """What an FP8 recipe needs of the machine (megatron/core/fp8_utils.py get_fp8_recipe)."""
    need = {"tensorwise": "Transformer Engine >= 2.2 (Float8CurrentScaling)",
            "delayed": "Transformer Engine (DelayedScaling)",
            "blockwise": "Transformer Engine >= 2.3 (Float8BlockScaling)",
            "mxfp8": "Transformer Engine >= 2.1 (MXFP8BlockScaling) on Blackwell: TransformerConfig says "
                     "'mxfp8' for Blackwell architecture only"}[recipe]
    return f"fp8 {recipe}: Transformer Engine's linears in FP8, the rest in bf16; needs {need}"


def _cut(layout: EngineLayout, shape: ModelShape, config: dict) -> list[str]:
    """The pipeline cut: Megatron's even split where the plan's is even, else the plan's own as a layout."""
    blocks, v = layout.blocks_per_stage, layout.virtual
    if layout.even_blocks:
        if v > 1:
            config["virtual_pipeline_model_parallel_size"] = v
            return [f"--num-layers-per-virtual-pipeline-stage={blocks[0]}"]
        return []
    # one pattern per stage in stage order (arguments.py: stage i on rank i mod p, v = stages / p)
    stages = []
    for k, layers in enumerate(layout.layers_per_stage):
        kinds = [shape.kinds[i] for i in layers]
        text = ("E" if "embedding" in kinds else "") + (f"t*{blocks[k]}" if blocks[k] else "") + \
               ("L" if "head" in kinds else "")
        stages.append(text)
    layout_text = "|".join(stages)
    config["pipeline_model_parallel_layout"] = layout_text
    if v > 1:
        config["virtual_pipeline_model_parallel_size"] = v
    return [f"--pipeline-model-parallel-layout={layout_text}"]


def _sharding(layout: EngineLayout) -> list[str]:
    if layout.dp_shard > 1:  # ZeRO-3 (refusal() leaves sdp alone or with dp 1)
        return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy=optim_grads_params",
                "--ckpt-format=fsdp_dtensor"]
    if layout.zero == 1:
        return ["--use-distributed-optimizer"]
    if layout.zero == 2:
        return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy=optim_grads", "--ckpt-format=fsdp_dtensor"]
    return []


def _model(shape: ModelShape) -> tuple[list[str], dict]:
    """The model's shape and architecture flags (pretrain_gpt.py's GPT model)."""
    # the model's own dropout and norm epsilon: Megatron's defaults (0.1, 1e-5) are not the model's
    args = [f"--num-layers={shape.layers}", f"--hidden-size={shape.hidden}",
            f"--num-attention-heads={shape.heads}", f"--ffn-hidden-size={shape.ffn}",
            f"--seq-length={shape.seq_len}", f"--max-position-embeddings={shape.seq_len}",
            f"--attention-dropout={shape.attention_dropout!r}", f"--hidden-dropout={shape.hidden_dropout!r}",
            f"--norm-epsilon={shape.norm_eps!r}"]
    config = {"num_layers": shape.layers, "hidden_size": shape.hidden, "num_attention_heads": shape.heads,
              "ffn_hidden_size": shape.ffn, "attention_dropout": shape.attention_dropout,
              "hidden_dropout": shape.hidden_dropout, "layernorm_epsilon": shape.norm_eps}
    if shape.llama_like:
        args += ["--swiglu", "--normalization=RMSNorm", "--position-embedding-type=rope", "--disable-bias-linear",
                 f"--rotary-base={int(shape.rope_theta)}"]  # an int in Megatron-LM's parser
        config.update(gated_linear_unit=True, activation_func="silu", normalization="RMSNorm", add_bias_linear=False)
        if not shape.tied_embeddings:
            args.append("--untie-embeddings-and-output-weights")
        if shape.query_groups != shape.heads:
            args += ["--group-query-attention", f"--num-query-groups={shape.query_groups}"]
            config["num_query_groups"] = shape.query_groups
        if shape.head_dim and shape.head_dim * shape.heads != shape.hidden:  # Qwen3: 128-wide heads
            args.append(f"--kv-channels={shape.head_dim}")
            config["kv_channels"] = shape.head_dim
        if shape.qk_norm:
            args.append("--qk-layernorm")
            config["qk_layernorm"] = True
    else:  # GPT-2: learned positions, LayerNorm, GELU, biases: Megatron's defaults
        config.update(activation_func="gelu")
    return args, config


def _experts(layout: EngineLayout, shape: ModelShape) -> tuple[list[str], dict]:
    """A mixture of experts' arguments (module docstring): the experts, their layout, the dispatcher."""
    pattern = [1 if b in shape.moe_blocks else 0 for b in range(shape.layers)]
    args = [f"--num-experts={shape.experts}", f"--moe-router-topk={shape.top_k}",
            f"--moe-ffn-hidden-size={shape.moe_ffn}", f"--expert-model-parallel-size={layout.ep}",
            f"--expert-tensor-parallel-size={layout.expert_tp}", "--moe-grouped-gemm"]
    config = {"num_moe_experts": shape.experts, "moe_router_topk": shape.top_k, "moe_ffn_hidden_size": shape.moe_ffn,
              "expert_model_parallel_size": layout.ep, "expert_tensor_parallel_size": layout.expert_tp,
              "moe_grouped_gemm": True}
    if layout.expert_dispatcher == "deepep":  # plans/expert_dispatch.py: the flex dispatcher's DeepEP backend
        args += ["--moe-token-dispatcher-type=flex", "--moe-flex-dispatcher-backend=deepep"]
        config.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep")
    else:
        args.append("--moe-token-dispatcher-type=alltoall")
        config["moe_token_dispatcher_type"] = "alltoall"
    if layout.expert_overlap:  # plans/expert_overlap.py: combined 1F1B passes (TransformerConfig's own field)
        args.append("--overlap-moe-expert-parallel-comm")
        config["overlap_moe_expert_parallel_comm"] = True
    if not all(pattern):  # DeepSeek-style dense blocks among the MoE ones: Megatron's list form
        args.append(f"--moe-layer-freq=({pattern})")
        config["moe_layer_freq"] = pattern
    return args, config
