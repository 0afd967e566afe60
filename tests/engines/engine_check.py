"""Load `paraplan export` files with each engine's own configuration code and report what the
engine read from them (run in a child process by tests/engines/: the engines set global state:
tyro exits, DeepSpeed's communication layer, Megatron's warnings).

    python engine_check.py CASES.json  ->  prints {"<id>": {"ok": bool, "error": str, "read": {...}}}

Each case: {"id", "engine", "path", "world", "data_parallel", "torchtitan_config", "layers",
"params", "pipeline"}.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings


def torchtitan(case: dict) -> dict:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import pipeline_parallel as pp_module

    lines = [line.strip() for line in open(case["path"]).read().splitlines()]
    argv = ["--module", "llama3", "--config", case["torchtitan_config"], *[x for x in lines if x and not x.startswith("#")]]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            cfg = ConfigManager().parse_args(argv)
        except SystemExit as exc:  # tyro's refusal: its panel went to stderr
            raise ValueError(f"parse_args exited {exc.code}: {err.getvalue()[-400:]}") from None
    par, training = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(par, world_size=case["world"])  # the degrees' product against the world
    read = {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp, "pp": dims.pp, "cp": dims.cp,
            "sequence_parallel": bool(par.enable_sequence_parallel), "reshard": par.fsdp_reshard_after_forward,
            "local_batch": training.local_batch_size, "global_batch": training.global_batch_size,
            "mixed_precision_param": training.mixed_precision_param,
            "activation_checkpoint": type(cfg.activation_checkpoint).__qualname__, "ep": dims.ep}
    if dims.pp > 1:
        read.update(schedule=par.pipeline_parallel_schedule, micro_batch=par.pipeline_parallel_microbatch_size,
                    fqns=par.module_fqns_per_model_part)
        # every module name is one torchtitan's own even split of this many layers uses (names it does
        # not know it would drop silently)
        known = [n for part in pp_module._generate_llm_fqn_per_model_part(1, case["layers"], 0, 0) for n in part]
        ours = [n for part in par.module_fqns_per_model_part for n in part]
        if ours != known:
            raise ValueError(f"module names {ours} are not torchtitan's {known}")
        stages = len(par.module_fqns_per_model_part)
        read["stage_ranks"] = [pp_module._get_pp_rank_to_stage_indices_mapping(r, dims.pp, par.pipeline_parallel_schedule,
                                                                               stages) for r in range(dims.pp)]
        if par.pipeline_parallel_schedule_csv:
            read["csv_actions"] = _load_csv(par.pipeline_parallel_schedule_csv, dims.pp, stages // dims.pp,
                                            training.local_batch_size // par.pipeline_parallel_microbatch_size)
    return read


def _load_csv(path: str, pp: int, per_rank: int, n_micro: int) -> int:
    """torch's own loader of a per-rank order of actions (what torchtitan calls for the CSV)."""
    from unittest import mock

    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, pp, None, pp * per_rank
    runtime = _PipelineScheduleRuntime([stage] * per_rank, n_micro)
    runtime._load_csv(path)
    return sum(1 for rank in runtime.pipeline_order.values() for action in rank if action is not None)


def megatron(case: dict) -> dict:
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    doc = json.load(open(case["path"]))
    kwargs = dict(doc["transformer_config"])
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    for key in ("params_dtype", "pipeline_dtype"):
        if key in kwargs:
            kwargs[key] = dtypes[kwargs[key]]
    if "activation_func" in kwargs:
        kwargs["activation_func"] = {"silu": F.silu, "gelu": F.gelu}[kwargs["activation_func"]]
    cfg = TransformerConfig(**kwargs)
    layout = cfg.pipeline_model_parallel_layout
    read = {"tp": cfg.tensor_model_parallel_size, "pp": cfg.pipeline_model_parallel_size,
            "vpp": cfg.virtual_pipeline_model_parallel_size, "cp": cfg.context_parallel_size,
            "sequence_parallel": cfg.sequence_parallel, "bf16": cfg.bf16, "fp16": cfg.fp16,
            "recompute_granularity": cfg.recompute_granularity, "recompute_method": cfg.recompute_method,
            "num_layers": cfg.num_layers, "num_query_groups": cfg.num_query_groups,
            "pipeline_dtype": str(cfg.pipeline_dtype), "arguments": doc["arguments"],
            "experts": cfg.num_moe_experts, "top_k": cfg.moe_router_topk, "ep": cfg.expert_model_parallel_size,
            "etp": cfg.expert_tensor_parallel_size, "dispatcher": cfg.moe_token_dispatcher_type,
            "a2a_overlap": cfg.overlap_moe_expert_parallel_comm, "flex_backend": cfg.moe_flex_dispatcher_backend}
    if layout is not None:
        # layout.layout is [pipeline rank][chunk][layers]; stage i is rank i mod pp, chunk i // pp
        ranks, chunks = len(layout.layout), len(layout.layout[0])
        read["layout"] = [[str(x) for x in layout.layout[r][v]] for v in range(chunks) for r in range(ranks)]
    # the data-parallel size and micro-batches as Megatron derives them (arguments.py; the calculator's check)
    dp = case["world"] // (cfg.tensor_model_parallel_size * cfg.pipeline_model_parallel_size * cfg.context_parallel_size)
    args = dict(a.lstrip("-").split("=", 1) for a in doc["arguments"] if "=" in a)
    micro, global_batch = int(args["micro-batch-size"]), int(args["global-batch-size"])
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    calc = ConstantNumMicroBatchesCalculator(global_batch, micro, dp, decrease_batch_size_if_needed=False, rank=0)
    read.update(data_parallel=dp, micro_batch=micro, global_batch=global_batch, n_micro=calc.get())
    return read


def deepspeed(case: dict) -> dict:
    from unittest import mock

    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.utils import partition_balanced, partition_uniform

    class DataParallelGroups:  # what the engine's mpu / pipeline grid reports
        def get_data_parallel_world_size(self):
            return case["data_parallel"]

    config = json.load(open(case["path"]))
    with mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        cfg = ds_config.DeepSpeedConfig(config, mpu=DataParallelGroups())
    read = {"world_size": cfg.world_size, "train_batch_size": cfg.train_batch_size,
            "micro_batch": cfg.train_micro_batch_size_per_gpu, "n_micro": cfg.gradient_accumulation_steps,
            "zero_stage": int(cfg.zero_optimization_stage), "bf16": bool(cfg.bfloat16_config.enabled),
            "fp16": bool(cfg.float16_config.enabled)}
    if "tensor_parallel" in config:
        read["autotp_size"] = cfg.tensor_parallel_config.autotp_size
    if "pipeline" in config:
        method, stages = config["pipeline"]["partition"], config["pipeline"]["stages"]
        params = case["params"]
        # PipelineModule._partition_layers: the method's own parts over one spec per layer
        parts = partition_uniform(len(params), stages) if method == "uniform" else partition_balanced(params, stages)
        read.update(stages=stages, partition=method, parts=[int(p) for p in parts],
                    activation_checkpoint_interval=config["pipeline"].get("activation_checkpoint_interval", 0))
    return read


def run_cases(readers: dict) -> None:
    """Each case of the JSON file named on the command line read by `readers[case["engine"]](case)`;
    prints {id: {ok, error, read}} as one JSON line (also the child of test_fp8_engine_configs.py)."""
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    cases = json.load(open(sys.argv[1]))
    out = {}
    for case in cases:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                read = readers[case["engine"]](case)
            out[case["id"]] = {"ok": True, "error": "", "read": read}
        except Exception as exc:  # the engine refused the file: the test says which and why
            out[case["id"]] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600], "read": {}}
    print(json.dumps(out))


def main() -> None:
    run_cases({"torchtitan": torchtitan, "megatron": megatron, "deepspeed": deepspeed})


if __name__ == "__main__":
    main()
