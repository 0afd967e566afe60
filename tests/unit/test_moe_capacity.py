"""Issue 50 item 5: token dropping at a capacity factor (models/moe_capacity.py) against a hand count,
and its price (costs/expert_costs.py: the busiest rank's expert work capped at the factor)."""

from __future__ import annotations

import pytest
import torch

from paraplan.errors import FieldError
from paraplan.models import measure, source
from paraplan.models.moe_capacity import capacity_keep


def test_each_expert_keeps_its_heaviest_copies_up_to_its_capacity():
    # 6 tokens, top-2 of 3 experts: 12 copies, an even share of 4 each; factor 1 -> capacity 4
    index = torch.tensor([[0, 1], [0, 2], [0, 1], [0, 2], [0, 1], [0, 1]])
    weight = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.6, 0.4], [0.7, 0.3], [0.5, 0.5], [0.8, 0.2]])
    keep = capacity_keep(index, weight, 3, 1.0)
    # by hand: expert 0 is offered 6 copies and keeps its 4 heaviest, 0.9, 0.8, 0.7, 0.6 (tokens 0,
    # 5, 3, 2), dropping tokens 1 and 4 (0.5 each); expert 1 is offered 4 (tokens 0, 2, 4, 5) and
    # expert 2 two (tokens 1, 3): all kept
    assert keep.tolist() == [[True, True], [False, True], [True, True], [True, True], [False, True], [True, True]]
    # factor 0.5: capacity 2; expert 0 keeps tokens 0 and 5; expert 1 its 0.5 and 0.4 (tokens 4, 2)
    keep = capacity_keep(index, weight, 3, 0.5)
    assert keep.tolist() == [[True, False], [False, True], [False, True], [False, True], [False, True], [True, False]]
    # ties keep token order: four copies of weight 0.5 for one expert, capacity 2 -> the first two
    tie = capacity_keep(torch.zeros(4, 1, dtype=torch.long), torch.full((4, 1), 0.5), 2, 1.0)
    assert tie.reshape(-1).tolist() == [True, True, False, False]


def test_a_capacity_below_the_busiest_ranks_load_caps_its_price():
    from paraplan.costs.expert_costs import imbalance_s
    from paraplan.plans.plan import LayerStrategy

    ref = ("hf:mixtral?num_hidden_layers=2&hidden_size=64&intermediate_size=128&num_attention_heads=4"
           "&num_key_value_heads=2&num_local_experts=4&num_experts_per_tok=2&vocab_size=256&seq_len=16")
    layers = {}
    for name, extra in (("dropless", ""), ("capped", "&capacity_factor=1.05"), ("halved", "&capacity_factor=0.5")):
        spec = measure.measure(source.build(ref + extra, device="meta"))
        layers[name] = next(x for x in spec.layers if x.experts is not None)
    ep2 = LayerStrategy(dp=2, ep=2)
    share = layers["dropless"].experts.routed_flops_per_token * 16 / layers["dropless"].forward_flops.at(1.0)
    assert imbalance_s(layers["dropless"], 1.0, ep2, 1.0) == pytest.approx(0.15 * share)  # the default 1.15
    assert imbalance_s(layers["capped"], 1.0, ep2, 1.0) == pytest.approx(0.05 * share)
    # under 1 every expert drops work, with or without ep
    assert imbalance_s(layers["halved"], 1.0, LayerStrategy(dp=2), 1.0) == pytest.approx(-0.5 * share)


def test_a_capacity_on_a_dense_model_is_refused_in_one_line():
    with pytest.raises(FieldError, match="no routed experts"):
        source.build("hf:llama?num_hidden_layers=2&hidden_size=64&intermediate_size=128&num_attention_heads=4"
                     "&vocab_size=256&capacity_factor=1.0", device="cpu")
