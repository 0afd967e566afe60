"""A NASNet-A-like CNN (Zoph et al., "Learning Transferable Architectures for Scalable Image
Recognition", CVPR 2018, Fig. 4), for the FD-DPS evaluation's largest graphs (NasNet_large,
PnasNet_mobile; neither transformers nor the zoo has an Inception/NASNet family).

The network is an `nn.Sequential` of layers that pass a pair `(h_prev, h)` (the outputs of the two
previous cells) from one to the next, so the decomposition is simply its children (one cell is one
layer) and a pipeline passes one tuple between stages:

  stem -> [N normal cells, reduction cell] x 2 -> N normal cells -> head

  - stem, chosen by the image size (`stem="auto"`): "cifar" (below 100 pixels): a 3x3 conv with
    3 x filters channels and BN, as NASNet's CIFAR model; "imagenet": a 3x3 stride-2 conv with 96
    channels and BN, then two stem reduction cells with filters / 4 and filters / 2 (NASNet-A large
    at 331x331: cells at 42, 21 and 11 pixels).
  - a cell: `h_prev` is adjusted to `h`'s shape (ReLU + factorized reduction when it has twice
    the resolution, ReLU + 1x1 conv + BN when only its channels differ), `h` goes through ReLU +
    1x1 conv + BN; then 5 blocks, each adding two operations on two earlier hidden states; the
    output concatenates the hidden states TF-Slim's NASNet-A concatenates (normal: h_prev and the
    5 blocks, 6 x filters channels; reduction: blocks 2-5, 4 x filters channels).
  - operations: separable conv kxk (ReLU, depthwise kxk, pointwise 1x1, BN, twice; k = 3, 5, 7),
    3x3 average / max pooling (stride 1, or 2 on a reduction cell's inputs), identity.
  - head: ReLU, global average pooling, dropout 0.5, linear.
  - filters double at each reduction cell; N = 6, filters 168 is NASNet-A large ("6 @ 4032").

Left out: the auxiliary head and drop-path (training-time regularisers), and TF-Slim's
`skip_reduction_layer_input` detail (every cell here reads the two previous cells' outputs).
The cell wiring (operations and which hidden state each reads) is TF-Slim's nasnet_utils
NasNetANormalCell / NasNetAReductionCell.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

# (operation, hidden state it reads) per block; hidden states: 0 = h (the cell's current input),
# 1 = h_prev, 2.. = the blocks' outputs in order. And the states the output concatenates.
NORMAL_A = ((("sep5", 0), ("sep3", 1)), (("sep5", 1), ("sep3", 1)), (("avg3", 0), ("id", 1)),
            (("avg3", 1), ("avg3", 1)), (("sep3", 0), ("id", 0)))
NORMAL_CONCAT = (1, 2, 3, 4, 5, 6)
REDUCTION_A = ((("sep5", 0), ("sep7", 1)), (("max3", 0), ("sep7", 1)), (("avg3", 0), ("sep5", 1)),
               (("id", 3), ("avg3", 2)), (("sep3", 2), ("max3", 0)))
REDUCTION_CONCAT = (3, 4, 5, 6)


def _relu_conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class SepConv(nn.Sequential):
    """NASNet's stacked separable conv: (ReLU, depthwise kxk, pointwise 1x1, BN) twice; the stride
    is the first depthwise conv's."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        layers: list[nn.Module] = []
        for i in range(2):
            c = cin if i == 0 else cout
            layers += [nn.ReLU(), nn.Conv2d(c, c, kernel, stride=stride if i == 0 else 1, padding=kernel // 2,
                                            groups=c, bias=False),
                       nn.Conv2d(c, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        super().__init__(*layers)


class FactorizedReduce(nn.Module):
    """Halve the resolution of h_prev to match h (TF-Slim `factorized_reduction`): two 1x1 stride-2
    paths, the second shifted by one pixel, concatenated, then BN (after a ReLU)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.relu = nn.ReLU()
        self.path1 = nn.Sequential(nn.AvgPool2d(1, stride=2), nn.Conv2d(cin, cout // 2, 1, bias=False))
        self.path2 = nn.Sequential(nn.AvgPool2d(1, stride=2), nn.Conv2d(cin, cout - cout // 2, 1, bias=False))
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        shifted = F.pad(x, (0, 1, 0, 1))[:, :, 1:, 1:]
        return self.bn(torch.cat([self.path1(x), self.path2(shifted)], dim=1))


def _operation(name: str, cin: int, cout: int, stride: int) -> nn.Module:
    """One block input's operation, mapping cin channels to cout (TF-Slim `_apply_conv_operation`)."""
    if name.startswith("sep"):
        return SepConv(cin, cout, int(name[3:]), stride)
    if name in ("avg3", "max3"):
        pool = (nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False) if name == "avg3"
                else nn.MaxPool2d(3, stride=stride, padding=1))
        if cin == cout:
            return pool
        return nn.Sequential(pool, nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))
    if name == "id":
        return nn.Identity() if stride == 1 and cin == cout else _relu_conv_bn(cin, cout, stride)
    raise ValueError(f"unknown NASNet operation {name!r}")


class Cell(nn.Module):
    """A NASNet-A normal or reduction cell on the pair (h_prev, h); returns (h, output)."""

    def __init__(self, c_prev: int, c_cur: int, filters: int, reduction: bool, prev_is_larger: bool):
        super().__init__()
        blocks, concat = (REDUCTION_A, REDUCTION_CONCAT) if reduction else (NORMAL_A, NORMAL_CONCAT)
        if prev_is_larger:
            self.adjust_prev = FactorizedReduce(c_prev, filters)
        elif c_prev != filters:
            self.adjust_prev = _relu_conv_bn(c_prev, filters)
        else:
            self.adjust_prev = nn.Identity()
        self.adjust_cur = _relu_conv_bn(c_cur, filters)
        self.wiring = blocks
        self.concat = concat
        self.ops = nn.ModuleList(
            _operation(op, filters, filters, 2 if reduction and source < 2 else 1)
            for block in blocks for op, source in block)
        self.out_channels = filters * len(concat)

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h_prev, h = pair
        states = [self.adjust_cur(h), self.adjust_prev(h_prev)]
        for b, ((_, left), (_, right)) in enumerate(self.wiring):
            states.append(self.ops[2 * b](states[left]) + self.ops[2 * b + 1](states[right]))
        return h, torch.cat([states[i] for i in self.concat], dim=1)


class CifarStem(nn.Sequential):
    """3x3 conv + BN, returned twice: the first cell's (h_prev, h)."""

    def __init__(self, channels: int, in_channels: int = 3):
        super().__init__(nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = super().forward(x)
        return x, x


class ImagenetStem(CifarStem):
    """NASNet's ImageNet stem conv: 3x3, stride 2, no padding, + BN (the stem cells follow)."""

    def __init__(self, channels: int, in_channels: int = 3):
        nn.Sequential.__init__(self, nn.Conv2d(in_channels, channels, 3, stride=2, bias=False),
                               nn.BatchNorm2d(channels))


class Head(nn.Module):
    def __init__(self, channels: int, num_classes: int, dropout: float = 0.5):
        super().__init__()
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.fc(self.dropout(torch.flatten(self.pool(self.relu(pair[1])), 1)))


def nasnet(n_normal: int, filters: int, num_classes: int = 10, image_size: int = 32, in_channels: int = 3,
           stem: str = "auto") -> nn.Sequential:
    """NASNet-A (N @ 6 x 4 x filters): `n_normal` normal cells per stack, three stacks, two
    reduction cells between them; `stem` "cifar", "imagenet" or "auto" (cifar below 100 pixels)."""
    if n_normal < 1 or filters < 4:
        raise ValueError(f"NASNet needs N >= 1 and filters >= 4, got N={n_normal}, filters={filters}")
    if stem == "auto":
        stem = "cifar" if image_size < 100 else "imagenet"
    layers: list[tuple[str, nn.Module]] = []
    if stem == "cifar":
        c = 3 * filters  # NASNet's stem_multiplier 3
        layers.append(("stem", CifarStem(c, in_channels)))
        c_prev, c_cur, prev_larger = c, c, False
    elif stem == "imagenet":
        layers.append(("stem", ImagenetStem(96, in_channels)))
        c_prev = c_cur = 96
        prev_larger = False
        for i, scale in enumerate((4, 2)):
            cell = Cell(c_prev, c_cur, filters // scale, reduction=True, prev_is_larger=prev_larger)
            layers.append((f"stem_cell{i}", cell))
            c_prev, c_cur, prev_larger = c_cur, cell.out_channels, True
    else:
        raise ValueError(f"unknown NASNet stem {stem!r} (cifar, imagenet or auto)")
    f = filters
    for stack in range(3):
        if stack > 0:
            f *= 2
            cell = Cell(c_prev, c_cur, f, reduction=True, prev_is_larger=prev_larger)
            layers.append((f"reduction{stack - 1}", cell))
            c_prev, c_cur, prev_larger = c_cur, cell.out_channels, True
        for i in range(n_normal):
            cell = Cell(c_prev, c_cur, f, reduction=False, prev_is_larger=prev_larger)
            layers.append((f"cell{stack * n_normal + i}", cell))
            c_prev, c_cur, prev_larger = c_cur, cell.out_channels, False
    layers.append(("head", Head(c_cur, num_classes)))
    return nn.Sequential(OrderedDict(layers))
