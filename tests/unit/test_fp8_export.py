"""FP8 plans (precision.py's fp8 and its recipe) exported to the engines: Megatron-LM's `--fp8-format`
and `--fp8-recipe` with megatron-core's TransformerConfig fields, torchtitan 0.3.0's bf16 run with the
converter its config function takes, DeepSpeed's refusal; everything but the FP8 linears as a bf16
plan's. What cannot run is refused in one line. The engines' own code reads these exports in
tests/engines/test_fp8_engine_configs.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from paraplan.engines import engine_problem, export
from paraplan.engines.layout import ExportRefused, engine_layout
from paraplan.engines.shape import model_shape
from paraplan.engines.torchtitan import fp8_converter
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage

MEGATRON_RECIPES = ("tensorwise", "delayed", "blockwise", "mxfp8")


@pytest.fixture(scope="module")
def tiny():
    return model_shape("gpt2-tiny")  # 6 layers: embedding, 4 blocks, head


DP2 = LayerStrategy(dp=2)


def plan_of(shape, strategy=DP2, ranks=2, precision="bf16", n_micro=4) -> Plan:
    """Two pipeline stages (or one) of `strategy`'s devices over the model's layers."""
    n, k = len(shape.kinds), strategy.degree
    cuts = [0, n // 2, n] if ranks == 2 else [0, n]
    stages = tuple(Stage(LayerRange(a, b), tuple(range(r * k, (r + 1) * k)), strategies=(strategy,) * (b - a))
                   for r, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)))
    return Plan(model=shape.name, cluster="galvatron-8xtitan", n_layers=n, global_batch=16, n_micro=n_micro,
                schedule="1f1b", stages=stages, precision=precision)


def fp8(plan: Plan, recipe: str) -> Plan:
    return replace(plan, precision="fp8", fp8_recipe=recipe)


def refusal(plan, engine, shape) -> str:
    with pytest.raises(ExportRefused) as info:
        export(plan, engine, shape)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.endswith(engine_problem(plan, engine, shape))
    return message


def megatron_doc(plan, shape) -> dict:
    return json.loads(export(plan, "megatron", shape).text)


def test_the_engine_layout_carries_the_plans_recipe(tiny):
    plan = plan_of(tiny)
    assert engine_layout(fp8(plan, "rowwise"), tiny.kinds).fp8_recipe == "rowwise"
    assert engine_layout(plan, tiny.kinds).fp8_recipe == ""


@pytest.mark.parametrize("recipe", MEGATRON_RECIPES)
def test_megatron_runs_bf16_with_hybrid_fp8_and_the_plans_recipe(tiny, recipe):
    bf16 = megatron_doc(plan_of(tiny, LayerStrategy(dp=2, tp=2, sequence_parallel=True)), tiny)
    doc = megatron_doc(fp8(plan_of(tiny, LayerStrategy(dp=2, tp=2, sequence_parallel=True)), recipe), tiny)
    args, config = doc["arguments"], doc["transformer_config"]
    assert [a for a in args if a.startswith(("--bf16", "--fp16", "--fp8"))] == \
        ["--bf16", "--fp8-format=hybrid", f"--fp8-recipe={recipe}"]
    # nothing else differs from the bf16 plan's export: attention, the head and the dtypes are bf16
    assert [a for a in args if not a.startswith("--fp8-")] == bf16["arguments"]
    assert (config["fp8"], config["fp8_recipe"], config["bf16"]) == ("hybrid", recipe, True)
    assert {k: v for k, v in config.items() if k not in ("fp8", "fp8_recipe")} == bf16["transformer_config"]
    assert config["params_dtype"] == config["pipeline_dtype"] == "bfloat16" and "fp16" not in config
    assert doc["notes"] == bf16["notes"] + [n for n in doc["notes"] if n.startswith(f"fp8 {recipe}: ")]
    assert any(n.startswith(f"fp8 {recipe}: Transformer Engine's linears in FP8") for n in doc["notes"])
    assert any("Blackwell" in n for n in doc["notes"]) is (recipe == "mxfp8")


def test_megatron_maps_fp8_format_to_its_transformer_config_field():
    from paraplan.engines.megatron import FIELD_OF_ARGUMENT, FP8_RECIPES

    assert FIELD_OF_ARGUMENT["--fp8-format"] == "fp8"  # the field's argparse name (TransformerConfig.fp8)
    assert FP8_RECIPES == MEGATRON_RECIPES


def test_megatron_refuses_rowwise_naming_its_recipes(tiny):
    message = refusal(fp8(plan_of(tiny), "rowwise"), "megatron", tiny)
    assert message == ("Megatron-LM cannot run this plan: the fp8 recipe rowwise (Megatron-LM's --fp8-recipe runs "
                       "tensorwise, delayed, blockwise, mxfp8; rowwise scaling is torchao's)")


def test_torchtitan_runs_rowwise_in_bf16_and_names_the_float8_converter(tiny):
    plan = plan_of(tiny, LayerStrategy(sdp=2), ranks=1)  # one stage: no note on gpt2's module names
    bf16, rowwise = export(plan, "torchtitan", tiny), export(fp8(plan, "rowwise"), "torchtitan", tiny)
    args = [line for line in rowwise.text.splitlines() if not line.startswith("#")]
    assert args == [line for line in bf16.text.splitlines() if not line.startswith("#")]  # bf16 on the command line
    assert "--training.mixed_precision_param=bfloat16" in args
    assert args[-3:-1] == ["--compile.no-enable", "--compile.no-enable_async_tensor_parallel"]
    layout = engine_layout(fp8(plan, "rowwise"), tiny.kinds)
    assert fp8_converter(layout) == ("Float8LinearConverter", {"recipe_name": "rowwise", "filter_fqns": ["lm_head"]})
    assert fp8_converter(engine_layout(plan, tiny.kinds)) is None
    assert rowwise.notes == (
        "fp8 rowwise: torchtitan 0.3.0 takes converters from the config function, not the command line: launch a "
        "config whose model_spec is model_registry(<flavor>, converters=[Float8LinearConverter.Config("
        "recipe_name=\"rowwise\", filter_fqns=[\"lm_head\"])]); torchao needed",)
    assert f"# note: {rowwise.notes[0]}" in rowwise.text


def test_torchtitan_runs_mxfp8_with_the_blocks_linears_only_on_blackwell(tiny):
    plan = fp8(plan_of(tiny, LayerStrategy(sdp=2), ranks=1), "mxfp8")
    out = export(plan, "torchtitan", tiny)
    assert fp8_converter(engine_layout(plan, tiny.kinds)) == ("MXFP8LinearConverter", {"fqns": ["layers"]})
    assert "--training.mixed_precision_param=bfloat16" in out.text
    (note,) = out.notes
    assert "converters=[MXFP8LinearConverter.Config(fqns=[\"layers\"])]" in note
    assert "MXFP8 runs on Blackwell only (the converter refuses below SM100)" in note


def test_torchtitan_names_the_registered_configs_flavor_and_the_one_that_carries_rowwise():
    llama8b = model_shape("llama3.1-8b")
    plan = plan_of(llama8b, LayerStrategy(sdp=2), ranks=1)
    (note,) = export(fp8(plan, "rowwise"), "torchtitan", llama8b).notes
    assert "model_registry(\"8B\", converters=[Float8LinearConverter.Config(" in note
    assert "in place of llama3_8b" in note
    # torchtitan's llama3_405b registers Float8 rowwise with lm_head filtered: the plan's converter, and
    # a bf16 plan launched with it would run FP8
    llama405b = model_shape("llama3.1-405b")
    plan = plan_of(llama405b, LayerStrategy(sdp=8), ranks=1, n_micro=1)
    assert export(fp8(plan, "rowwise"), "torchtitan", llama405b).notes[-1].startswith(
        "fp8 rowwise: torchtitan's llama3_405b config carries the plan's converter")
    assert "this bf16 plan wants a 405B config without it" in export(plan, "torchtitan", llama405b).notes[-1]


@pytest.mark.parametrize(("recipe", "why"), [
    ("tensorwise", "tensorwise scaling, with FSDP's FP8 all-gather, is gone)"),
    ("delayed", "Transformer Engine's delayed scaling: torchtitan 0.3.0's Float8 converter runs rowwise and "
                "rowwise_with_gw_hp only)"),
    ("blockwise", "rowwise_with_gw_hp only; Megatron-LM runs blockwise)"),
])
def test_torchtitan_refuses_the_recipes_its_converter_lacks_in_one_line(tiny, recipe, why):
    message = refusal(fp8(plan_of(tiny), recipe), "torchtitan", tiny)
    assert message.startswith(f"torchtitan cannot run this plan: the fp8 recipe {recipe} (") and message.endswith(why)
    if recipe != "delayed":
        assert "torchtitan 0.3.0's Float8 converter runs rowwise and rowwise_with_gw_hp only" in message


@pytest.mark.parametrize("recipe", ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8"))
def test_deepspeed_refuses_every_fp8_plan_in_one_line(tiny, recipe):
    plan = plan_of(tiny, LayerStrategy(dp=2), ranks=1)
    assert refusal(fp8(plan, recipe), "deepspeed", tiny) == (
        f"DeepSpeed cannot run this plan: fp8 ({recipe}): DeepSpeed 0.19.8's config has no FP8 training (bf16 and "
        "fp16 only); its FP8 lives in the model's code, Transformer Engine's layers under fp8_autocast")
    assert json.loads(export(plan, "deepspeed", tiny).text)["bf16"] == {"enabled": True}  # bf16 still exported


def test_a_plan_in_another_precision_exports_as_before(tiny):
    fp32 = plan_of(tiny, precision="fp32", ranks=1)
    args = megatron_doc(fp32, tiny)["arguments"]
    assert not [a for a in args if a.startswith(("--bf16", "--fp16", "--fp8"))]
    assert "--training.mixed_precision_param=float32" in export(fp32, "torchtitan", tiny).text
    assert not export(fp32, "torchtitan", tiny).notes


def test_an_fp8_parameter_all_gather_is_megatrons_fp8_param_gather_and_refused_elsewhere(tiny):
    """Megatron-LM: `--fp8-param-gather` (TransformerConfig.fp8_param) with the distributed optimizer,
    refused without sharded states (Megatron-LM's arguments.py refuses it); torchtitan 0.3.0 has no
    FP8 all-gather; DeepSpeed no FP8 at all."""
    zero1 = replace(fp8(plan_of(tiny, LayerStrategy(dp=2, zero=1)), "delayed"), fp8_param_gather=True)
    doc = megatron_doc(zero1, tiny)
    assert "--fp8-param-gather" in doc["arguments"] and doc["transformer_config"]["fp8_param"] is True
    plain = replace(fp8(plan_of(tiny), "delayed"), fp8_param_gather=True)
    assert "needs the distributed optimizer or FSDP" in refusal(plain, "megatron", tiny)
    rowwise = replace(fp8(plan_of(tiny, LayerStrategy(sdp=2)), "rowwise"), fp8_param_gather=True)
    assert "an FP8 parameter all-gather" in refusal(rowwise, "torchtitan", tiny)
