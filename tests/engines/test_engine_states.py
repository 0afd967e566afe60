"""Issue 48, item 2's states: each engine's model states per parameter (costs/engine_states.py)
against the engine's own account: DeepSpeed 0.19.8's estimators, run here in a child process (as
tests/engines/engine_check.py runs the engines' configuration code), and Megatron-LM's table of
bytes per parameter (megatron-core's user guide, "Distributed Optimizer")."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paraplan.costs.engine_states import (
    deepspeed_states,
    deepspeed_zero3_buffer_bytes,
    fsdp2_states,
    megatron_states,
)
from paraplan.costs.transformer_memory import state_bytes_per_param

# (parameters, largest layer's parameters, GPUs per node, nodes): a 7B Llama on 8 GPUs, a 70B one on
# 64, a small model on one GPU, and 1.3B over 2 nodes of 4
CASES = [(6_738_415_616, 131_072_000, 8, 1), (70_553_706_496, 1_050_673_152, 8, 8), (124_439_808, 38_597_376, 1, 1),
         (1_315_575_808, 103_022_592, 4, 2)]
DEEPSPEED = """
import json, sys, warnings, logging, contextlib, io
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
out = []
for total, largest, per_node, nodes in json.loads(sys.argv[1]):
    _, zero2 = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=False)
    _, zero3, _ = estimate_zero3_model_states_mem_needs(total, largest, per_node, nodes, cpu_offload=False)
    out.append([zero2, zero3])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def deepspeed_estimates():
    res = subprocess.run([sys.executable, "-c", DEEPSPEED, json.dumps(CASES)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)))
def test_deepspeed_zero2_and_zero3_are_its_own_estimators(case, deepspeed_estimates):
    total, largest, per_node, nodes = CASES[case]
    n = per_node * nodes
    zero2, zero3 = deepspeed_estimates[case]
    # DeepSpeed rounds each term down to whole bytes: within 1 byte per term
    assert abs(deepspeed_states(2, n).total * total - zero2) <= 2
    assert abs(deepspeed_states(3, n).total * total + deepspeed_zero3_buffer_bytes(largest) - zero3) <= 2


def test_deepspeed_keeps_more_than_the_zero_paper_counts():
    """The ZeRO paper's 2 + 14/N (ZeRO-2) and 16/N (ZeRO-3) are a lower bound: DeepSpeed keeps fp32
    gradients beside the 16-bit ones, 2 + 18/N and 18/N."""
    for n in (1, 8, 64):
        assert deepspeed_states(2, n).total == pytest.approx(2 + 18 / n)
        assert deepspeed_states(3, n).total == pytest.approx(18 / n)
        assert deepspeed_states(2, n).total > state_bytes_per_param(True, 2, n).total
        assert deepspeed_states(3, n).total > state_bytes_per_param(True, 3, n).total
    assert deepspeed_states(1, 8).total == pytest.approx(4 + 16 / 8)


@pytest.mark.parametrize("dtype, plain, distributed", [("fp16", 20, (4, 16)), ("bf16", 18, (6, 12)),
                                                        ("fp32", 16, (8, 8))])
def test_megatron_is_its_guides_table(dtype, plain, distributed):
    """megatron-core's user guide, Distributed Optimizer: bytes per parameter, not distributed and
    distributed over d data-parallel ranks (6 + 12/d for bf16 parameters and fp32 gradients)."""
    assert megatron_states(dtype, 64, distributed_optimizer=False).total == plain
    for d in (1, 2, 8, 128):
        assert megatron_states(dtype, d).total == pytest.approx(distributed[0] + distributed[1] / d)


def test_fsdp2_shards_every_fp32_state():
    assert fsdp2_states(1).total == 16 and fsdp2_states(8).total == 2
    assert fsdp2_states(8).parameters == 0.5  # fp32 weights sharded: the bf16 copies are transient


def test_nonsense_is_refused():
    with pytest.raises(ValueError, match="param_dtype"):
        megatron_states("fp8", 8)
    with pytest.raises(ValueError, match="zero_stage"):
        deepspeed_states(0, 8)
    with pytest.raises(ValueError, match="data_parallel"):
        fsdp2_states(0)
