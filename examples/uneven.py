"""A small real model with deliberately uneven layers, for `make demo`: most of the work is in the
last two of its six layers, so splitting it into stages by layer count (the even split) leaves one
worker with most of the work, and a planner that weighs the layers does better.

    paraplan profile examples/uneven.py:build --out uneven-profile.json
    paraplan plan --model examples/uneven.py:build --cluster local --batch 64 --profile uneven-profile.json --prove
"""

import torch
from torch import nn


def block(width_in: int, width_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, width_out), nn.GELU())


def build():
    """(model, sample inputs, sample labels): 256 features in, 10 classes out. Layer costs per
    sample (multiply-adds): 65k, 65k, 65k, 262k, 1.0M, 1.0M (the two heavy ones last)."""
    torch.manual_seed(0)
    model = nn.Sequential(block(256, 256), block(256, 256), block(256, 256), block(256, 1024),
                          block(1024, 1024), nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10)))
    return model, torch.randn(8, 256), torch.randint(0, 10, (8,))
