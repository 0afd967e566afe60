"""Synthetic batches and the loss, from an InputSpec (used by profiling, measurement and runtime)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paraplan.models.spec import InputSpec


def make_batch(
    spec: InputSpec, batch: int, device: str | torch.device = "cpu", seed: int = 0
) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]:
    """Inputs and targets for `batch` samples; deterministic in `seed`.

    On the meta device no numbers exist, so shapes and dtypes are all that is made.
    """
    device = torch.device(device)
    if device.type == "meta":
        gen = None
    else:
        gen = torch.Generator(device="cpu").manual_seed(seed)

    def ints(high: int, *shape: int) -> torch.Tensor:
        if gen is None:
            return torch.empty(shape, dtype=torch.long, device=device)
        return torch.randint(0, high, shape, generator=gen).to(device)

    if spec.kind == "tokens":
        return ints(spec.vocab_size, batch, spec.seq_len), ints(spec.vocab_size, batch, spec.seq_len)
    if spec.kind == "seq2seq":
        enc = ints(spec.vocab_size, batch, spec.seq_len)
        dec = ints(spec.vocab_size, batch, spec.decoder_seq_len)
        return (enc, dec), ints(spec.vocab_size, batch, spec.decoder_seq_len)
    if spec.kind == "image":
        shape = (batch, spec.channels, spec.image_size, spec.image_size)
        if gen is None:
            images = torch.empty(shape, device=device)
        else:
            images = torch.randn(shape, generator=gen).to(device)
        return images, ints(spec.num_classes, batch)
    raise ValueError(f"unknown input kind {spec.kind!r}")


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension: tokens (language models) or classes (vision)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
