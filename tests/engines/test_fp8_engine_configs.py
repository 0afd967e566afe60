"""FP8 plans' exports read by the engines' own code, in one child process (this file run as a script,
as tests/engines/engine_check.py is: the engines set global state): megatron-core 0.16.1's
TransformerConfig built from each Megatron recipe's keyword arguments (and its own field types saying
which recipes and formats exist), torchtitan 0.3.0's ConfigManager parsing the bf16 command line and
its converters run on its own llama3 8B model config (which linears they swap: every block's, not
lm_head), its llama3_405b config's own converter, DeepSpeed 0.19.8's config reading no FP8.

torchao is not installed here: torchtitan's Float8Linear / MXFP8Linear are None, so the converters'
`convert` runs with a stand-in Linear config class, and the converter object skips `__init__`'s
hardware and torchao checks (the rest of `__init__`, the filter, is the line it runs for these
filter_fqns). Megatron-LM's own parser (not on PyPI) took the four Megatron exports field for field
by hand: tests/engines/megatron_lm_validate.py's `validate` with a core_v0.16.1 checkout."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.engines import engine_problem, export, model_shape
from paraplan.engines.layout import engine_layout
from paraplan.engines.megatron import FIELD_OF_ARGUMENT
from paraplan.engines.torchtitan import fp8_converter
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage, validate

MODEL = "llama2-7b?seq_len=2048"  # 32 blocks, as torchtitan's llama3_8b
MEGATRON_RECIPES = ("tensorwise", "delayed", "blockwise", "mxfp8")
TORCHTITAN_RECIPES = ("rowwise", "mxfp8")


def _plan(model: str, ranks: int, strategy: LayerStrategy, recipe: str, n_micro: int = 8, batch: int = 64) -> Plan:
    n = len(model_shape(model).kinds)
    cuts = [0, n // 2, n] if ranks == 2 else [0, n]
    stages = tuple(Stage(LayerRange(a, b), tuple(range(r * strategy.degree, (r + 1) * strategy.degree)),
                         strategies=(strategy,) * (b - a)) for r, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)))
    return validate(Plan(model=model, cluster="dgx-h100-80gb", n_layers=n, global_batch=batch, n_micro=n_micro,
                         schedule="1f1b", stages=stages, precision="fp8" if recipe else "bf16", fp8_recipe=recipe))


TP_SP = LayerStrategy(dp=2, tp=2, sequence_parallel=True)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8-exports")
    shape = model_shape(MODEL)
    cases, plans = [], {}

    def add(name, engine, plan, shape, **extra):
        plans[name] = plan
        path = out / f"{name}.{engine}"
        path.write_text(export(plan, engine, shape).text)
        cases.append({"id": name, "engine": engine, "path": str(path), "world": len(plan.devices), "layers": shape.layers,
                      "torchtitan_config": "llama3_8b", **extra})

    for recipe in MEGATRON_RECIPES:
        add(f"megatron-{recipe}", "megatron", _plan(MODEL, 2, TP_SP, recipe), shape)
    gather = replace(_plan(MODEL, 2, LayerStrategy(dp=2, tp=2, sequence_parallel=True, zero=1), "delayed"),
                     fp8_param_gather=True)
    add("megatron-fp8-param-gather", "megatron", gather, shape)
    for recipe in TORCHTITAN_RECIPES:
        plan = _plan(MODEL, 2, TP_SP, recipe)
        name, kwargs = fp8_converter(engine_layout(plan, shape.kinds))
        add(f"torchtitan-{recipe}", "torchtitan", plan, shape, converter=name, kwargs=kwargs)
    big = model_shape("llama3.1-405b")  # torchtitan's llama3_405b: Float8 rowwise registered
    add("torchtitan-405b-rowwise", "torchtitan", _plan("llama3.1-405b", 1, LayerStrategy(sdp=8), "rowwise", n_micro=1,
                                                       batch=16), big, torchtitan_config="llama3_405b")
    cases.append({"id": "deepspeed", "engine": "deepspeed"})
    (out / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, __file__, str(out / "cases.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), plans


@pytest.mark.parametrize("recipe", MEGATRON_RECIPES)
def test_megatron_core_builds_the_transformer_config_of_each_recipe(loaded, recipe):
    results, plans = loaded
    cell = results[f"megatron-{recipe}"]
    assert cell["ok"], cell["error"]
    read = cell["read"]
    assert (read["fp8"], read["fp8_recipe"], read["bf16"], read["fp16"]) == ("hybrid", recipe, True, False)
    assert read["params_dtype"] == read["pipeline_dtype"] == "torch.bfloat16"
    assert (read["tp"], read["pp"], read["sequence_parallel"]) == (2, 2, True)
    # megatron-core's own types: the recipe is one of fp8_recipe's choices (and Fp8Recipe's), the
    # format one of fp8's, whose argument is --fp8-format
    assert recipe in read["recipe_choices"] and recipe in read["recipe_enum"] and "hybrid" in read["format_choices"]
    assert read["fp8_arguments"] == ["--fp8-format"]
    # each fp8 argument is its TransformerConfig field's value (FIELD_OF_ARGUMENT: --fp8-format is fp8)
    for arg in read["arguments"]:
        flag, _, value = arg.partition("=")
        if flag.startswith("--fp8-") and value:
            field = FIELD_OF_ARGUMENT.get(flag, flag[2:].replace("-", "_"))
            assert read[field] == value, arg


def test_megatron_core_takes_the_fp8_parameter_all_gather(loaded):
    """--fp8-param-gather is TransformerConfig.fp8_param (FIELD_OF_ARGUMENT), with the distributed
    optimizer the plan's ZeRO-1 exports (Megatron-LM refuses it without sharded states)."""
    cell = loaded[0]["megatron-fp8-param-gather"]
    assert cell["ok"], cell["error"]
    read = cell["read"]
    assert (read["fp8_param"], read["fp8"], read["fp8_recipe"]) == (True, "hybrid", "delayed")
    assert "--fp8-param-gather" in read["arguments"] and "--use-distributed-optimizer" in read["arguments"]
    assert FIELD_OF_ARGUMENT["--fp8-param-gather"] == "fp8_param"


def test_megatron_core_has_no_rowwise_recipe_which_the_export_refuses(loaded):
    results, _ = loaded
    read = results["megatron-tensorwise"]["read"]
    assert "rowwise" not in read["recipe_choices"] and "rowwise" not in read["recipe_enum"]
    problem = engine_problem(_plan(MODEL, 2, TP_SP, "rowwise"), "megatron", model_shape(MODEL))
    assert problem.startswith("the fp8 recipe rowwise (Megatron-LM's --fp8-recipe runs tensorwise, delayed, blockwise")


@pytest.mark.parametrize("recipe", TORCHTITAN_RECIPES)
def test_torchtitan_parses_the_fp8_export_as_a_bf16_eager_run(loaded, recipe):
    results, _ = loaded
    cell = results[f"torchtitan-{recipe}"]
    assert cell["ok"], cell["error"]
    read = cell["read"]
    assert read["mixed_precision_param"] == "bfloat16"
    assert (read["compile"], read["async_tp"]) == (False, False)
    assert (read["tp"], read["pp"], read["dp_replicate"], read["sequence_parallel"]) == (2, 2, 2, True)


@pytest.mark.parametrize("recipe", TORCHTITAN_RECIPES)
def test_torchtitans_own_converter_swaps_every_block_linear_and_leaves_lm_head_bf16(loaded, recipe):
    results, _ = loaded
    read = results[f"torchtitan-{recipe}"]["read"]
    linears, swapped = read["linears"], read["swapped"]
    assert "lm_head" in linears and "lm_head" not in swapped  # 0.3.0's llama3 names its output projection lm_head
    assert swapped == [f for f in linears if f.startswith("layers.")] and len(swapped) >= 32 * 4


def test_torchtitans_float8_converter_runs_rowwise_and_rowwise_with_gw_hp_only(loaded):
    """The premise of the tensorwise, delayed and blockwise refusals, in torchtitan's own type."""
    results, _ = loaded
    assert results["torchtitan-rowwise"]["read"]["float8_recipes"] == ["rowwise", "rowwise_with_gw_hp"]


def test_torchtitan_takes_no_converter_on_its_command_line(loaded):
    """Why the converter is a note: Trainer.Config.model_spec is suppressed from tyro's command line."""
    results, _ = loaded
    read = results["torchtitan-rowwise"]["read"]
    assert read["model_spec_suppressed"] is True
    assert "Unrecognized options: --model_spec.flavor=8B" in read["model_spec_override"]


def test_llama3_405b_registers_the_plans_rowwise_converter_and_takes_the_export(loaded):
    results, plans = loaded
    cell = results["torchtitan-405b-rowwise"]
    assert cell["ok"], cell["error"]
    read = cell["read"]
    assert read["registered"] == [["Float8LinearConverter", "rowwise", ["lm_head"]]]
    assert (read["dp_shard"], read["mixed_precision_param"], read["compile"], read["async_tp"]) == \
        (8, "bfloat16", False, False)
    # without --compile.no-enable_async_tensor_parallel, CompileConfig refuses the config (AsyncTP without compile)
    assert "Async TP requires 'model' in --compile.components and --compile.enable" in read["without_async_tp_flag"]


def test_deepspeeds_config_reads_no_fp8(loaded):
    results, _ = loaded
    cell = results["deepspeed"]
    assert cell["ok"], cell["error"]
    assert cell["read"] == {"fp8_constants": [], "fp8_attributes": [], "precision_configs": ["bfloat16_config",
                                                                                             "float16_config"]}


# ---- the child process: python test_fp8_engine_configs.py CASES.json ----

def _megatron(case: dict) -> dict:
    import dataclasses
    import typing

    import torch
    import torch.nn.functional as F
    from megatron.core.enums import Fp8Recipe
    from megatron.core.transformer.transformer_config import TransformerConfig

    doc = json.load(open(case["path"]))
    kwargs = dict(doc["transformer_config"])
    for key in ("params_dtype", "pipeline_dtype"):
        if key in kwargs:
            kwargs[key] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[kwargs[key]]
    kwargs["activation_func"] = {"silu": F.silu, "gelu": F.gelu}[kwargs["activation_func"]]
    cfg = TransformerConfig(**kwargs)
    fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}

    def choices(name):  # Optional[Literal[...]]
        return [c for arg in typing.get_args(fields[name].type) for c in typing.get_args(arg)]

    return {"fp8": cfg.fp8, "fp8_recipe": cfg.fp8_recipe, "bf16": cfg.bf16, "fp16": cfg.fp16, "fp8_param": cfg.fp8_param,
            "params_dtype": str(cfg.params_dtype), "pipeline_dtype": str(cfg.pipeline_dtype),
            "tp": cfg.tensor_model_parallel_size, "pp": cfg.pipeline_model_parallel_size,
            "sequence_parallel": cfg.sequence_parallel, "arguments": doc["arguments"],
            "recipe_choices": choices("fp8_recipe"), "format_choices": choices("fp8"),
            "recipe_enum": [e.value for e in Fp8Recipe],
            "fp8_arguments": fields["fp8"].metadata["argparse_meta"]["arg_names"]}


def _parse(case: dict, drop: str = ""):
    from torchtitan.config import ConfigManager

    lines = [x.strip() for x in open(case["path"]).read().splitlines()]
    argv = ["--module", "llama3", "--config", case["torchtitan_config"],
            *[x for x in lines if x and not x.startswith("#") and x != drop]]
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            return ConfigManager().parse_args(argv)
        except (SystemExit, ValueError) as exc:  # tyro's refusal (its panel on stderr), or a config's own
            return f"refused: {type(exc).__name__}: {exc} {' '.join(err.getvalue().split())}"


def _converted(name: str, kwargs: dict) -> dict:
    """Run torchtitan's converter on its llama3 8B model config; the Linear configs it swaps."""
    from dataclasses import dataclass, fields
    from functools import partial

    from torchtitan.components import quantization
    from torchtitan.components.quantization import float8, mx
    from torchtitan.components.quantization.utils import module_filter_fn
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.llama3 import model_registry

    @dataclass(kw_only=True, slots=True)
    class Swapped(Linear.Config):  # stands for Float8Linear.Config / MXFP8Linear.Config (torchao absent)
        _torchao_config: object = None

    cls = getattr(quantization, name)
    config = cls.Config(**kwargs)  # kw_only: an unknown keyword would raise
    converter = object.__new__(cls)
    converter.config = config
    if name == "Float8LinearConverter":
        float8.Float8Linear = type("Float8Linear", (), {"Config": Swapped})
        # Float8LinearConverter.__init__'s filter for filter_fqns without auto_filter_small_kn
        converter.enabled, converter.torchao_config = True, None
        converter.filter_fn = partial(module_filter_fn, filter_fqns=config.filter_fqns)
    else:
        mx.MXFP8Linear = type("MXFP8Linear", (), {"Config": Swapped})
    model = model_registry("8B").model
    linears = [fqn for fqn, *_ in model.traverse(Linear.Config)]
    model = converter.convert(model)
    swapped = [fqn for fqn, cfg, *_ in model.traverse(Linear.Config) if isinstance(cfg, Swapped)]
    recipe_type = {f.name: f.type for f in fields(float8.Float8LinearConverter.Config)}["recipe_name"]
    import typing

    return {"linears": linears, "swapped": swapped, "float8_recipes": list(typing.get_args(recipe_type))}


def _torchtitan(case: dict) -> dict:
    import typing
    from dataclasses import fields

    import tyro
    from torchtitan.trainer import Trainer

    sys.path.insert(0, str(Path(__file__).parent))
    import engine_check

    if case["torchtitan_config"] == "llama3_405b":  # its converter needs torchao: record it, build without
        from torchtitan.models.llama3 import config_registry

        registered, real = [], config_registry.model_registry

        def recording(flavor, converters=None, **kw):
            registered.extend([type(c).__qualname__.split(".")[0], c.recipe_name, c.filter_fqns] for c in converters or ())
            return real(flavor, **kw)

        config_registry.model_registry = recording
    read = engine_check.torchtitan(case)
    cfg = _parse(case)
    read.update(compile=cfg.compile.enable, async_tp=cfg.compile.enable_async_tensor_parallel)
    if case["torchtitan_config"] == "llama3_405b":
        read.update(registered=registered[:1],
                    without_async_tp_flag=str(_parse(case, drop="--compile.no-enable_async_tensor_parallel")))
        return read
    read.update(_converted(case["converter"], case["kwargs"]))
    model_spec = {f.name: f.type for f in fields(Trainer.Config)}["model_spec"]
    read["model_spec_suppressed"] = tyro.conf.Suppress in typing.get_args(model_spec)
    read["model_spec_override"] = str(_parse({**case, "path": _extra(case["path"], "--model_spec.flavor=8B")}))
    return read


def _extra(path: str, line: str) -> str:
    out = Path(path).with_suffix(".extra")
    out.write_text(Path(path).read_text() + line + "\n")
    return str(out)


def _deepspeed() -> dict:
    from unittest import mock

    import deepspeed.runtime.config as ds_config
    import deepspeed.runtime.constants as constants

    class DataParallelGroups:
        def get_data_parallel_world_size(self):
            return 2

    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
              "bf16": {"enabled": True}, "fp8": {"enabled": True}}  # an fp8 section: read by nothing
    with mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        cfg = ds_config.DeepSpeedConfig(config, mpu=DataParallelGroups())
    return {"fp8_constants": [n for n in dir(constants) if "FP8" in n.upper() or "FLOAT8" in n.upper()],
            "fp8_attributes": [k for k in vars(cfg) if "fp8" in k.lower() or "float8" in k.lower()],
            "precision_configs": sorted(k for k in vars(cfg) if k.endswith("16_config"))}


def main() -> None:
    from engine_check import run_cases  # beside this file: the script's directory is on sys.path

    run_cases({"megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": lambda case: _deepspeed()})


if __name__ == "__main__":
    main()
