"""A user's module whose build function returns (model, sample inputs) and no targets: paraplan
trains it on the mean of its outputs (docs/models.md), a pipeline's last stage included (issue 46)."""

import torch
from torch import nn


def build():
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))
    return model, torch.randn(8, 16)
