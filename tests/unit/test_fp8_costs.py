"""FP8 as a precision (issue 51 item 1): the FP8 linear's price against torchao's published speed-ups,
the recipes' cast kernels and memory against hand counts, the plan field, and the refusals."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fp8_linear as bench  # noqa: E402
import torchao_rowwise_table  # noqa: E402

from paraplan.costs.fp8_linear import (  # noqa: E402
    cast_bytes,
    fp8_passes,
    fp8_recomputed,
    fp8_weight_copy_bytes,
    saved_input_bytes,
)
from paraplan.costs.transformer_memory import TransformerShape, activation_tensors  # noqa: E402
from paraplan.hardware import load_cluster  # noqa: E402
from paraplan.hardware.cluster import PrecisionError  # noqa: E402
from paraplan.models.spec import Affine, Gemm, MemoryOp, PassOps  # noqa: E402
from paraplan.plans.plan import PlanError, validate  # noqa: E402
from paraplan.runtime.rank.mixed_precision import refusal  # noqa: E402


def test_the_large_shape_is_within_5_percent_of_torchaos_published_speed_up():
    """torchao/float8/README.md, Example 2: (4096, 8192, 16384), tensorwise, compiled, 1.39x. The
    constants (the H100's FP8 peak and 0.78 efficiency, torchao's byte counts) were committed before
    this comparison (e8410f8)."""
    assert bench.speedup(4096, 8192, 16384)["speedup"] == pytest.approx(1.39, rel=0.05)


@pytest.mark.xfail(strict=True, reason="the GEMM model (costs/op_roofline.py) prices this shape's bf16 GEMMs at one "
                                       "part-filled wave of 256 x 128 tiles (32 tiles on 132 SMs: 22 us for the "
                                       "forward's 4.3 GFLOP), where cuBLAS picks smaller tiles or stream-K; the bf16 "
                                       "side comes out ~1.6x too slow and the speed-up 0.956x, not 0.80x "
                                       "(docs/guide/fp8.md)")
def test_the_small_shape_is_within_5_percent_of_torchaos_published_speed_up():
    """torchao/float8/README.md, Example 1: (1024, 2048, 1024), 0.80x: too small to gain."""
    assert bench.speedup(1024, 2048, 1024)["speedup"] == pytest.approx(0.80, rel=0.05)


def test_rowwise_is_slower_than_tensorwise_where_torchao_publishes_both():
    """torchao's rowwise table (benchmarks/torchao_rowwise_table.py) reads 0.40x at (1024, 2048, 1024)
    and 1.07x at (4096, 8192, 16384), against tensorwise's 0.80x and 1.39x: the rowwise recipe's casts
    (a transpose and a second cast per tensor) and its backward GEMMs' output scaling cost more."""
    for m, k, n in bench.PUBLISHED:
        assert bench.speedup(m, k, n, "rowwise")["speedup"] < bench.speedup(m, k, n)["speedup"]
    assert torchao_rowwise_table.SPEEDUP[1024][1][0] == 0.40 and torchao_rowwise_table.SPEEDUP[4096][3][4] == 1.07


def test_torchaos_rowwise_table_at_llm_sized_linears():
    """The 64 shapes of torchao's rowwise table whose dimensions are all 4096 or more (an LLM's
    linears at 8192 tokens a micro-batch): median |error| within the 15% the issue asks of published
    runs. Nothing was fitted to this table; it was read after the model's constants were committed,
    and one mechanism was added after reading it, from torchao's source, not its numbers (the backward
    GEMMs' output scaling, costs/fp8_linear.py): 13.9% before, 9.8% after. The smaller shapes are
    predicted too fast (median 25% over all 216), the GEMM model's small-shape weakness."""
    check = bench.rowwise_check()
    at_4096 = next(s for s in check["summary"] if s["smallest_dimension_at_least"] == 4096)
    assert at_4096["shapes"] == 64 and len(check["rows"]) == 216
    assert at_4096["median_abs_error"] <= 0.15


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_speed_up_grows_with_the_shape_toward_the_peaks_ratio(recipe):
    """Square shapes n^3: the casts are O(n^2) and the GEMMs O(n^3), so FP8's share of the gain grows
    with n and stays below the FP8 / bf16 peak ratio (2) times the efficiencies' (0.78 / 0.803). From
    2048 on: at 1024^3 every kernel sits at its floor (one part-filled wave, 2 us casts), where the
    speed-up is flat (tensorwise 0.919 there, 0.912 at 2048), the GEMM model's small-shape weakness
    that the published 0.80x also shows."""
    speedups = [bench.speedup(n, n, n, recipe)["speedup"] for n in (2048, 4096, 8192, 16384)]
    assert speedups == sorted(speedups) and len(set(speedups)) == len(speedups)
    assert speedups[0] < 1.0 < speedups[-1] < 2 * 0.78 / 0.803


def test_cast_kernels_per_tensor_are_torchaos_byte_counts():
    """torchao roofline_utils, tensorwise: the input's amax (2 bytes read per element), its second
    stage (no traffic) and one cast writing both layouts (2 + 1 + 1); the weight's cast once per pass
    (2 + 1 each); grad_output like the input but in the backward. A fused first read drops 2."""
    n = 1000.0
    assert cast_bytes("tensorwise", "input", n, fused_casts=False) == {"forward": [2 * n, 0, 4 * n], "backward": []}
    assert cast_bytes("tensorwise", "input", n, fused_casts=True) == {"forward": [0, 0, 4 * n], "backward": []}
    assert cast_bytes("tensorwise", "weight", n, True) == {"forward": [2 * n, 0, 3 * n], "backward": [3 * n]}
    assert cast_bytes("tensorwise", "grad_output", n, False) == {"forward": [], "backward": [2 * n, 0, 4 * n]}
    # rowwise: input 2 + 1 + 2 (FP8 rows and the bf16 transpose), then 2 + 1 in the backward, and the
    # input gradient's output scaling (2 + 2), which a compiled block folds into the next kernel
    assert cast_bytes("rowwise", "input", n, False) == {"forward": [5 * n], "backward": [3 * n, 4 * n]}
    assert cast_bytes("rowwise", "input", n, True) == {"forward": [3 * n], "backward": [3 * n]}
    # the weight: its cast, transpose and second cast, and the weight gradient's output scaling
    assert cast_bytes("rowwise", "weight", n, True) == {"forward": [3 * n], "backward": [4 * n, 3 * n, 4 * n]}
    assert cast_bytes("mxfp8", "weight", n, False) == {"forward": [3 * n], "backward": [3 * n]}
    # delayed (Transformer Engine): one fused cast-transpose a tensor, amax taken in it
    assert cast_bytes("delayed", "input", n, True) == {"forward": [2 * n], "backward": []}
    assert cast_bytes("delayed", "grad_output", n, False) == {"forward": [], "backward": [4 * n]}


def _fixed(x):
    return Affine(float(x), 0.0)


def test_only_aligned_linears_run_in_fp8_and_their_backward_gemms_follow():
    """A block's 2-D GEMMs (linears) become 1-byte GEMMs with the casts added; the attention core's
    batched GEMMs and a linear whose N is not a multiple of 16 (a router of 60 experts) stay bf16."""
    m = Affine(0.0, 4096.0)  # tokens: 4096 a sample
    linear = Gemm(_fixed(1), m, _fixed(4096), _fixed(1024), 2)
    router = Gemm(_fixed(1), m, _fixed(60), _fixed(1024), 2)
    core = Gemm(_fixed(16), _fixed(4096), _fixed(4096), _fixed(64), 2)
    forward = PassOps(gemms=(linear, router, core))
    backward = PassOps(gemms=(Gemm(_fixed(1), m, _fixed(1024), _fixed(4096), 2),  # input gradient
                              Gemm(_fixed(1), _fixed(1024), _fixed(4096), m, 2),  # weight gradient
                              Gemm(_fixed(1), m, _fixed(1024), _fixed(60), 2), core))
    f8, b8 = fp8_passes(forward, backward, "tensorwise", fused_casts=False)
    assert [g.element_bytes for g in f8.gemms] == [1, 2, 2]
    assert [g.element_bytes for g in b8.gemms] == [1, 1, 2, 2]
    # input (3 kernels) and weight (3) in the forward, weight (1) and grad_output (3) in the backward
    assert sum(op.count for op in f8.memory_ops) == 6 and sum(op.count for op in b8.memory_ops) == 4
    weight_cast = 3.0 * 1024 * 4096  # the weight's forward cast: 2 bytes read, 1 written, per element
    assert any(op.nbytes == Affine(weight_cast, 0.0) for op in f8.memory_ops)
    assert any(op.nbytes == Affine(0.0, 4.0 * 4096 * 1024) for op in f8.memory_ops)  # the input's cast, per sample


def test_torchtitans_selective_recomputation_of_an_fp8_block_runs_fp8_gemms_and_the_casts_again():
    """Per-operator selective recomputation (costs/analytic.py: half of every matmul, the memory-bound
    kernels) in an FP8 block: the matmuls it runs again are FP8 GEMMs, at the same half count, and
    every cast kernel of the forward runs again; an unaligned linear's GEMM stays bf16."""
    m = Affine(0.0, 4096.0)
    linear = Gemm(_fixed(1), m, _fixed(4096), _fixed(1024), 2)
    router = Gemm(_fixed(1), m, _fixed(60), _fixed(1024), 2)
    norm = MemoryOp(Affine(0.0, 4.0 * 4096 * 1024))
    forward = PassOps(gemms=(linear, router), memory_ops=(norm,))
    backward = PassOps(gemms=(Gemm(_fixed(1), m, _fixed(1024), _fixed(4096), 2),
                              Gemm(_fixed(1), _fixed(1024), _fixed(4096), m, 2)))
    selective = PassOps(gemms=(replace(linear, count=0.5), replace(router, count=0.5)), memory_ops=(norm,))
    f8, _ = fp8_passes(forward, backward, "tensorwise", fused_casts=False)
    again = fp8_recomputed(selective, forward, f8)
    assert [(g.element_bytes, g.count) for g in again.gemms] == [(1, 0.5), (2, 0.5)]
    assert again.memory_ops == (norm,) + f8.memory_ops[1:] and sum(op.count for op in again.memory_ops) == 7


def test_fp8_memory_per_tensor_against_hand_counts():
    """Transformer Engine keeps the four linear inputs in FP8 (1 byte) and an FP8 weight with its
    transpose (2 bytes a parameter); torchao keeps the input in FP8 under tensorwise only, no weight."""
    shape = TransformerShape(hidden=4096, heads=32, seq_len=4096, ffn=14336, kv_heads=8, mlp="swiglu", norm="rmsnorm",
                             dropout=False, attention="sdpa")
    s, h, f = 4096, 4096, 14336
    bf16 = {t.name: t.bytes for t in activation_tensors(shape, 1, 2)}
    fp8 = {t.name: t.bytes for t in activation_tensors(shape, 1, 2, linear_input_bytes=saved_input_bytes("megatron",
                                                                                                         "blockwise"))}
    linear_inputs = {"QKV input": s * h, "output projection input": s * h, "MLP input": s * h,
                     "down projection input": s * f}
    for name, numel in linear_inputs.items():
        assert (bf16[name], fp8[name]) == (2 * numel, numel)
    assert {k: v for k, v in fp8.items() if k not in linear_inputs} == {k: v for k, v in bf16.items()
                                                                         if k not in linear_inputs}
    assert (saved_input_bytes("torchtitan", "tensorwise"), saved_input_bytes("torchtitan", "rowwise")) == (1.0, 2.0)
    assert (fp8_weight_copy_bytes("megatron"), fp8_weight_copy_bytes("torchtitan")) == (2.0, 0.0)


def test_devices_without_fp8_refuse_it_in_one_line():
    with pytest.raises(PrecisionError, match=r"^dgx-a100-80gb\?nodes=1: a100-80gb has no FP8 \(Hopper or Ada\) tensor cores"):
        load_cluster("dgx-a100-80gb?nodes=1").check_precision("fp8", "tensorwise")
    with pytest.raises(PrecisionError, match=r"no MX FP8 \(Blackwell\) tensor cores for the fp8 recipe 'mxfp8'"):
        load_cluster("dgx-h100-80gb?nodes=1").check_precision("fp8", "mxfp8")
    load_cluster("dgx-h100-80gb?nodes=1").check_precision("fp8", "rowwise")


def test_the_plan_names_its_recipe_and_only_an_fp8_plan_has_one():
    from paraplan.plans.plan import LayerRange, Plan, Stage

    plan = Plan(model="m", cluster="c", n_layers=2, global_batch=2, n_micro=1, schedule="gpipe",
                stages=(Stage(LayerRange(0, 2), (0,)),), precision="fp8", fp8_recipe="rowwise")
    validate(plan)
    with pytest.raises(PlanError, match="fp8_recipe: an fp8 recipe \\('rowwise'\\) needs precision fp8, not bf16"):
        validate(replace(plan, precision="bf16"))
    with pytest.raises(PlanError, match="fp8_recipe: unknown fp8 recipe 'hybrid'"):
        validate(replace(plan, fp8_recipe="hybrid"))


def test_paraplans_runtime_refuses_fp8_naming_where_to_train_it():
    reason = refusal("fp8")
    assert reason.startswith("precision fp8: FP8 GEMMs need Hopper-, Ada- or Blackwell-class GPUs")
    assert "paraplan export" in reason and "\n" not in reason


MODEL = ("hf:llama?hidden_size=4096&intermediate_size=14336&num_hidden_layers=2&num_attention_heads=32"
         "&num_key_value_heads=8&vocab_size=1024&max_position_embeddings=4096&seq_len=4096")


def test_an_fp8_plan_is_priced_faster_than_bf16_and_read_back_from_its_file(capsys, tmp_path):
    """The Megatron grid's fp8 plan on one DGX H100 as Megatron-LM runs it: its file carries the
    recipe, the simulator prices it back the same, faster than the same plan in bf16 (the blocks'
    linears at twice the peak), and refuses it under another recipe's cost model."""
    from conftest import run_cli_here

    from paraplan.plans.plan_file import read_plan
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import workload

    out = tmp_path / "fp8.json"
    res = run_cli_here(capsys, "plan", "--model", MODEL, "--cluster", "dgx-h100-80gb?nodes=1", "--batch", "64",
                       "--precision", "fp8", "--fp8-recipe", "blockwise", "--engine", "megatron", "--planner",
                       "megatron-grid", "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    plan = read_plan(out)
    assert (plan.precision, plan.fp8_recipe) == ("fp8", "blockwise")
    fp8 = workload(MODEL, "dgx-h100-80gb?nodes=1", precision="fp8", fp8_recipe="blockwise", engine="megatron")
    bf16 = workload(MODEL, "dgx-h100-80gb?nodes=1", precision="bf16", engine="megatron")
    in_fp8 = simulate_plan(plan, fp8.costs).prediction
    in_bf16 = simulate_plan(replace(plan, precision="bf16", fp8_recipe=""), bf16.costs).prediction
    assert in_fp8.iteration_s == pytest.approx(plan.prediction.iteration_s)
    assert in_fp8.iteration_s < 0.9 * in_bf16.iteration_s
    with pytest.raises(PlanError, match="fp8_recipe: the plan scales its FP8 casts 'rowwise' but the cost model prices 'blockwise'"):
        simulate_plan(replace(plan, fp8_recipe="rowwise"), fp8.costs)


def test_fp8_on_a_device_without_it_or_a_recipe_without_fp8_is_one_line(capsys):
    from conftest import run_cli_here

    res = run_cli_here(capsys, "plan", "--model", MODEL, "--cluster", "dgx-a100-80gb?nodes=1", "--batch", "16",
                       "--precision", "fp8", "--quiet")
    assert res.returncode == 2 and "a100-80gb has no FP8 (Hopper or Ada) tensor cores" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = run_cli_here(capsys, "plan", "--model", MODEL, "--cluster", "dgx-h100-80gb?nodes=1", "--batch", "16",
                       "--precision", "bf16", "--fp8-recipe", "rowwise", "--quiet")
    assert res.returncode == 2 and "needs precision fp8, not bf16" in res.stderr and "Traceback" not in res.stderr


def test_an_fp8_parameter_all_gather_moves_one_byte_a_parameter_of_the_blocks():
    """Plan.fp8_param_gather: FSDP's gathers of the blocks' weights at 1 byte where bf16's take 2 (the
    embedding and head stay bf16); Transformer Engine's parameter is then the FP8 weight, its FP8
    copies no bytes beyond the parameters'; only an fp8 plan may say so."""
    from paraplan.costs.axis_costs import sharded_data_s
    from paraplan.hardware.cluster import LinkSpec
    from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
    from paraplan.workload import workload

    link = LinkSpec(bandwidth_bytes_per_s=1e9, latency_s=0.0)
    fsdp = LayerStrategy(sdp=8)
    plain, gathered = (workload(MODEL, "dgx-h100-80gb?nodes=1", precision="fp8", engine="megatron",
                                fp8_param_gather=flag).costs for flag in (False, True))
    for i, layer in enumerate(gathered.model.layers):
        before = sharded_data_s(plain.model, plain.model.layers[i], fsdp, link)[0]
        after = sharded_data_s(gathered.model, layer, fsdp, link)[0]
        assert after == pytest.approx(before / 2 if layer.kind == "block" else before)
    assert (plain.memory.fp8_weight_bytes_per_param, gathered.memory.fp8_weight_bytes_per_param) == (2.0, 0.0)
    plan = Plan(model="m", cluster="c", n_layers=2, global_batch=2, n_micro=1, schedule="gpipe",
                stages=(Stage(LayerRange(0, 2), (0,)),), precision="bf16", fp8_param_gather=True)
    with pytest.raises(PlanError, match="fp8_param_gather: parameters gathered in FP8 need precision fp8, not bf16"):
        validate(plan)
