"""A plain nn.Module that reads a parameter and a buffer of its own in `forward` (issue 46): a
learned position vector added after the embedding (and read again by the head), and a fixed scale
before the head. The cut keeps each in every layer that reads it (models/fx_cut.py: _HeldTensor)."""

import torch
from torch import nn


class PositionNet(nn.Module):
    def __init__(self, width: int = 32, depth: int = 3):
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.pos = nn.Parameter(torch.randn(width) * 0.02)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])
        self.register_buffer("scale", torch.tensor(0.5))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        h = self.embed(x) + self.pos
        for block in self.blocks:
            h = h + block(h)
        # the position vector read again by the head: a parameter two layers share, kept in both and
        # owned by the first (a pipeline's stages synchronise its gradient, as a tied embedding's)
        return self.head(h * self.scale) + self.pos[:4]


def build():
    return PositionNet(), torch.randn(8, 16), torch.randint(0, 4, (8,))
