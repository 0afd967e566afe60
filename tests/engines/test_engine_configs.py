"""Issue 32: `paraplan export` files loaded by the engines' own configuration code (torchtitan
0.3.0's ConfigManager and ParallelDims, megatron-core 0.16.1's TransformerConfig and micro-batch
calculator, DeepSpeed 0.19.8's DeepSpeedConfig and partition functions), in one child process
(tests/engines/engine_check.py), each read back against the plan: degrees, schedule, micro-batch,
precision. The table in docs/engines.md is these cells."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.engines import engine_problem, export, model_shape
from paraplan.engines.layout import ExportRefused
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage, validate

MODEL = "llama2-7b?seq_len=2048"  # 32 blocks: torchtitan's llama3_8b has 32 layers too
CHECK = Path(__file__).with_name("engine_check.py")


@pytest.fixture(scope="module")
def shape():
    return model_shape(MODEL)


def make_plan(shape, cuts, strategy, schedule="1f1b", n_micro=8, virtual=1, precision="bf16", batch=64, check=True,
              **extra):
    """A plan of len(cuts) - 1 stages over the model's layers, every layer with `strategy`; with
    `virtual` chunks per pipeline rank, stage i on rank i mod ranks."""
    n_layers = len(shape.kinds)
    bounds = list(zip(cuts[:-1], cuts[1:], strict=True))
    ranks = len(bounds) // virtual
    groups = [tuple(range(r * strategy.degree, (r + 1) * strategy.degree)) for r in range(ranks)]
    stages = tuple(Stage(LayerRange(a, b), groups[i % ranks], strategies=(strategy,) * (b - a))
                   for i, (a, b) in enumerate(bounds))
    assert cuts[-1] == n_layers
    plan = Plan(model=MODEL, cluster="dgx-a100-80gb", n_layers=n_layers, global_batch=batch, n_micro=n_micro,
                schedule=schedule, stages=stages, virtual_stages=virtual, precision=precision, **extra)
    return validate(plan) if check else plan


def the_four(shape):
    """The issue's four plans (docs/engines.md's rows)."""
    return {
        "pipeline-1f1b": make_plan(shape, [0, 17, 34], LayerStrategy(dp=2)),
        "tp-sp": make_plan(shape, [0, 34], LayerStrategy(dp=2, tp=2, sequence_parallel=True), n_micro=4),
        "zero-2": make_plan(shape, [0, 34], LayerStrategy(dp=4, zero=2), n_micro=2),
        "interleaved-1f1b": make_plan(shape, [0, 9, 17, 25, 34], LayerStrategy(dp=2), schedule="interleaved-1f1b",
                                      virtual=2),
    }


# docs/engines.md: what each engine does with each plan (None: exported)
EXPECTED_REFUSALS = {
    ("tp-sp", "deepspeed"): "sequence parallelism",
    ("interleaved-1f1b", "deepspeed"): "non-interleaved 1F1B only",
}
ENGINES = ("torchtitan", "megatron", "deepspeed")


def _world(plan) -> int:
    return len(plan.devices)


@pytest.fixture(scope="module")
def checked(shape, tmp_path_factory):
    """Every exportable cell (and a few more plans) written and loaded by the engines, in one child process."""
    out = tmp_path_factory.mktemp("exports")
    plans = dict(the_four(shape))
    # an uneven cut (CSIMD / GroPipe style): Megatron takes it as a layout, torchtitan as module names
    plans["uneven-1f1b"] = make_plan(shape, [0, 6, 20, 34], LayerStrategy(), n_micro=8)
    plans["full-recompute-pp"] = make_plan(shape, [0, 17, 34], LayerStrategy(dp=2, recompute="full"))
    plans["sdp"] = make_plan(shape, [0, 34], LayerStrategy(sdp=8), n_micro=1, precision="fp32")
    plans["zero-1-pp"] = make_plan(shape, [0, 17, 34], LayerStrategy(dp=4, zero=1), n_micro=4, precision="fp16")
    # interleaved with a stage of the embedding alone and one of the loss alone (the Megatron grid's
    # 70B plans at 9-10 chunks; Megatron's layout "E|t*8|...|L")
    plans["embedding-alone"] = make_plan(shape, [0, 1, 9, 17, 25, 33, 34], LayerStrategy(), schedule="interleaved-1f1b",
                                         virtual=3, n_micro=8)
    # a plan's own per-rank order (format version 2's schedule.actions, GPipe's order written out;
    # paraplan's runtime does not run such plans yet, validate() says so): torchtitan takes it as a CSV
    plans["actions-csv"] = make_plan(shape, [0, 17, 34], LayerStrategy(), schedule="gpipe", n_micro=2, check=False,
                                     actions=(("F0.0", "F1.0", "B0.0", "B1.0"), ("F0.1", "F1.1", "B0.1", "B1.1")))
    cases, exported = [], {}
    for name, plan in plans.items():
        for engine in ENGINES:
            if engine_problem(plan, engine, shape) is not None:
                continue
            path = out / f"{name}.{engine}"
            result = export(plan, engine, shape, schedule_csv_path=str(out / f"{name}.csv"))
            path.write_text(result.text)
            if result.schedule_csv:
                (out / f"{name}.csv").write_text(result.schedule_csv)
            strategy = plan.stages[0].strategy(plan.stages[0].layers.start)
            cases.append({"id": f"{name}/{engine}", "engine": engine, "path": str(path), "world": _world(plan),
                          "data_parallel": strategy.data_degree, "torchtitan_config": "llama3_8b",
                          "layers": shape.layers, "params": list(shape.params)})
            exported[f"{name}/{engine}"] = (plan, result)
    (out / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, str(CHECK), str(out / "cases.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), exported, plans


def test_the_engines_are_installed_beside_the_pinned_torch():
    import torch

    assert torch.__version__.split("+")[0] == "2.13.0"  # constraints.txt held it
    pins = {"torchtitan": "0.3.0", "triton": "3.9.0", "megatron-core": "0.16.1", "deepspeed": "0.19.8"}
    assert {name: importlib.metadata.version(name) for name in pins} == pins


@pytest.mark.parametrize("plan_name", ["pipeline-1f1b", "tp-sp", "zero-2", "interleaved-1f1b"])
@pytest.mark.parametrize("engine", ENGINES)
def test_each_cell_is_exported_and_loads_or_is_refused_in_one_line(checked, shape, plan_name, engine, capsys):
    results, exported, plans = checked
    plan = plans[plan_name]
    refusal = EXPECTED_REFUSALS.get((plan_name, engine))
    if refusal:
        with pytest.raises(ExportRefused) as info:
            export(plan, engine, shape)
        message = str(info.value)
        assert refusal in message and "\n" not in message
        return
    cell = results[f"{plan_name}/{engine}"]
    assert cell["ok"], cell["error"]
    _same_as_plan(engine, cell["read"], plan, shape)


def _same_as_plan(engine: str, read: dict, plan: Plan, shape) -> None:
    """The engine read the plan's degrees, schedule, micro-batch and precision."""
    st = plan.stages[0].strategy(plan.stages[0].layers.start)
    ranks, data = plan.n_ranks, st.data_degree
    micro = plan.global_batch // (plan.n_micro * data)
    if engine == "torchtitan":
        assert read["tp"] == st.tp and read["pp"] == ranks and read["cp"] == st.cp
        assert read["dp_replicate"] * read["dp_shard"] == data
        if st.zero:  # ZeRO-1/2 as FSDP2 without resharding after the forward
            assert read["dp_shard"] == data and read["reshard"] == "never"
        else:
            assert (read["dp_replicate"], read["dp_shard"]) == (st.dp, st.sdp)
        assert read["sequence_parallel"] == (st.sequence_parallel or st.tp == 1)  # torchtitan's default on
        assert read["mixed_precision_param"] == ("bfloat16" if plan.precision == "bf16" else "float32")
        assert read["global_batch"] == plan.global_batch
        if ranks > 1:
            names = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "gpipe": "GPipe"}
            assert read["schedule"] == names[plan.schedule] and read["micro_batch"] == micro
            assert read["local_batch"] == micro * plan.n_micro
            assert [len(part) for part in read["fqns"]] == [
                sum({"embedding": 1, "block": 1, "head": 2}[shape.kinds[i]] for i in s.layers) for s in plan.stages]
            assert [list(r) for r in read["stage_ranks"]] == [
                [i for i, r in enumerate(plan.rank_of_stage) if r == rank] for rank in range(ranks)]
        else:
            assert read["local_batch"] == micro  # the micro-batches as gradient accumulation
        expected_ac = {"none": "NoneType", "full": "FullAC", "selective": "SelectiveAC"}[st.recompute.value]
        assert read["activation_checkpoint"].split(".")[0] == expected_ac
    elif engine == "megatron":
        assert read["tp"] == st.tp and read["pp"] == ranks and read["cp"] == st.cp
        assert (read["vpp"] or 1) == plan.virtual_stages
        assert read["sequence_parallel"] == st.sequence_parallel
        assert read["data_parallel"] == data and read["micro_batch"] == micro and read["n_micro"] == plan.n_micro
        assert read["bf16"] == (plan.precision == "bf16") and read["fp16"] == (plan.precision == "fp16")
        assert read["recompute_granularity"] == (None if st.recompute.value == "none" else st.recompute.value)
        assert read["num_layers"] == shape.layers
    else:
        assert read["world_size"] == data and read["train_batch_size"] == plan.global_batch
        assert read["micro_batch"] == micro and read["n_micro"] == plan.n_micro
        assert read["zero_stage"] == (3 if st.sdp > 1 else st.zero)
        assert read["bf16"] == (plan.precision == "bf16") and read["fp16"] == (plan.precision == "fp16")
        if ranks > 1:  # DeepSpeed's own partition method gives the plan's cut
            assert read["stages"] == ranks
            assert read["parts"] == [s.layers.start for s in plan.stages] + [plan.n_layers]


@pytest.mark.parametrize("name", ["uneven-1f1b", "full-recompute-pp", "sdp", "zero-1-pp", "actions-csv", "embedding-alone"])
def test_more_plans_load_in_every_engine_that_takes_them(checked, shape, name):
    results, exported, plans = checked
    ids = [k for k in results if k.startswith(name + "/")]
    assert ids, f"no engine took {name}"
    for cell_id in ids:
        cell = results[cell_id]
        assert cell["ok"], f"{cell_id}: {cell['error']}"
        _same_as_plan(cell_id.split("/")[1], cell["read"], plans[name], shape)


def test_an_uneven_cut_reaches_megatron_as_a_layout_and_torchtitan_as_module_names(checked, shape):
    results, _, plans = checked
    layout = results["uneven-1f1b/megatron"]["read"]["layout"]
    blocks = [sum(shape.kinds[i] == "block" for i in s.layers) for s in plans["uneven-1f1b"].stages]
    assert [sum(1 for x in stage if "decoder" in x.lower()) for stage in layout] == blocks  # 5, 14, 13
    assert [len(p) for p in results["uneven-1f1b/torchtitan"]["read"]["fqns"]] == [6, 14, 15]
    # DeepSpeed's methods give [0, 17, 34] (uniform) or the parameters' balance: not this cut
    assert "uneven-1f1b/deepspeed" not in results
    problem = engine_problem(plans["uneven-1f1b"], "deepspeed", shape)
    assert problem.startswith("the cut at layers [6, 20]") and "uniform" in problem


def test_a_plans_own_order_of_actions_goes_to_torchtitan_as_torchs_csv(checked):
    results, exported, _ = checked
    assert results["actions-csv/torchtitan"]["read"]["csv_actions"] == 8  # every action torch read back
    for engine in ("megatron", "deepspeed"):
        assert f"actions-csv/{engine}" not in results


def test_the_deepspeed_partition_methods_are_deepspeeds_own():
    """export/deepspeed.py's port against deepspeed.runtime.utils on random weights."""
    import random

    from deepspeed.runtime.utils import partition_balanced, partition_uniform

    from paraplan.engines import deepspeed as ours

    rng = random.Random(0)
    for _ in range(60):
        n, parts = rng.randint(1, 30), rng.randint(1, 8)
        weights = [rng.choice([0, 1, 5, rng.randint(1, 10**6)]) for _ in range(n)]
        assert ours.partition_uniform(n, parts) == list(partition_uniform(n, parts))
        assert ours.partition_balanced(weights, parts) == [int(x) for x in partition_balanced(weights, parts)]


def test_each_megatron_argument_is_the_transformer_config_field_of_the_same_meaning(checked):
    """megatron-core's wheel has no Megatron-LM parser: every exported argument that names a
    TransformerConfig field (core_transformer_config_from_args copies fields by name; the renamed
    ones are engines/megatron.py's FIELD_OF_ARGUMENT) carries the value of the exported keyword
    argument, and every keyword argument comes from an argument. (Megatron-LM's own validate_args
    and conversion, tag core_v0.16.1, agreed field for field on these files:
    tests/engines/megatron_lm_validate.py, run by hand with a checkout.)"""
    import dataclasses

    from megatron.core.transformer.transformer_config import TransformerConfig

    from paraplan.engines.megatron import FIELD_OF_ARGUMENT

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    default = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    results, exported, _ = checked
    derived = {"params_dtype", "pipeline_dtype", "activation_func"}  # from --bf16/--fp16 and --swiglu
    for cell_id, (plan, result) in exported.items():
        if not cell_id.endswith("/megatron"):
            continue
        doc = json.loads(result.text)
        config, args, seen = doc["transformer_config"], doc["arguments"], set()
        for i, arg in enumerate(args):
            if not arg.startswith("--"):
                continue
            flag, _, value = arg.partition("=")
            field = FIELD_OF_ARGUMENT.get(flag, flag[2:].replace("-", "_"))
            if field not in fields:
                continue  # batches, checkpoint format, sharding: not TransformerConfig's
            seen.add(field)
            if flag == "--num-layers-per-virtual-pipeline-stage":
                expected = shape_layers(plan) // config["pipeline_model_parallel_size"] // int(value)
            elif flag == "--disable-bias-linear":
                expected = False
            elif flag == "--group-query-attention":
                continue  # the count comes with --num-query-groups
            elif flag == "--recompute-modules":
                expected = [args[i + 1]]
            elif value == "":
                expected = True
            else:
                expected = _number_or_text(value)
            assert config[field] == expected, f"{cell_id}: {arg} against {field}={config[field]!r}"
        # with a layout, Megatron-LM derives the chunks per rank from it (arguments.py: num_stages // pp)
        layout_derived = {"virtual_pipeline_model_parallel_size"} if "pipeline_model_parallel_layout" in config else set()
        unsaid = {k for k in set(config) - seen - derived - layout_derived
                  if config[k] != default[k]}  # a default needs no flag
        assert not unsaid, f"{cell_id}: {unsaid} from no argument"


def _number_or_text(value: str):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def shape_layers(plan) -> int:
    return sum(1 for s in plan.stages for _ in s.layers) - 2  # the blocks: the embedding and head left out


def test_the_megatron_export_carries_the_settings_the_prediction_assumed(shape):
    """Megatron-LM's defaults differ from the model the prediction measured (dropout 0.1, norm
    epsilon 1e-5, rotary base 10000) and leave off the overlaps the prediction counts on: the
    export states each (issue 49, item 3; Megatron-LM core_v0.16.1's own parser and validate_args
    took all nine files of tests/engines/megatron_lm_validate.py with these, field for field)."""
    from paraplan.engines import model_shape as shape_of

    args = json.loads(export(make_plan(shape, [0, 17, 34], LayerStrategy(dp=4, zero=1), n_micro=4), "megatron",
                             shape).text)["arguments"]
    assert shape.family == "llama" and shape.attention_dropout == shape.hidden_dropout == 0.0
    for setting in ("--attention-dropout=0.0", "--hidden-dropout=0.0", f"--norm-epsilon={shape.norm_eps!r}",
                    f"--rotary-base={int(shape.rope_theta)}", "--overlap-grad-reduce", "--overlap-param-gather",
                    "--use-distributed-optimizer"):
        assert setting in args, setting
    assert shape.norm_eps == 1e-5 and shape.rope_theta == 10000.0  # Llama 2 7B's config (meta-llama on the Hub)
    # without the distributed optimizer: the gradients' overlap only (Megatron asserts the pairing)
    plain = json.loads(export(make_plan(shape, [0, 17, 34], LayerStrategy(dp=2)), "megatron", shape).text)["arguments"]
    assert "--overlap-grad-reduce" in plain and "--overlap-param-gather" not in plain
    # GPT-2 keeps its dropout (0.1) and LayerNorm epsilon, and has no rotary base
    gpt = shape_of("gpt2-tiny")
    assert (gpt.attention_dropout, gpt.hidden_dropout, gpt.norm_eps, gpt.rope_theta) == (0.1, 0.1, 1e-5, 0.0)


def test_torchtitans_registered_configs_are_the_table_and_the_launch_names_them(shape):
    """engines/torchtitan.py's LLAMA3_CONFIGS against the installed torchtitan's model flavors; a
    model of one of those shapes is launched with that config, others keep the placeholder; the
    launch command carries the plan's nodes and GPUs per node (Cluster.placement), not <N> <G>."""
    from torchtitan.models import llama3

    from paraplan.engines import model_shape as shape_of
    from paraplan.engines.torchtitan import LLAMA3_CONFIGS, registered_config
    from paraplan.hardware import load_cluster

    for name, dims in LLAMA3_CONFIGS.items():
        m = getattr(llama3, "_" + name.split("_")[1])("flex")
        block = m.layers[0]
        assert (len(m.layers), m.dim, block.attention.n_heads, block.attention.n_kv_heads,
                block.feed_forward.w1.out_features, m.vocab_size, float(block.attention.rope.theta)) == dims, name
        assert not m.enable_weight_tying
    assert registered_config(shape_of("llama3.1-8b")) == "llama3_8b"
    assert registered_config(shape) is None  # Llama 2 7B: another FFN, vocabulary and rotary base
    plan = make_plan(shape, [0, 17, 34], LayerStrategy(dp=4), n_micro=4)
    placement = load_cluster("dgx-a100-80gb?nodes=2").placement(plan.devices)
    assert placement == (1, 8)
    exported = export(plan, "torchtitan", shape, placement=placement)
    assert exported.command.startswith("torchrun --nproc-per-node 8 --nnodes 1 -m torchtitan.train --module llama3 "
                                       "--config <a llama3 config") and "<G>" not in exported.text
    assert "--nproc-per-node <G> --nnodes <N>" in export(plan, "megatron", shape).command  # without: placeholders


def test_every_plan_of_the_megatron_grid_builds_megatron_cores_transformer_config(shape, tmp_path):
    """Issue 49 item 2: the Megatron grid makes plans Megatron-LM runs. Every layout the grid judged
    for the 7B model on 16 A100 at batch 64 (1F1B and interleaved, DP / distributed optimizer, TP,
    every recomputation) exports without refusal and megatron-core builds its TransformerConfig,
    reading back the plan's degrees, chunks and micro-batches."""
    from dataclasses import replace

    from paraplan.planners.galvatron.grid import grid_candidates
    from paraplan.planners.registry import simulator_judge
    from paraplan.workload import workload

    w = workload(MODEL, "dgx-a100-80gb?nodes=2", batch=64, precision="bf16", engine="megatron")
    plans = [replace(p, precision="bf16") for p, _ in grid_candidates(w.request, simulator_judge(w.request))]
    # 33 layouts since interleaved rewrites that cannot win are no longer timed (grid_bounds.py), 51 before
    assert len(plans) > 30 and sum(p.virtual_stages > 1 for p in plans) >= 5
    cases = []
    for k, plan in enumerate(plans):
        assert engine_problem(plan, "megatron", shape) is None, plan
        path = tmp_path / f"grid{k}.megatron"
        path.write_text(export(plan, "megatron", shape).text)
        cases.append({"id": f"grid{k}/megatron", "engine": "megatron", "path": str(path), "world": _world(plan)})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, str(CHECK), str(tmp_path / "cases.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for k, plan in enumerate(plans):
        cell = results[f"grid{k}/megatron"]
        assert cell["ok"], cell["error"]
        _same_as_plan("megatron", cell["read"], plan, shape)
