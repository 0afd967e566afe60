"""Intra-operator parallelism along the batch: FD-DPS Sec. 4.1 on an operator graph (pure).

FD-DPS splits "computationally intensive operators" by a tensor dimension before scheduling; its
Fig. 2a is the data-parallel case: the input is cut along the batch axis, every device runs the
operator with "the entire convolution kernel tensor" on its slice, and "the result of the original
operator is collected from the outputs". Here a node `o` of an OpGraph becomes

    o/part0 .. o/part{d-1}   each on 1/d of the batch
    o/gather                 the concatenation of the parts' outputs (for a backward node also
                             the sum of the d weight-gradient partials)

and every consumer of `o` reads from `o/gather`. Values stay affine in the batch b of the whole
iteration: a part carries the batch-proportional share per_sample / d and all of the fixed part
(each part reads the whole weight; a backward part writes a whole weight-gradient partial), so
sum(parts) = original + (d - 1) * fixed.

Rules (the paper names the operators and the axis, not a threshold nor a degree):
  - which nodes: `splittable == "batch"` (models/op_trace.py: convolutions, batch-leading matmuls
    and their backward; never the parameter-heavy fully connected layer) whose FLOPs at `batch`
    are at least `min_share` of the graph's total; by default `min_share` is the mean share of an
    operator that has FLOPs (1 / their count), i.e. "computationally intensive" = above average.
  - the degree: `degree` (the number of devices the parts may go to) capped by `batch`, so every
    part has at least one sample; with a cap below 2 nothing is split. The parts are priced as
    even shares (exact when d divides the batch).
  - gather FLOPs: (d - 1) additions per element of the fixed output (the weight gradients, in
    `dtype_bytes`-byte elements); concatenation moves bytes and has none. Its bytes: it reads the
    d parts' outputs and writes the original output.
  - named splits: `split_operators(graph, {name: degree})` makes exactly those splits (a saved
    plan's "x/part<i>" names), without threshold or cap; an unknown or unsplittable name is an error.
Names are the original's plus "/part<i>" and "/gather", so they stay stable across rebuilds;
the new nodes are inserted where the original stood, so the order stays topological.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from paraplan.errors import ParaplanError, require_positive
from paraplan.models.opspec import OpEdge, OpGraph, OpNode
from paraplan.models.spec import Affine


class OpSplitError(ParaplanError):
    """A split that cannot be made: an unknown operator, or one that has no batch to cut."""


def split_degree(degree: int, batch: int) -> int:
    """The number of parts: the devices, but never more parts than samples."""
    require_positive(degree, "the split degree")
    require_positive(batch, "the batch")
    return min(int(degree), int(batch))


def split_candidates(graph: OpGraph, batch: int, min_share: float | None = None) -> list[int]:
    """Indices of the nodes the rule of the module docstring splits at `batch`."""
    flops = [n.flops.at(batch) for n in graph.nodes]
    total = sum(flops)
    if total <= 0:
        return []
    if min_share is None:
        min_share = 1.0 / sum(1 for f in flops if f > 0)
    return [i for i, n in enumerate(graph.nodes) if n.splittable == "batch" and flops[i] >= min_share * total]


def _share(value: Affine, degree: int) -> Affine:
    return Affine(value.fixed, value.per_sample / degree)


def _parts_and_gather(node: OpNode, degree: int, dtype_bytes: int) -> tuple[list[OpNode], OpNode]:
    parts = [replace(node, name=f"{node.name}/part{i}", flops=_share(node.flops, degree),
                     bytes_accessed=_share(node.bytes_accessed, degree),
                     output_bytes=_share(node.output_bytes, degree), splittable="")
             for i in range(degree)]
    out = node.output_bytes
    gather = OpNode(
        name=f"{node.name}/gather", op="gather", phase=node.phase, module=node.module, layer=node.layer,
        flops=Affine((degree - 1) * out.fixed / dtype_bytes, 0.0),
        bytes_accessed=Affine((degree + 1) * out.fixed, 2 * out.per_sample),
        output_bytes=out,
        param_bytes=node.param_bytes if node.phase == "backward" else 0,  # it writes the summed gradients
        splittable="")
    return parts, gather


def _named_degrees(graph: OpGraph, degrees: Mapping[str, int]) -> dict[int, int]:
    index = graph.index()
    chosen = {}
    for name, d in degrees.items():
        if name not in index:
            raise OpSplitError(f"{graph.model} has no operator {name!r} to split (was the model changed?)")
        if graph.nodes[index[name]].splittable != "batch":
            raise OpSplitError(f"operator {name!r} of {graph.model} cannot be split along the batch")
        require_positive(d, f"the split degree of {name}")
        chosen[index[name]] = int(d)
    return chosen


def split_operators(graph: OpGraph, degree: int | Mapping[str, int], batch: int | None = None,
                    min_share: float | None = None, dtype_bytes: int = 4) -> OpGraph:
    """`graph` with its compute-intensive batch-splittable operators cut into `degree` parts
    (capped by `batch`, default the larger traced batch) plus a gather each.

    With a mapping {operator name: degree} (what a saved plan's "x/part<i>" names say), exactly
    those operators are split, each into its degree, without the threshold and the batch cap."""
    if isinstance(degree, Mapping):
        chosen = _named_degrees(graph, degree)
    else:
        batch = graph.traced_batches[1] if batch is None else batch
        d = split_degree(degree, batch)
        chosen = {i: d for i in split_candidates(graph, batch, min_share)} if d >= 2 else {}
    if not chosen:
        return graph
    nodes: list[OpNode] = []
    first: list[int] = []  # old index -> its first new index (a part, or the node itself)
    last: list[int] = []  # old index -> where its consumers read (the gather, or the node itself)
    for i, node in enumerate(graph.nodes):
        first.append(len(nodes))
        if i in chosen:
            parts, gather = _parts_and_gather(node, chosen[i], dtype_bytes)
            nodes.extend(parts)
            nodes.append(gather)
        else:
            nodes.append(node)
        last.append(len(nodes) - 1)
    edges: list[OpEdge] = []
    for e in graph.edges:
        src = last[e.src]
        if e.dst in chosen:  # each part reads its share of the batch-proportional input
            d = chosen[e.dst]
            edges.extend(OpEdge(src, first[e.dst] + k, _share(e.nbytes, d)) for k in range(d))
        else:
            edges.append(OpEdge(src, first[e.dst], e.nbytes))
    for i, d in chosen.items():
        out = graph.nodes[i].output_bytes
        edges.extend(OpEdge(first[i] + k, last[i], _share(out, d)) for k in range(d))
    edges.sort(key=lambda e: (e.src, e.dst))
    return replace(graph, nodes=tuple(nodes), edges=tuple(edges))


PART, GATHER = "/part", "/gather"


def split_degrees(names: Iterable[str]) -> dict[str, int]:
    """operator name -> number of parts, from the names of a placement."""
    degrees: dict[str, int] = {}
    for name in names:
        base, sep, part = name.rpartition(PART)
        if sep and part.isdigit():
            degrees[base] = max(degrees.get(base, 0), int(part) + 1)
    return degrees


def split_as_named(graph: OpGraph, names: Iterable[str]) -> OpGraph:
    """The graph with exactly the splits a plan's operator names show ("x/part0", "x/part1",
    "x/gather": x in two parts), so a saved 'dag' plan resolves against the rebuilt graph."""
    degrees = split_degrees(names)
    if not degrees:
        return graph
    return split_operators(graph, degrees)
