"""Issue 49 item 4: the numbers users compare runs by, tokens/s per GPU, TFLOP/s per GPU and MFU
(costs/model_flops.py), in `paraplan simulate` and `paraplan plan`."""

import json
from dataclasses import replace

import pytest
from conftest import run_cli_here

from paraplan.costs.model_flops import (
    DECODER_FORMULA,
    MEASURED_FORMULA,
    achieved,
    achieved_json,
    decoder_flops_per_token,
    model_flops,
)
from paraplan.models.spec import Affine, InputSpec

# Llama 3 paper (Dubey et al. 2024), Table 4: 405B at 16M tokens a step on 8,192 H100s, 430 TFLOP/s per GPU
TOKENS_PER_STEP = 16_777_216
GPUS = 8_192
TFLOPS = 430e12


def test_llama3_405b_step_time_is_the_papers():
    """6*N + 6*L*d*s per token, N as the zoo counts llama3.1-405b's parameters: 12.08 s a step."""
    per_token = decoder_flops_per_token(405.85e9, 126, 16384, 8192)
    assert per_token == 6 * 405.85e9 + 6 * 126 * 16384 * 8192
    step_s = TOKENS_PER_STEP * per_token / (GPUS * TFLOPS)
    assert round(step_s, 2) == 12.08
    # the non-causal count (12*L*d*s, torchtitan's) would put 12.56 s on the same throughput
    assert round(TOKENS_PER_STEP * (per_token + 6 * 126 * 16384 * 8192) / (GPUS * TFLOPS), 2) == 12.56
    # and back: that step gives 430 TFLOP/s per GPU, 2,048 tokens/s per GPU, MFU 43.5% of the H100's bf16 peak
    seq = 8192
    flops = model_flops(_token_spec(405.85e9, seq), layers=126, hidden=16384)
    assert flops.formula == DECODER_FORMULA and flops.tokens_per_sample == seq
    assert flops.per_token == pytest.approx(per_token, rel=1e-12)
    a = achieved(flops, TOKENS_PER_STEP / seq / step_s, [989.4e12] * GPUS, "bf16")
    assert a.tflops_per_gpu == pytest.approx(430, rel=1e-12)
    assert a.tokens_per_s_per_gpu == pytest.approx(TOKENS_PER_STEP / step_s / GPUS, rel=1e-12)
    assert a.mfu == pytest.approx(430 / 989.4, rel=1e-12)


def test_the_zoo_counts_405b_as_the_closed_form_takes_it():
    from paraplan.engines.shape import model_shape

    shape = model_shape("llama3.1-405b")  # built on meta: no weights
    assert (shape.layers, shape.hidden, shape.seq_len) == (126, 16384, 8192)
    assert round(sum(shape.params) / 1e9, 2) == 405.85


def _token_spec(params: float, seq: int, kind: str = "tokens", decoder_seq: int = 0):
    """lenet-5's measured spec with its parameters and inputs replaced (model_flops reads only
    those and the layers' forward FLOPs)."""
    spec = _lenet()
    first = replace(spec.layers[0], param_count=int(params) - sum(layer.param_count for layer in spec.layers[1:]))
    return replace(spec, layers=(first, *spec.layers[1:]),
                   inputs=InputSpec(kind, seq_len=seq, decoder_seq_len=decoder_seq, vocab_size=100))


def _lenet():
    from paraplan.models import measure, source

    return measure.measure(source.build("lenet-5", device="meta"))


def test_a_model_without_tokens_counts_three_forwards_and_shows_no_tokens():
    spec = _lenet()
    forward = (Affine(7.0, 100.0), Affine(0.0, 50.0))  # the slope is per sample; the fixed part is per micro-batch
    layers = tuple(replace(layer, forward_flops=forward[i] if i < 2 else Affine(0.0, 0.0))
                   for i, layer in enumerate(spec.layers))
    flops = model_flops(replace(spec, layers=layers), layers=12, hidden=64)  # a shape given to an image model: ignored
    assert flops.per_sample == 450.0 and flops.formula == MEASURED_FORMULA
    assert flops.tokens_per_sample == 0 and flops.per_token is None
    # a mixed cluster: the mean of the plan's devices' peaks
    a = achieved(flops, 10.0, [1000.0, 3000.0], "fp32")
    assert a.flops_per_s_per_gpu == 2250.0 and a.peak_flops_per_gpu == 2000.0 and a.mfu == 1.125
    assert a.tokens_per_s_per_gpu is None
    assert achieved_json(a)["tokens_per_s_per_gpu"] is None and flops.as_json()["tokens_per_sample"] is None
    assert set(achieved_json(None)) == set(achieved_json(a)) and not any(achieved_json(None).values())


def test_seq2seq_counts_every_token_of_a_sample_and_its_measured_forwards():
    spec = _token_spec(1e6, 512, kind="seq2seq", decoder_seq=4)
    flops = model_flops(spec, layers=32, hidden=1024)  # not a decoder-only model: the closed form does not apply
    assert flops.tokens_per_sample == 516 and flops.formula == MEASURED_FORMULA
    assert flops.per_sample == pytest.approx(3 * sum(layer.forward_flops.per_sample for layer in spec.layers))


def _simulate_json(capsys, *args) -> dict:
    r = run_cli_here(capsys, "simulate", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_simulate_tokens_per_gpu_is_samples_times_sequence_over_gpus(capsys):
    from paraplan.engines.shape import shape_of
    from paraplan.models import source

    plan = "examples/gpt2-tiny-local-1f1b-2x4.json"  # 2 stages on one device each, sequences of 32
    d = _simulate_json(capsys, plan, "--cluster", "galvatron-8xtitan")
    assert d["tokens_per_s_per_gpu"] == pytest.approx(d["throughput_samples_per_s"] * 32 / 2, rel=1e-12)
    built = source.build("gpt2-tiny", device="meta")
    shape = shape_of(built, "gpt2-tiny")
    n = sum(p.numel() for p in built.module.parameters())  # the tied head's weight once
    assert d["model_flops"]["per_token"] == pytest.approx(6 * n + 6 * shape.layers * shape.hidden * 32, rel=1e-12)
    assert d["model_flops"]["formula"].startswith("6*N + 6*L*d*s per token")
    tflops = d["model_flops"]["per_sample"] * d["throughput_samples_per_s"] / 2 / 1e12
    assert d["tflops_per_gpu"] == pytest.approx(tflops, rel=1e-12)
    assert d["peak_tflops_per_gpu"] == pytest.approx(16.3, rel=0.01)  # a TITAN RTX in fp32
    assert d["mfu"] == pytest.approx(d["tflops_per_gpu"] / d["peak_tflops_per_gpu"], rel=1e-12)


def test_mfu_of_llama_8b_on_h100s_is_a_fraction_of_the_bf16_peak(capsys, tmp_path):
    plan = {"format_version": 2, "model": "llama3.1-8b", "cluster": "dgx-h100-80gb", "n_layers": 34,
            "global_batch": 64, "n_micro": 8, "precision": "bf16", "schedule": {"kind": "1f1b", "virtual_stages": 1},
            "grad_sync": "bucketed", "stages": [{"layers": [0, 17], "devices": list(range(8))},
                                                {"layers": [17, 34], "devices": list(range(8, 16))}]}
    path = tmp_path / "llama8b.json"
    path.write_text(json.dumps(plan))
    r = run_cli_here(capsys, "simulate", str(path))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("per GPU: "))
    mfu = float(line.split("MFU ")[1].split("%")[0]) / 100
    assert 0.05 < mfu <= 1
    assert "tokens/s" in line and "of the bf16 peak, 989 TFLOP/s" in line and "6*N + 6*L*d*s per token" in line
