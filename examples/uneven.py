"""A small real model with deliberately uneven layers, for `make demo`: an MLP over sequences of
16 feature vectors whose last two layers hold about 80% of the work, so that splitting it into
stages by layer count (the even split) leaves one worker with most of the work, and a planner that
weighs the layers does better.

    paraplan profile examples/uneven.py:build --out uneven-profile.json
    paraplan plan --model examples/uneven.py:build --cluster local --batch 64 --profile uneven-profile.json --prove
"""

import torch
from torch import nn


class MeanOverSequence(nn.Module):
    def forward(self, x):
        return x.mean(dim=1)


def block(width_in: int, width_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, width_out), nn.GELU())


def build():
    """(model, sample inputs, sample labels): 16 vectors of 128 features per sample, 10 classes.
    Multiply-adds per vector: 16k, 16k, 16k, 66k, 262k, 262k (the two heavy layers last)."""
    torch.manual_seed(0)
    model = nn.Sequential(block(128, 128), block(128, 128), block(128, 128), block(128, 512), block(512, 512),
                          nn.Sequential(nn.Linear(512, 512), nn.GELU(), MeanOverSequence(), nn.Linear(512, 10)))
    return model, torch.randn(8, 16, 128), torch.randint(0, 10, (8,))
