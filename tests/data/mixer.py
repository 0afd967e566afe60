"""An MLP-Mixer written as a plain nn.Module (not nn.Sequential, not transformers): paraplan must
cut it through a torch.fx trace. Used by tests/unit/test_any_model.py and the distributed tests."""

import torch
from torch import nn


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, channels: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        # no bias on the last token-mixing linear: a per-token constant added to every channel is
        # removed by the LayerNorms downstream, so its gradient is zero up to rounding (and a
        # rounding-sized parameter cannot be compared with one process to 1e-5 relative)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                                       nn.Linear(2 * tokens, tokens, bias=False))
        self.norm2 = nn.LayerNorm(channels)
        self.channel_mlp = nn.Sequential(nn.Linear(channels, 2 * channels), nn.GELU(), nn.Linear(2 * channels, channels))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, image: int = 16, patch: int = 4, channels: int = 32, depth: int = 4, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, patch, patch)
        self.blocks = nn.ModuleList([MixerBlock((image // patch) ** 2, channels) for _ in range(depth)])
        self.norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, images):
        x = self.stem(images).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def build():
    """(model, sample images, sample labels): integer labels make the loss a cross-entropy."""
    return Mixer(), torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))


class Skipping(nn.Module):
    """A long skip connection across top-level children: cannot be cut between them."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        y = self.a(x)
        return self.c(self.b(y)) + y


def build_skipping():
    return Skipping(), torch.randn(2, 8)
