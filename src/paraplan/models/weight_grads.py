"""The gradients torch's split backward keeps from its input-gradient pass (I) to its weight-gradient
pass (W), measured on a layer's autograd graph (models/measure.py: `weight_grad_input_bytes`; the
zero-bubble schedules hold them between a micro-batch's I and its W).
"""

from __future__ import annotations

import torch

from paraplan.models.tensors import tensors


def _node(t: torch.Tensor):
    """The autograd node a tensor's gradient enters: its grad_fn, or a leaf's AccumulateGrad."""
    if t.grad_fn is not None:
        return t.grad_fn
    return t.view_as(t).grad_fn.next_functions[0][0] if t.requires_grad else None


def gradients_kept_for_weights(outputs: list[torch.Tensor], x, params: list[torch.Tensor]) -> list[int]:
    """Hooks that record, during the backward, the bytes of the gradients torch's split backward keeps
    from its input-gradient pass (I) to its weight-gradient pass (W): the gradients entering the
    nodes where a weight's path meets the input's path (the matmul that uses a weight: the
    gradient of its output). The same nodes as torch.distributed.pipelining._backward's
    get_param_groups (its `intermediates`), found the same way: the nodes reachable back from the
    input, met first when walking back from each weight. Returns the list the hooks fill."""
    kept: list[int] = []
    roots = [n for n in map(_node, outputs) if n is not None]
    consumers: dict = {}  # node -> the nodes that take its output (the graph's reverse edges)
    queue, seen = list(roots), set(roots)
    while queue:
        node = queue.pop()
        for fn, _ in node.next_functions:
            if fn is not None:
                consumers.setdefault(fn, []).append(node)
                if fn not in seen:
                    seen.add(fn)
                    queue.append(fn)

    def closure(starts, stop_at=frozenset()):
        reached, met, queue = set(starts), set(), list(starts)
        while queue:
            for fn in consumers.get(queue.pop(), ()):
                if fn in reached:
                    continue
                if fn in stop_at:
                    met.add(fn)
                    continue
                reached.add(fn)
                queue.append(fn)
        return reached, met

    from_input, _ = closure([n for n in map(_node, [t for t in tensors(x) if t.requires_grad]) if n is not None])
    meeting = set()
    for p in params:
        node = _node(p)
        if node is not None and node in seen:
            meeting |= closure([node], frozenset(from_input))[1]

    def record(grad_outputs):
        kept.append(sum(g.numel() * g.element_size() for g in grad_outputs if g is not None))

    for node in meeting:
        node.register_prehook(record)
    return kept
