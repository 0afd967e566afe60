"""Issue 50 item 7: published mixture-of-experts runs predicted (benchmarks/published_moe_runs.py), each
row the source's configuration: NVIDIA-NeMo/Automodel docs/performance-summary.md (DeepSeek-V3 on
1,024 and 256 H100, Qwen3-30B-A3B on 8), Megatron-MoE-ModelZoo (Mixtral 8x22B on 128) and
Megatron-Bridge's 25.11 summary (gpt-oss-120B on 64). Nothing is fitted to them."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import published_moe_runs as bench  # noqa: E402

from paraplan.models import source  # noqa: E402


def test_the_rows_are_the_sources():
    """Layouts, batches and times as the sources give them (issue 50 item 7's table; the Automodel
    micro-batches from its MBS column)."""
    rows = {r.label: r for r in bench.RUNS}
    assert len(rows) == 5
    ds = rows["DeepSeek-V3, 1,024 H100"]
    assert (ds.gpus, ds.pp, ds.virtual, ds.ep, ds.sdp, ds.global_batch, ds.micro, ds.published_s) == \
        (1024, 4, 8, 64, 256, 8192, 1, 37.87)
    # GA 4 (LBS 8 of MBS 1 over FSDP 256): four pipeline schedules a step; the 256-GPU row GA 1
    assert (ds.flushes, rows["DeepSeek-V3, 256 H100"].flushes) == (4, 1)
    ds = rows["DeepSeek-V3, 256 H100"]
    assert (ds.gpus, ds.pp, ds.virtual, ds.ep, ds.sdp, ds.global_batch, ds.published_s) == (256, 4, 8, 64, 64, 512, 8.18)
    q = rows["Qwen3-30B-A3B, 8 H100"]
    assert (q.gpus, q.sdp, q.ep, q.global_batch, q.micro, q.published_s) == (8, 8, 8, 512, 4, 21.773)
    m = rows["Mixtral 8x22B, 128 H100"]
    assert (m.gpus, m.tp, m.pp, m.virtual, m.ep, m.global_batch, m.micro, m.published_tflops) == \
        (128, 2, 8, 7, 8, 256, 1, 445)
    g = rows["gpt-oss-120B, 64 H100"]
    assert (g.gpus, g.pp, g.ep, g.global_batch, g.micro, g.published_tflops) == (64, 4, 8, 512, 4, 153)


def test_the_models_are_the_zoos_published_shapes():
    """Each row's model is the zoo's entry of that name, whose parameter count tests/unit/test_zoo.py
    checks against the published one (within 1%: DeepSeek-V3 671B, Qwen3-30B-A3B 30.5B, Mixtral
    8x22B 141B, gpt-oss-120B 116.8B)."""
    from paraplan.models.ref import parse

    names = {parse(r.model).target for r in bench.RUNS}
    assert names == {"deepseek-v3", "qwen3-30b-a3b", "mixtral-8x22b", "gpt-oss-120b"}
    forced = {parse(r.model).target for r in bench.RUNS if parse(r.model).expert_imbalance == 1.0}
    assert forced == names - {"mixtral-8x22b"}  # Mixtral's row is dropless with real routing
    # the Automodel rows as their benchmark configs ran them (examples/benchmark/configs/
    # deepseek_v3_te_deepep*.yaml, qwen3_moe_30b_te_deepep.yaml): DeepEP, activation checkpointing of
    # every block, FakeBalancedGate's round-robin routing
    automodel = [r for r in bench.RUNS if r.source == bench.AUTOMODEL]
    assert len(automodel) == 3
    assert {(r.dispatcher, r.recompute, parse(r.model).expert_routing) for r in automodel} == \
        {("deepep", "full", "round-robin")}


def test_megatrons_flop_count_is_six_active_weights_per_token_and_the_causal_core():
    """Megatron's count for Mixtral 8x22B against the built model's own weights: 6 x (attention
    projections, top-2 of 8 experts, the logits) per token + the causal attention core."""
    run = next(r for r in bench.RUNS if r.label.startswith("Mixtral"))
    model = source.build(run.model, device="meta").module
    block = model.model.layers[0]
    attention = sum(p.numel() for p in block.self_attn.parameters())
    expert = sum(p.numel() for p in block.mlp.experts.parameters()) // 8
    active = 56 * (attention + 2 * expert) + model.lm_head.weight.numel()
    tokens, seq = 256 * 4096, 4096
    core = 6 * 2 * seq / 2 * 48 * 128 * 56  # QK^T and AV over half the causal square, per token, three passes
    expected = 6 * active * tokens + core * tokens
    assert bench.megatron_flops(bench.MIXTRAL_FLOPS, 256, seq) == pytest.approx(expected, rel=1e-9)


@pytest.fixture(scope="module")
def table():
    return bench.rows(twins=False)


def test_every_row_within_35_percent(table):
    # measured 2026-11-28 with the Automodel rows as their benchmark configs ran them (DeepEP, full
    # activation checkpointing, FakeBalancedGate's round-robin routing; the 1,024-GPU row's four
    # pipeline flushes, MLA's own kernels): DeepSeek-V3 -14.6% and -14.7%,
    # Qwen3-30B-A3B +14.9%, Mixtral 8x22B -9.2%, gpt-oss-120B -26.0% (docs/published-runs.md explains each)
    assert {r["run"]: abs(r["time_ratio"] - 1) < 0.35 for r in table} == {r.label: True for r in bench.RUNS}


def test_median_time_error_within_15_percent(table):
    # 14.7% (DeepSeek-V3 on 256 GPUs, the middle row): met by 0.3 points, with MLA's memory-bound
    # kernels priced; 15.4% without them (docs/published-runs.md)
    assert statistics.median(abs(r["time_ratio"] - 1) for r in table) <= 0.15
