"""Issue 32: what `paraplan export` refuses (one line naming the feature, exit 2, nothing written),
what it writes, and `plan --engine` rows that never hold a plan the engine cannot run. The files
themselves are loaded by the engines' own code in tests/engines/."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_cli_here

from paraplan.engines import ENGINES, engine_problem, export
from paraplan.engines.layout import ExportRefused
from paraplan.engines.restrict import projections
from paraplan.engines.shape import model_shape
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.plans.plan_file import read_plan, write_plan

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def tiny():
    return model_shape("gpt2-tiny")  # 6 layers: embedding, 4 blocks, head


def plan_of(shape, stages, schedule="1f1b", n_micro=4, batch=16, precision="bf16", virtual=1, **extra) -> Plan:
    return Plan(model=shape.name, cluster="galvatron-8xtitan", n_layers=len(shape.kinds), global_batch=batch,
                n_micro=n_micro, schedule=schedule, stages=tuple(stages), precision=precision, virtual_stages=virtual,
                **extra)


def stage(a, b, devices, strategy=None, n=None):
    strategies = () if strategy is None else (strategy,) * (b - a)
    return Stage(LayerRange(a, b), tuple(devices), strategies=strategies)


def refusal(plan, engine, shape):
    with pytest.raises(ExportRefused) as info:
        export(plan, engine, shape)
    message = str(info.value)
    assert "\n" not in message and engine_problem(plan, engine, shape) in message
    return message


def test_what_no_engine_can_express_is_refused_by_every_engine(tiny):
    fddps = read_plan(EXAMPLES / "resnet-50-fddps-8xp100.json")
    bipartition = plan_of(tiny, [Stage(LayerRange(0, 3), (0,), backward_layers=LayerRange(0, 2)),
                                 Stage(LayerRange(3, 6), (1,), backward_layers=LayerRange(2, 6))])
    uneven_groups = plan_of(tiny, [stage(0, 3, (0, 1)), stage(3, 6, (2,))])
    mixed = plan_of(tiny, [Stage(LayerRange(0, 6), (0, 1), strategies=(LayerStrategy(dp=2),) * 3
                                 + (LayerStrategy(dp=2, recompute="full"),) * 3)])
    for engine in ENGINES:
        assert "operator placement" in refusal(fddps, engine, model_shape("resnet-50"))
        assert "separate forward and backward ranges (Bi-Partition)" in refusal(bipartition, engine, tiny)
        assert "uneven data-parallel groups" in refusal(uneven_groups, engine, tiny)
        assert "per-layer different strategies (layer 1: DP2; layer 3: DP2 + CKPT)" in refusal(mixed, engine, tiny)


def test_each_engine_refuses_what_it_cannot_run_and_takes_the_rest(tiny):
    pipeline = [stage(0, 3, (0,)), stage(3, 6, (1,))]
    gpipe = plan_of(tiny, pipeline, schedule="gpipe")
    assert "gpipe schedule (Megatron-LM runs 1F1B" in refusal(gpipe, "megatron", tiny)
    assert "non-interleaved 1F1B only" in refusal(gpipe, "deepspeed", tiny)
    assert engine_problem(gpipe, "torchtitan", tiny) is None
    zero2_pipeline = plan_of(tiny, [stage(0, 3, (0, 1), LayerStrategy(dp=2, zero=2)),
                                    stage(3, 6, (2, 3), LayerStrategy(dp=2, zero=2))], n_micro=2)
    assert "ZeRO-2 with pipeline parallelism" in refusal(zero2_pipeline, "deepspeed", tiny)
    assert "ZeRO-2 (Megatron FSDP) with pipeline parallelism" in refusal(zero2_pipeline, "megatron", tiny)
    assert engine_problem(zero2_pipeline, "torchtitan", tiny) is None  # FSDP2 with PP
    fp16 = plan_of(tiny, [stage(0, 6, (0, 1), LayerStrategy(dp=2))], precision="fp16")
    assert "fp16 mixed precision" in refusal(fp16, "torchtitan", tiny)
    hybrid = plan_of(tiny, [stage(0, 6, range(4), LayerStrategy(dp=2, sdp=2))])
    assert "hybrid sharding" in refusal(hybrid, "megatron", tiny)
    assert "hybrid sharding" in refusal(hybrid, "deepspeed", tiny)
    assert engine_problem(hybrid, "torchtitan", tiny) is None  # HSDP: replicate x shard
    bert = read_plan(EXAMPLES / "bert-huge-32-dp8.json")
    assert "not a decoder-only transformer" in refusal(bert, "megatron", model_shape("bert-huge-32"))
    assert engine_problem(bert, "deepspeed", model_shape("bert-huge-32")) is None


def test_torchtitan_refuses_what_its_trainer_refuses_at_start_up(tiny):
    # gpt2-tiny: 4 heads, sequence 32; trainer.py: seq_len over tp (with SP) x 2 cp
    tp8 = plan_of(tiny, [stage(0, 6, range(8), LayerStrategy(tp=8, sequence_parallel=True))])
    assert "4 heads (4 key/value heads) over tensor parallelism 8" in refusal(tp8, "torchtitan", tiny)
    cp = plan_of(tiny, [stage(0, 6, range(4), LayerStrategy(tp=2, cp=2, sequence_parallel=True))])
    assert engine_problem(cp, "torchtitan", tiny) is None  # 32 over 2 x 4
    # its FSDP shards over dp_shard x cp, which the plan's replicated cp ranks do not: said in a note
    assert any("shards FSDP over dp_shard x cp (1 x 2)" in note for note in export(cp, "torchtitan", tiny).notes)
    fsdp_cp = plan_of(tiny, [stage(0, 6, range(4), LayerStrategy(sdp=2, cp=2))])  # the plan shards over both
    assert not any("dp_shard x cp" in note for note in export(fsdp_cp, "torchtitan", tiny).notes)
    long_cp = plan_of(model_shape("gpt2-tiny?seq_len=12"),
                      [stage(0, 6, range(4), LayerStrategy(tp=2, cp=2, sequence_parallel=True))])
    assert "sequence length 12 over 8 sequence shards" in refusal(long_cp, "torchtitan",
                                                                   model_shape("gpt2-tiny?seq_len=12"))


def test_torchtitan_refuses_1f1b_with_fewer_micro_batches_than_stages_and_names_every_layer(tiny):
    few = plan_of(tiny, [stage(0, 3, (0,)), stage(3, 6, (1,))], n_micro=1, batch=4)
    assert "1F1B with 1 micro-batches on 2 pipeline ranks" in refusal(few, "torchtitan", tiny)
    # every layer of a decoder keeps a name (none dropped from a stage)
    n = len(tiny.kinds)
    two = plan_of(tiny, [stage(0, 2, (0,)), stage(2, n, (1,))], n_micro=2, batch=16)
    text = export(two, "torchtitan", tiny).text.splitlines()
    parts = text[text.index("--parallelism.module_fqns_per_model_part") + 1:][:2]
    assert parts == ["tok_embeddings,layers.0", ",".join([f"layers.{b}" for b in range(1, n - 2)] + ["norm", "lm_head"])]


@pytest.mark.parametrize("model", ["vgg-tiny", "lenet-5", "bert-tiny"])
def test_torchtitan_refuses_a_model_it_cannot_train_naming_what_it_trains(model):
    """Issue 46: torchtitan trains its own model definitions only; a LeNet-5 export wrote a launch of
    its llama3 module."""
    shape = model_shape(model)
    n = len(shape.kinds)
    plan = Plan(model=model, cluster="x", n_layers=n, global_batch=16, n_micro=2, schedule="1f1b",
                stages=(stage(0, n // 2, (0,)), stage(n // 2, n, (1,))))
    why = refusal(plan, "torchtitan", shape)
    assert why and "trains its own model definitions only" in why and "llama3" in why and model in why


def test_a_cache_directory_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    res = run_cli_here(capsys, "plan", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--planner",
                       "csimd", "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "cannot keep this machine's calibration in" in res.stderr and "--no-calibration" in res.stderr


def test_a_strategy_with_tensor_parallelism_off_the_innermost_devices_is_refused(tiny):
    outer_tp = LayerStrategy(dp=2, tp=2, order="dp,tp,sdp")
    assert "not on the innermost devices" in refusal(plan_of(tiny, [stage(0, 6, range(4), outer_tp)]), "megatron",
                                                    tiny)


def test_export_writes_the_file_and_a_refusal_writes_nothing(tmp_path, capsys):
    plan = plan_of(model_shape("gpt2-tiny"), [stage(0, 3, (0, 1), LayerStrategy(dp=2)),
                                              stage(3, 6, (2, 3), LayerStrategy(dp=2))])
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    out = tmp_path / "ds.json"
    done = run_cli_here(capsys, "export", str(path), "--to", "deepspeed", "--out", str(out))
    assert done.returncode == 0, done.stderr
    config = json.loads(out.read_text())
    assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 2 == 16
    assert config["pipeline"] == {"stages": 2, "partition": "uniform", "activation_checkpoint_interval": 0}
    printed = run_cli_here(capsys, "export", str(path), "--to", "megatron")
    assert printed.returncode == 0 and json.loads(printed.stdout)["transformer_config"]["pipeline_dtype"] == "bfloat16"
    fddps = EXAMPLES / "resnet-50-fddps-8xp100.json"
    refused = run_cli_here(capsys, "export", str(fddps), "--to", "torchtitan", "--out", str(tmp_path / "x.args"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("paraplan: error: torchtitan cannot run this plan: an operator placement")
    assert not (tmp_path / "x.args").exists()
    unknown = run_cli_here(capsys, "export", str(path), "--to", "nemo")
    assert unknown.returncode == 2 and "unknown engine 'nemo'" in unknown.stderr
    malformed = tmp_path / "bad.json"
    malformed.write_text("{")
    bad = run_cli_here(capsys, "export", str(malformed), "--to", "megatron")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_projections_make_a_per_layer_mix_uniform_and_gpipe_1f1b(tiny):
    mixed = plan_of(tiny, [Stage(LayerRange(0, 3), (0, 1), strategies=(LayerStrategy(dp=2, recompute="full"),) * 2
                                 + (LayerStrategy(dp=2),)),
                           Stage(LayerRange(3, 6), (2, 3), strategies=(LayerStrategy(dp=2, recompute="full"),) * 3)],
                    schedule="gpipe")
    out = projections(mixed, tiny)
    runnable = [p for p in out if engine_problem(p, "megatron", tiny) is None]
    assert runnable and all(p.schedule == "1f1b" for p in runnable)
    # the most used strategy (full recomputation, 5 of 6 layers) everywhere, and the other one
    assert {p.stages[0].strategies[0].recompute.value for p in runnable} == {"full", "none"}
    assert all(len({s for st in p.stages for s in st.strategies}) == 1 for p in runnable)


def test_a_bipartition_plan_has_no_projection(tiny):
    """A worker running the backward of layers it does not run the forward of (Bi-Partition) has no
    projection: no engine runs one, and strategies over its forward range left its backward range's
    memory count reading past them (`plan --engine torchtitan` on Llama 2 7B ended in a traceback
    when Bi-Partition's plan split its ranges)."""
    split = plan_of(tiny, [Stage(LayerRange(0, 3), (0,), backward_layers=LayerRange(0, 2)),
                           Stage(LayerRange(3, 6), (1,), backward_layers=LayerRange(2, 6))])
    assert projections(split, tiny) == []
    for engine in ENGINES:
        assert engine_problem(split, engine, tiny) is not None


def test_plan_engine_rows_hold_only_plans_the_engine_runs(capsys, tmp_path):
    """`paraplan plan --engine`: a refused row names the feature, every ok row's plan exports, and the
    written plan is the fastest of those."""
    for engine in ("megatron", "deepspeed"):
        out = tmp_path / f"{engine}.json"
        done = run_cli_here(capsys, "plan", "--model", "gpt2-tiny", "--cluster", "galvatron-8xtitan", "--batch", "32",
                            "--engine", engine, "--out", str(out), "--json",
                            "--time-limit", "40")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["engine"] == engine and doc["unrestricted_best"] is not None
        rows = {r["planner"]: r for r in doc["rows"]}
        ok = [r for r in doc["rows"] if r["status"] == "ok"]
        assert ok and doc["best"] == min(ok, key=lambda r: (r["iteration_s"], r["planner"]))["planner"]
        assert any(r["status"] == "refused" for r in doc["rows"])
        for r in doc["rows"]:
            if r["status"] == "refused":
                assert "cannot run it: " in r["reason"]
        shape = model_shape("gpt2-tiny")
        best = read_plan(out)
        assert engine_problem(best, engine, shape) is None and rows[doc["best"]]["status"] == "ok"
        export(best, engine, shape)  # and it exports


def test_a_refused_plan_is_never_written_by_plan_engine_with_nothing_runnable(tiny):
    """restrict() on a comparison whose only feasible plan the engine refuses: no best, the
    unrestricted best kept."""
    from paraplan.engines.restrict import restrict
    from paraplan.planners.auto import Comparison, Row
    from paraplan.planners.bound import LowerBound

    gpipe = plan_of(tiny, [stage(0, 3, (0,)), stage(3, 6, (1,))], schedule="gpipe")
    row = Row(planner="pp", status="ok", plan=gpipe, iteration_s=1.0, throughput=16.0)
    result = Comparison(rows=(row,), best="pp", bound=LowerBound(0.5, 1.0, 1.0, 2), wall_s=0.1)
    restricted = restrict(result, "deepspeed", tiny)
    assert restricted.best is None and restricted.unrestricted == row
    assert restricted.rows[0].status == "refused" and "gpipe" in restricted.rows[0].reason
    assert replace(restricted, engine="").engine == ""


def test_export_prints_the_engines_own_prediction_beside_the_launch(capsys, tmp_path):
    """Issue 48: `export --to E --out F` prices the plan as E runs it (costs/engine_profile.py) and
    says so beside the launch; Megatron's fused kernels make its prediction faster than torchtitan's
    eager one for the same plan."""
    model = ("hf:llama?hidden_size=512&intermediate_size=1792&num_hidden_layers=2&num_attention_heads=8"
             "&num_key_value_heads=2&vocab_size=1000&seq_len=512")
    plan_path = tmp_path / "p.json"
    res = run_cli_here(capsys, "plan", "--model", model, "--cluster", "dgx-h100-80gb?nodes=1", "--batch", "8",
                       "--planner", "megatron-grid", "--out", str(plan_path))
    assert res.returncode == 0, res.stderr
    seconds = {}
    for engine, name in (("megatron", "Megatron-LM"), ("torchtitan", "torchtitan")):
        res = run_cli_here(capsys, "export", str(plan_path), "--to", engine, "--out", str(tmp_path / f"{engine}.out"))
        assert res.returncode == 0, res.stderr
        line = res.stdout.strip().splitlines()[-1]
        assert line.startswith(f"predicted as {name} runs it: ") and f"--engine {engine}" in line
        value, unit = line.split(": ")[1].split(" per iteration")[0].split()
        seconds[engine] = float(value) * (1e-3 if unit == "ms" else 1.0)
    assert seconds["megatron"] < seconds["torchtitan"]


def test_each_engine_export_carries_the_settings_its_prediction_assumed():
    """Issue 49 item 3, torchtitan and DeepSpeed (Megatron-LM's: tests/engines/test_engine_configs.py):
    every setting the engine's prediction depends on is written, not left to the engine's default."""
    shape = model_shape("llama-tiny")
    n = len(shape.kinds)
    full = LayerStrategy(sdp=4, recompute="full")
    plan = Plan(model=shape.name, cluster="dgx-a100-80gb", n_layers=n, global_batch=16, n_micro=2, schedule="1f1b",
                stages=(stage(0, n, range(4), full),), precision="bf16")
    titan = export(plan, "torchtitan", shape).text.split()
    for setting in ("--training.mixed_precision_param=bfloat16",  # FSDP2's bf16 parameters and activations
                    "--training.mixed_precision_reduce=float32",  # its fp32 gradient reduction
                    "--compile.no-enable",  # eager: compile and AsyncTP are not priced
                    "--parallelism.data_parallel_shard_degree=4", "--parallelism.fsdp_reshard_after_forward=always",
                    "activation_checkpoint:full", "--training.local_batch_size=2", "--training.global_batch_size=16"):
        assert setting in titan, setting
    ds = json.loads(export(plan, "deepspeed", shape).text)
    assert ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"] == {"stage": 3, "overlap_comm": False}  # its overlap is not priced
    assert "activation_checkpointing" in ds
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (16, 2, 2)


def test_without_engine_the_answer_names_who_runs_the_winner_and_each_others_best(tiny):
    """cli/export.py engines_line: the engines that run the chosen plan; for each other, the best row
    of the comparison it runs (by paraplan's prediction), or that it runs none."""
    from paraplan.cli.export import engines_line
    from paraplan.planners.auto import Comparison, Row
    from paraplan.planners.bound import LowerBound

    gpipe = plan_of(tiny, [stage(0, 3, (0,)), stage(3, 6, (1,))], schedule="gpipe")
    onef = plan_of(tiny, [stage(0, 3, (0,)), stage(3, 6, (1,))], schedule="1f1b")
    rows = (Row(planner="a", status="ok", plan=gpipe, iteration_s=1.0, throughput=16.0),
            Row(planner="b", status="ok", plan=onef, iteration_s=1.25, throughput=12.8))
    result = Comparison(rows=rows, best="a", bound=LowerBound(0.5, 1.0, 1.0, 2), wall_s=0.1)
    runners = [e for e in ENGINES if engine_problem(gpipe, e, tiny) is None]
    line = engines_line(result, rows[0], tiny)
    assert "deepspeed" not in runners and "DeepSpeed's best here is b's, +25.0%" in line
    for engine in ENGINES:
        if engine in runners:
            assert line.startswith("engines: ") and {"torchtitan": "torchtitan", "megatron": "Megatron-LM"}[engine] in \
                line.split(" the chosen plan")[0]
