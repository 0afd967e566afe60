"""What the operator-graph planners (FD-DPS and its baselines) know about a model: a DAG of the
forward and backward operators of one training iteration.

Pure data, like models/spec.py: built once by `paraplan.models.op_trace` on the meta device,
then handed to cost models, planners and the simulator, which never touch torch.

FD-DPS Definition 1: G(O, E), O the operators, E the data dependencies. Every per-node and
per-edge quantity is affine in the batch the graph runs (`Affine.at(batch)`), fitted from two
traces of the same structure, so a planner can price the whole graph at any batch (data
parallelism: the graph at batch / n per device; an intra-operator batch split: the operator at
batch / k) without tracing again.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.models.spec import Affine

OP_GRAPH_VERSION = 1


@dataclass(frozen=True)
class OpNode:
    """One operator of the iteration (an aten kernel, or a part of one after a split).

    `name` is stable: the same model rebuilt gives the same names, so a plan's operator names
    resolve again ("fwd:layer3.1.conv2:convolution", "bwd:layer3.1.conv2:convolution_backward",
    "fwd:layer3.1.conv2:convolution/part1").
    """

    name: str
    op: str  # the aten operator, e.g. "convolution", "mm", "convolution_backward"
    phase: str  # "forward" | "backward" | "optimizer"
    module: str  # the module path it ran in ("" for the model's top level)
    layer: int  # the ModelSpec layer it belongs to (grouping, Gantt colours); -1 when none
    flops: Affine  # torch.utils.flop_counter's count; 0 for memory-bound ops
    bytes_accessed: Affine  # bytes read + written (inputs and outputs), for memory-bound ops
    output_bytes: Affine  # what it produces (the tensors its out-edges carry, counted once)
    param_bytes: int  # parameter bytes it reads (forward) or whose gradients it writes (backward)
    # the dimension an intra-operator split may cut (FD-DPS Sec. 4.1): "batch" | "channel" | ""
    splittable: str = ""
    forward_of: str = ""  # a backward node: the forward node whose autograd Node it is ("" for none)


@dataclass(frozen=True)
class OpEdge:
    """A data dependency o_src -> o_dst carrying `nbytes` (FD-DPS Definition 1's e_(i,j))."""

    src: int  # index into OpGraph.nodes
    dst: int
    nbytes: Affine


@dataclass(frozen=True)
class OpGraph:
    """The DAG of one training iteration of `model` (a model reference text), nodes in a
    topological order (every edge goes from a lower index to a higher one)."""

    model: str
    nodes: tuple[OpNode, ...]
    edges: tuple[OpEdge, ...]
    traced_batches: tuple[int, int]  # the two batches the affine values were fitted from
    version: int = OP_GRAPH_VERSION

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    def index(self) -> dict[str, int]:
        """name -> node index."""
        return {n.name: i for i, n in enumerate(self.nodes)}
