"""Layers priced alike: an LLM's blocks are one layer repeated, and every per-layer price of a
strategy (costs/strategy.py: strategy_arrays) reads only the layer's spec, its input and its cost
functions, so a search prices each distinct layer once (issue 51 item 2: a third of a Galvatron
search's time at 1,024 GPUs went to pricing the same block 80 times)."""

from __future__ import annotations

from dataclasses import replace

from paraplan.costs.timefn import LayerCosts
from paraplan.models.spec import ModelSpec


def first_alike(costs: LayerCosts, model: ModelSpec, layers: range) -> list[int]:
    """For each row of `layers`, the first row whose layer every price of `strategy_arrays` reads
    alike: the same spec but for its place, the same input (the previous layer's output, which
    layer_memory reads) and the same cost functions. An 80-block Llama prices 3 layers, not 82.
    Cost functions that cannot be hashed (a measured profile's arrays) keep their row."""
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
