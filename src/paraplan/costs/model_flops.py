"""The numbers users compare training runs by (issue 49): tokens/s per GPU, TFLOP/s per GPU and MFU.

Model FLOPs count the work the model asks for, not the work a plan does: recomputation (activation
checkpointing) is not counted, so that plans that recompute and plans that do not are compared on
the same footing. This is MFU (model FLOPs utilisation, Chowdhery et al. 2022, PaLM, Appendix B),
not HFU (which counts the recomputed forward too).

A decoder-only transformer (the Llama and GPT-2 families, engines/shape.py's ModelShape.decoder):

    model FLOPs per token = 6*N + 6*L*d*s

N every parameter (embeddings included, a tied weight once), L its transformer blocks, d the hidden
size, s the sequence length. 6*N: 2 FLOPs per parameter per token in the forward, 4 in the
backward. 6*L*d*s: attention's two s x s matmuls (QK^T and the weighted sum of V), 12*L*d*s
forward and backward without a mask, half of it under the causal mask (the positions after a token
are never computed). The Llama 3 paper's figures count so (Dubey et al. 2024, Table 4: 430 TFLOP/s
per GPU at 16M tokens a step on 8,192 GPUs is 12.08 s a step for 405B,
tests/unit/test_model_flops.py); torchtitan's count takes the whole 12*L*d*s ("we follow the
convention and do not account for sparsity in causal attention"), so its MFU of the same run reads
a few percent higher at long sequences.

Any other model (a CNN, a vision transformer, an encoder, a user's module, a seq2seq model):

    model FLOPs per sample = 3 x the forward FLOPs measured on meta, summed over the layers

(ModelSpec.layers[i].forward_flops: its slope in the micro-batch, the FLOPs of one more sample;
the backward taken as twice the forward). Tokens per sample: the sequence length of a token model,
the encoder's plus the decoder's of a seq2seq one (every token the step reads), none for others
(no tokens/s is shown).

MFU = achieved model FLOP/s per GPU / the peak dense FLOP/s of the plan's devices in its precision
(hardware/cluster.py DeviceSpec.peak_for; bf16 on an H100 SXM: 989.4 TFLOP/s); on a mixed cluster
the mean of the plan's devices' peaks, so that MFU is the plan's FLOP/s over the sum of its
devices' peaks. "Per GPU" is per device the plan uses (Plan.devices; a CPU core on `local`).

Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.models.spec import ModelSpec

DECODER_FORMULA = ("6*N + 6*L*d*s per token (N parameters a token runs through: a mixture of experts' top-k "
                   "routed ones; L transformer blocks, d hidden size, s sequence length; causal attention; "
                   "recomputation not counted)")
MEASURED_FORMULA = ("3 x the measured forward FLOPs per sample (the backward as twice the forward; "
                    "recomputation not counted)")
MFU_FORMULA = ("model FLOP/s per GPU over the peak dense FLOP/s of the plan's devices in its precision "
               "(their mean on a mixed cluster)")


@dataclass(frozen=True)
class ModelFlops:
    """The model FLOPs of one sample's forward and backward, and how they were counted."""

    per_sample: float
    tokens_per_sample: int  # 0: not a token model (no tokens/s)
    formula: str

    @property
    def per_token(self) -> float | None:
        return self.per_sample / self.tokens_per_sample if self.tokens_per_sample else None

    def as_json(self) -> dict:
        return {"per_sample": self.per_sample, "per_token": self.per_token,
                "tokens_per_sample": self.tokens_per_sample or None, "formula": self.formula,
                "mfu_formula": MFU_FORMULA}


def decoder_flops_per_token(params: float, layers: int, hidden: int, seq_len: int) -> float:
    """6*N + 6*L*d*s: a decoder-only transformer's model FLOPs per token, forward and backward."""
    return 6.0 * params + 6.0 * layers * hidden * seq_len


def tokens_per_sample(spec: ModelSpec) -> int:
    """The tokens one sample brings: the sequence (tokens), encoder and decoder (seq2seq), else 0."""
    if spec.inputs.kind == "tokens":
        return spec.inputs.seq_len
    if spec.inputs.kind == "seq2seq":
        return spec.inputs.seq_len + spec.inputs.decoder_seq_len
    return 0


def active_params(spec: ModelSpec) -> float:
    """The parameters a token runs through: all of a dense model's; of a mixture of experts', its
    top-k of E routed experts per MoE layer (with the shared experts and the rest), as Megatron-LM's
    FLOP count (routed top-k plus shared) and the MoE papers' "active parameters" count them."""
    return spec.param_count - sum(x.experts.routed_params * (1 - x.experts.top_k / x.experts.experts)
                                  for x in spec.layers if x.experts is not None)


def model_flops(spec: ModelSpec, *, layers: int = 0, hidden: int = 0) -> ModelFlops:
    """A decoder-only transformer's closed form where its blocks and hidden size are given (a token
    model), else 3 x the measured forward FLOPs."""
    tokens = tokens_per_sample(spec)
    if layers > 0 and hidden > 0 and spec.inputs.kind == "tokens":
        per_token = decoder_flops_per_token(active_params(spec), layers, hidden, spec.inputs.seq_len)
        return ModelFlops(per_token * tokens, tokens, DECODER_FORMULA)
    forward = sum(layer.forward_flops.per_sample for layer in spec.layers)
    return ModelFlops(3.0 * forward, tokens, MEASURED_FORMULA)


@dataclass(frozen=True)
class Achieved:
    """What a plan achieves per GPU at a throughput."""

    samples_per_s: float
    gpus: int  # the devices the plan uses
    flops_per_s_per_gpu: float  # model FLOP/s
    peak_flops_per_gpu: float  # in the plan's precision; the mean over the plan's devices
    tokens_per_s_per_gpu: float | None  # None: not a token model
    precision: str = ""  # whose peak

    @property
    def tflops_per_gpu(self) -> float:
        return self.flops_per_s_per_gpu / 1e12

    @property
    def mfu(self) -> float:
        return self.flops_per_s_per_gpu / self.peak_flops_per_gpu if self.peak_flops_per_gpu > 0 else 0.0

    def as_json(self) -> dict:
        return {"tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "tflops_per_gpu": self.tflops_per_gpu,
                "mfu": self.mfu, "peak_tflops_per_gpu": self.peak_flops_per_gpu / 1e12}


def achieved_json(a: Achieved | None) -> dict:
    """`Achieved.as_json()`, or the same keys all null where there is no plan or no throughput."""
    if a is not None:
        return a.as_json()
    return {"tokens_per_s_per_gpu": None, "tflops_per_gpu": None, "mfu": None, "peak_tflops_per_gpu": None}


def achieved(flops: ModelFlops, samples_per_s: float, peaks, precision: str = "") -> Achieved:
    """`flops` at `samples_per_s` over devices of these peaks (FLOP/s each in `precision`, one per device)."""
    peaks = tuple(peaks)
    if not peaks:
        raise ValueError("achieved: a plan on no device")
    gpus = len(peaks)
    tokens = samples_per_s * flops.tokens_per_sample / gpus if flops.tokens_per_sample else None
    return Achieved(samples_per_s, gpus, flops.per_sample * samples_per_s / gpus, sum(peaks) / gpus, tokens,
                    str(precision))


def plan_achieved(flops: ModelFlops, plan, cluster, samples_per_s: float | None = None) -> Achieved | None:
    """What `plan` achieves on `cluster`'s devices at its predicted throughput (or `samples_per_s`);
    None for a plan without either."""
    if samples_per_s is None:
        samples_per_s = plan.prediction.throughput_samples_per_s if plan.prediction is not None else None
    if samples_per_s is None:
        return None
    return achieved(flops, samples_per_s, (cluster.device(d).peak_for(plan.precision) for d in plan.devices),
                    plan.precision)
