"""A user's module whose blocks paraplan's tensor parallelism does not know (issue 46): two Linears
named neither like an MLP pair nor an attention, so no part of a block has a tensor-parallel plan."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.widen = nn.Linear(width, 4 * width)
        self.narrow = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.narrow(torch.relu(self.widen(x)))


class Net(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build():
    return Net(), torch.randn(8, 64)
