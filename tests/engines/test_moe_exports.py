"""Issue 50 item 6: a mixture of experts' expert layout exported to the installed engines and loaded
by their own configuration code (tests/engines/engine_check.py, in a child process): Megatron-LM's
MoE arguments and megatron-core 0.16.1's TransformerConfig (experts, top-k, EP, ETP, the all-to-all
dispatcher, alltoall or DeepEP's flex), torchtitan 0.3.0's expert_parallel_degree through its ParallelDims under its rule
dp_shard x cp x tp = efsdp x ep; Megatron-LM's all-to-all overlap as megatron-core's own field; what an
engine cannot run refused in one line (torchtitan: expert tensor parallelism, EP over plain replicas,
the all-to-all overlap; DeepSpeed: expert parallelism at all)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.engines import engine_problem, export, model_shape
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage, validate

QWEN3_MOE = ("hf:qwen3_moe?num_hidden_layers=2&hidden_size=64&intermediate_size=128&moe_intermediate_size=32"
             "&num_attention_heads=4&num_key_value_heads=2&head_dim=32&num_local_experts=8&num_experts_per_tok=2"
             "&vocab_size=256&seq_len=64")
CHECK = Path(__file__).with_name("engine_check.py")


@pytest.fixture(scope="module")
def shape():
    return model_shape(QWEN3_MOE)


def _plan(shape, dense: LayerStrategy, moe: LayerStrategy, overlap: bool = False, dispatcher: str = "alltoall") -> Plan:
    n = len(shape.kinds)
    strategies = tuple(moe if kind == "block" else dense for kind in shape.kinds)
    return validate(Plan(model=QWEN3_MOE, cluster="dgx-h100-80gb", n_layers=n, global_batch=16, n_micro=1,
                         schedule="gpipe", stages=(Stage(LayerRange(0, n), tuple(range(8)), strategies=strategies),),
                         precision="bf16", expert_overlap=overlap, expert_dispatcher=dispatcher))


PLANS = {  # name: (dense strategy, the MoE blocks' strategy)
    "fsdp8-ep8": (LayerStrategy(sdp=8), LayerStrategy(sdp=8, ep=8)),
    "zero1-tp2-ep4": (LayerStrategy(dp=4, tp=2, sequence_parallel=True, zero=1),
                      LayerStrategy(dp=4, tp=2, sequence_parallel=True, zero=1, ep=4)),
    "dp4-tp2-ep2-etp2": (LayerStrategy(dp=4, tp=2, sequence_parallel=True),
                         LayerStrategy(dp=4, tp=2, sequence_parallel=True, ep=2, etp=2)),
    "dp8-ep8": (LayerStrategy(dp=8), LayerStrategy(dp=8, ep=8)),
    # Megatron-LM's all-to-all overlap (plans/expert_overlap.py), its own TransformerConfig field
    "fsdp8-ep8-overlap": (LayerStrategy(sdp=8), LayerStrategy(sdp=8, ep=8)),
    # DeepEP's dispatcher (plans/expert_dispatch.py): megatron-core's flex dispatcher with its DeepEP backend
    "fsdp8-ep8-deepep": (LayerStrategy(sdp=8), LayerStrategy(sdp=8, ep=8)),
}
REFUSED = {("dp4-tp2-ep2-etp2", "torchtitan"): "expert tensor parallelism",
           ("dp8-ep8", "torchtitan"): "never plain data-parallel replicas",
           ("fsdp8-ep8-overlap", "torchtitan"): "all-to-all overlap",
           **{(name, "deepspeed"): "expert parallelism" for name in PLANS}}


@pytest.fixture(scope="module")
def loaded(shape, tmp_path_factory):
    out = tmp_path_factory.mktemp("moe-exports")
    cases, plans = [], {}
    for name, (dense, moe) in PLANS.items():
        plan = plans[name] = _plan(shape, dense, moe, overlap=name.endswith("-overlap"),
                                   dispatcher="deepep" if name.endswith("-deepep") else "alltoall")
        for engine in ("torchtitan", "megatron"):
            if engine_problem(plan, engine, shape) is not None:
                continue
            path = out / f"{name}.{engine}"
            path.write_text(export(plan, engine, shape).text)
            cases.append({"id": f"{name}/{engine}", "engine": engine, "path": str(path), "world": 8,
                          "data_parallel": 8 // moe.tp, "torchtitan_config": "llama3_8b", "layers": shape.layers,
                          "params": list(shape.params)})
    (out / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, str(CHECK), str(out / "cases.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), plans


@pytest.mark.parametrize("name", list(PLANS))
@pytest.mark.parametrize("engine", ["torchtitan", "megatron", "deepspeed"])
def test_each_expert_layout_loads_in_the_engine_or_is_refused_in_one_line(shape, loaded, name, engine):
    results, plans = loaded
    problem = engine_problem(plans[name], engine, shape)
    if (name, engine) in REFUSED:
        assert problem is not None and REFUSED[name, engine] in problem and "\n" not in problem
        return
    assert problem is None, problem
    result = results[f"{name}/{engine}"]
    assert result["ok"], result["error"]
    read, (_, moe) = result["read"], PLANS[name]
    assert read["ep"] == moe.ep
    if engine == "megatron":
        # the experts and their layout as megatron-core's TransformerConfig holds them
        deepep = name.endswith("-deepep")
        assert (read["experts"], read["top_k"], read["etp"], read["dispatcher"]) == \
            (8, 2, moe.etp, "flex" if deepep else "alltoall")
        assert ("--moe-flex-dispatcher-backend=deepep" in read["arguments"]) is deepep
        assert not deepep or read["flex_backend"] == "deepep"
        assert "--qk-layernorm" in read["arguments"] and "--kv-channels=32" in read["arguments"]
        # the all-to-all overlap: megatron-core's own checks of it passed (TransformerConfig.__post_init__)
        assert read["a2a_overlap"] is name.endswith("-overlap")
        assert ("--overlap-moe-expert-parallel-comm" in read["arguments"]) is name.endswith("-overlap")
