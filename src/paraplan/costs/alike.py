"""Layers priced alike: an LLM's blocks are one layer repeated, and every per-layer price of a
strategy (costs/strategy.py: strategy_arrays) reads only the layer's spec, its input and its cost
functions, so a search prices each distinct layer once (issue 51 item 2: a third of a Galvatron
search's time at 1,024 GPUs went to pricing the same block 80 times)."""

from __future__ import annotations

from dataclasses import replace

from paraplan.costs.timefn import LayerCosts
from paraplan.models.spec import ModelSpec

# the answers for the last few (costs, model, layers) asked, the objects held so their ids stay
# theirs: a Galvatron search asks for every device group and micro-batch size with the same costs
# (hashing 80 layer specs each time had been 0.6 s of Galvatron-Base's 7.6 at 1,024 H100s)
_RECENT: dict = {}
_RECENT_MAX = 8


def first_alike(costs: LayerCosts, model: ModelSpec, layers: range) -> list[int]:
    """For each row of `layers`, the first row whose layer every price of `strategy_arrays` reads
    alike: the same spec but for its place, the same input (the previous layer's output, which
    layer_memory reads) and the same cost functions. An 80-block Llama prices 3 layers, not 82.
    Cost functions that cannot be hashed (a measured profile's arrays) keep their row."""
    key = (id(costs), id(model), layers.start, layers.stop, layers.step)
    if key in _RECENT and _RECENT[key][0] is costs and _RECENT[key][1] is model:
        return list(_RECENT[key][2])
    first = _first_alike(costs, model, layers)
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.pop(next(iter(_RECENT)))
    _RECENT[key] = (costs, model, tuple(first))
    return first


def _first_alike(costs: LayerCosts, model: ModelSpec, layers: range) -> list[int]:
    seen: dict = {}
    first = []
    for row, i in enumerate(layers):
        previous = model.layers[i - 1].output_bytes if i > 0 else model.input_bytes
        try:
            key = (replace(model.layers[i], index=0, name=""), previous, costs.forward[i], costs.backward[i])
            first.append(seen.setdefault(key, row))
        except TypeError:
            first.append(row)
    return first
