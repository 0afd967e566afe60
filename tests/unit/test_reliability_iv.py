"""Issue 46 (Reliability IV): today's models at first contact, silent wrong answers, the API's errors.

Each case failed on the main of 2026-11-27: a traceback (exit 1), a plan that ran other than
predicted, or a raw RuntimeError / ValueError / TypeError from the Python API. Each now gives one
line and exit status 2 on the command line and a ParaplanError from the API, or the fixed behaviour.
The runs of such models on real processes are in tests/distributed/test_any_model.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli_here

import paraplan
from paraplan.errors import ParaplanError

DATA = Path(__file__).resolve().parent.parent / "data"
EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "gpt2-tiny-local-1f1b-2x4.json"
MOE = {
    "mixtral": "hf:mixtral?num_hidden_layers=2&hidden_size=64&intermediate_size=128&num_attention_heads=4"
               "&num_key_value_heads=2&num_local_experts=4&vocab_size=256",
    "qwen3_moe": "hf:qwen3_moe?num_hidden_layers=2&hidden_size=64&moe_intermediate_size=32&num_attention_heads=4"
                 "&num_key_value_heads=2&num_experts=8&vocab_size=256",
    "deepseek_v2": "hf:deepseek_v2?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&vocab_size=256",
}


def one_line(res) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    return res.stderr


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_mixture_of_experts_config_is_measured_and_planned(capsys, family):
    """Since issue 50's model description (models/moe_spec.py, moe_static.py) an MoE model is measured
    on meta with its routed FLOPs and planned (without expert parallelism yet); it was refused before."""
    assert run_cli_here(capsys, "inspect", MOE[family]).returncode == 0
    plan = paraplan.plan(MOE[family], "local", batch=8, planner="even", precision="fp32")
    assert plan.prediction.feasible


def test_a_mixture_of_experts_without_a_top_k_is_refused_in_one_line(capsys):
    """DeepSeek-V2's default config has no top-k (None): one line naming it, not a crash in topk."""
    for args in (("inspect", MOE["deepseek_v2"]),
                 ("plan", "--model", MOE["deepseek_v2"], "--cluster", "local", "--batch", "8", "--planner", "even")):
        line = one_line(run_cli_here(capsys, *args))
        assert "mixture of experts" in line and "num_experts_per_tok" in line
    with pytest.raises(ParaplanError, match="num_experts_per_tok"):
        paraplan.plan(MOE["deepseek_v2"], "local", batch=8, planner="even", precision="fp32")


def test_deepseek_v3_cut_to_its_dense_blocks_is_not_taken_for_a_mixture(capsys):
    """DeepSeek-V3's first three blocks are dense (first_k_dense_replace): two of them plan."""
    res = run_cli_here(capsys, "inspect", "hf:deepseek_v3?num_hidden_layers=2&hidden_size=64&vocab_size=256"
                       "&num_attention_heads=4")
    assert res.returncode == 0, res.stderr


def test_a_failure_inside_the_models_forward_is_one_line_naming_model_step_and_advice(capsys, tmp_path):
    stand_in = tmp_path / "raises.py"
    stand_in.write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Bad(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.a = nn.Linear(16, 16)\n"
        "    def forward(self, x):\n        raise RuntimeError('stand-in failure inside forward')\n\n"
        "def build():\n    return nn.Sequential(nn.Linear(16, 16), Bad()), torch.randn(8, 16)\n")
    for args in (("inspect", f"{stand_in}:build"),
                 ("plan", "--model", f"{stand_in}:build", "--cluster", "local", "--batch", "8"),
                 ("profile", f"{stand_in}:build", "--batch-sizes", "2,4", "--repeats", "1", "--out",
                  str(tmp_path / "p.json"))):
        line = one_line(run_cli_here(capsys, *args))
        assert f"model {stand_in}:build" in line and "stand-in failure inside forward" in line
        assert "failed" in line and ("--layers" in line or "one process" in line)
    assert not (tmp_path / "p.json").exists()
    with pytest.raises(ParaplanError, match="measuring its layers on the meta device failed"):
        paraplan.plan(f"{stand_in}:build", "local", batch=8, planner="even")


def test_a_failure_inside_paraplans_own_code_keeps_its_traceback(monkeypatch):
    """A bug of paraplan's is not passed off as the model's (errors.py: it keeps its traceback)."""
    from paraplan.models import measure
    from paraplan.models.moe_check import moe_summary

    # the innermost frame is paraplan's: moe_summary(None) fails on None.named_modules()
    monkeypatch.setattr(measure, "measure_layers", lambda *args, **kwargs: moe_summary(None))
    with pytest.raises(AttributeError):
        paraplan.plan("lenet-5", "local", batch=8, planner="even")


@pytest.mark.parametrize("layers", [None, "blocks"])
def test_a_parameter_and_a_buffer_of_the_root_module_stay_in_the_layer_that_reads_them(capsys, layers):
    from paraplan.models import measure, source

    reference = f"{DATA / 'root_param.py'}:build"
    built = source.build(reference, layers=layers)
    spec = measure.measure(built)
    whole = sum(p.numel() for p in built.module.parameters())
    assert sum(layer.param_count for layer in spec.layers) == whole  # pos counted once, in the first layer
    assert spec.layers[0].param_count == 16 * 32 + 32 + 32
    args = ("inspect", reference) + (("--layers", layers) if layers else ())
    assert run_cli_here(capsys, *args).returncode == 0


def test_stages_of_different_widths_with_strategies_are_one_line(capsys, tmp_path):
    strategy = {"dp": 1, "sdp": 1, "tp": 1, "recompute": "none"}
    plan = {"format_version": 2, "model": "gpt2-tiny", "cluster": "galvatron-8xtitan", "n_layers": 6,
            "global_batch": 16, "n_micro": 2, "precision": "fp32", "schedule": {"kind": "1f1b", "virtual_stages": 1},
            "grad_sync": "bucketed",
            "stages": [{"layers": [0, 2], "devices": [0, 1, 2, 3], "strategies": [{**strategy, "dp": 4}] * 2},
                       {"layers": [2, 4], "devices": [4, 5], "strategies": [{**strategy, "dp": 2}] * 2},
                       {"layers": [4, 6], "devices": [6], "strategies": [strategy] * 2}]}
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(plan))
    for extra in ((), ("--schedules",), ("--gantt", str(tmp_path / "g.png"))):
        line = one_line(run_cli_here(capsys, "simulate", str(path), *extra))
        assert "(4, 2, 1)" in line and "plain pipeline stages may differ in width" in line
    assert not (tmp_path / "g.png").exists()
    with pytest.raises(ParaplanError, match="different numbers of devices"):
        paraplan.simulate(path)


@pytest.mark.parametrize("call, match", [
    (lambda: paraplan.plan("lenet-5", "local", batch=8, planner="even", bogus=1), "unexpected keyword 'bogus'"),
    (lambda: paraplan.compare("lenet-5", "local", batch=8, stage=2), "did you mean 'stages'"),
    (lambda: paraplan.plan("lenet-5", "local", batch=8, planner="even", options=3), "options: expected a dict"),
    (lambda: paraplan.compare("lenet-5", "local", batch=8, time_limit=-1), "time_limit: must be a positive"),
    (lambda: paraplan.plan("lenet-5", "local", batch=8, time_limit="soon"), "time_limit: must be a positive"),
    (lambda: paraplan.simulate(3), "simulate: expected a Plan or the path"),
    (lambda: paraplan.export(None, to="megatron"), "export: expected a Plan or the path"),
    (lambda: paraplan.load_plan(7), "load_plan: expected the path"),
    (lambda: paraplan.plan(None, "local", batch=8, planner="even"), "model: expected a model reference"),
    (lambda: paraplan.plan("lenet-5", "local", batch=8, planner=None), "planner: expected a planner's name"),
    (lambda: paraplan.plan("lenet-5", "local", batch=True, planner="even"), "batch: must be a positive whole"),
    (lambda: paraplan.plan("lenet-5", "local", batch=8, planner="csimd", stages="2"), "stages: must be a whole"),
    (lambda: paraplan.plan("lenet-5", "local", batch=8, try_top="2"), "try_top: must be a whole number"),
    (lambda: paraplan.export(paraplan.load_plan(EXAMPLE), to=None), "to= names an engine"),
])
def test_the_api_answers_every_refusal_with_a_paraplan_error(call, match):
    with pytest.raises(ParaplanError, match=match):
        call()


def test_the_api_refuses_a_bad_training_call_before_any_process_starts(tmp_path):
    plan = paraplan.plan("lenet-5", "local", batch=8, planner="even")
    with pytest.raises(ParaplanError, match="unexpected keyword 'bogus'"):
        paraplan.train(plan, steps=1, bogus=2)
    with pytest.raises(ParaplanError, match="steps: must be a whole number"):
        paraplan.train(plan, steps="3")
    with pytest.raises(ParaplanError, match="lr: must be a number"):
        paraplan.train(plan, steps=1, lr="x")
    with pytest.raises(ParaplanError, match="nproc: must be a positive whole number"):
        paraplan.train(plan, steps=1, nproc=0, out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_dir_shows_the_api():
    names = dir(paraplan)
    assert {"plan", "compare", "simulate", "train", "export", "load_plan", "ParaplanError"} <= set(names)


def test_tensor_parallelism_on_a_block_it_cannot_shard_is_never_planned_nor_run(capsys, tmp_path):
    """A user's block whose Linears are no pair paraplan's TP knows ran replicated under TP, at twice
    the predicted states (4.84 MiB per rank measured against 2.77 predicted)."""
    from dataclasses import replace

    from paraplan.plans.plan import LayerStrategy
    from paraplan.plans.plan_file import write_plan

    reference = f"{DATA / 'custom_block.py'}:build"
    line = one_line(run_cli_here(capsys, "plan", "--planner", "tp", "--model", reference, "--cluster", "local",
                                 "--batch", "8", "--out", str(tmp_path / "tp.json")))
    assert "runs no tensor parallelism on layer 0" in line and not (tmp_path / "tp.json").exists()
    best = paraplan.plan(reference, "local", batch=8, planner="galvatron-bmw")
    assert all(st.tp == 1 for stage in best.stages for st in stage.strategies)
    # a hand-made TP plan: the simulator says it cannot run, and train refuses it before launch
    even = paraplan.plan(reference, "local", batch=8, planner="dp")
    tp = replace(even, stages=tuple(replace(s, strategies=tuple(LayerStrategy(tp=2) for _ in s.strategies))
                                    for s in even.stages), prediction=None)
    sim = paraplan.simulate(tp)
    assert not sim.prediction.feasible and "cannot shard" in sim.prediction.reason
    write_plan(tp, tmp_path / "hand.json")
    line = one_line(run_cli_here(capsys, "train", "--plan", str(tmp_path / "hand.json"), "--steps", "1",
                                 "--out-dir", str(tmp_path / "run")))
    assert "no tensor-parallel plan for its Linears" in line and "replicated" in line
    assert not (tmp_path / "run").exists()


def test_torchtitan_export_of_a_model_it_cannot_train_is_one_line_naming_what_it_trains(capsys, tmp_path):
    plan = tmp_path / "lenet.json"
    assert run_cli_here(capsys, "plan", "--planner", "even", "--model", "lenet-5", "--cluster", "local", "--batch",
                        "8", "--out", str(plan)).returncode == 0
    line = one_line(run_cli_here(capsys, "export", str(plan), "--to", "torchtitan", "--out", str(tmp_path / "t.args")))
    assert "trains its own model definitions only" in line and "llama3" in line
    assert not (tmp_path / "t.args").exists()


def test_train_with_no_ranks_is_one_line(capsys, tmp_path):
    plan = tmp_path / "p.json"
    run_cli_here(capsys, "plan", "--planner", "even", "--model", "lenet-5", "--cluster", "local", "--batch", "8",
                 "--out", str(plan))
    line = one_line(run_cli_here(capsys, "train", "--plan", str(plan), "--nproc", "0", "--out-dir",
                                 str(tmp_path / "run")))
    assert "--nproc" in line and not (tmp_path / "run").exists()


def test_an_output_the_system_refuses_at_write_time_is_one_line(capsys, tmp_path):
    """/proc passes the permission checks made before the work; its refusal at the write was a
    FileNotFoundError traceback (plan --out, simulate --trace, profile --out)."""
    plan = tmp_path / "p.json"
    run_cli_here(capsys, "plan", "--planner", "even", "--model", "lenet-5", "--cluster", "local", "--batch", "8",
                 "--out", str(plan))
    for args in (("plan", "--planner", "even", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--out",
                  "/proc/paraplan-plan.json"),
                 ("simulate", str(plan), "--trace", "/proc/paraplan-trace.json")):
        assert "cannot write /proc/" in one_line(run_cli_here(capsys, *args))


def test_megatron_grid_with_no_layout_for_the_batch_is_one_line_and_galvatron_still_plans(capsys):
    """A batch of 1 on 16 GPUs: no uniform layout gives every data-parallel rank a sample; the grid
    raised AssertionError inside megatron-grid and inside Galvatron-BMW's final choice."""
    common = ("--model", "llama2-7b", "--seq-len", "4096", "--cluster", "dgx-a100-80gb", "--batch", "1",
              "--precision", "bf16")
    line = one_line(run_cli_here(capsys, "plan", "--planner", "megatron-grid", *common))
    assert "no uniform layout of 16 devices for a global batch of 1" in line
    assert run_cli_here(capsys, "plan", "--planner", "galvatron-bmw", *common).returncode == 0


def test_a_refused_model_is_refused_before_this_machine_is_measured(capsys, tmp_path, monkeypatch):
    """On `local` with no calibration cached, `plan` measured the machine for a minute, then refused
    the model (an MoE config without a top-k here); the model is now checked first (cli/machine.py:
    machine_cluster's check)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    line = one_line(run_cli_here(capsys, "plan", "--model", MOE["deepseek_v2"], "--cluster", "local", "--batch", "8",
                                 "--planner", "even", "--precision", "bf16"))
    assert "mixture of experts" in line and "--no-calibration" not in line
    assert not list((tmp_path / "empty-cache").rglob("*.toml"))


def _attention_and_mlp(up: str, down: str, third: str | None = None):
    """A block with an attention paraplan's TP knows (q/k/v/o) and an MLP named `up`/`down`."""
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = 8
            self.q, self.k, self.v, self.o = (nn.Linear(32, 32) for _ in range(4))

    block = nn.Module()
    block.attn = Attention()
    block.mlp = nn.Module()
    for name in (up, down) + ((third,) if third else ()):
        setattr(block.mlp, name, nn.Linear(32, 32))
    return block


def test_outside_the_zoo_a_block_whose_mlp_tp_cannot_shard_is_refused_not_half_sharded():
    """Review of issue 46's fix: an attention TP knows beside an MLP it does not shard the attention
    alone; for a model outside the zoo (`strict`) that is refused, and Meta's w1/w2/w3 MLP is known."""
    from paraplan.runtime.layers.tensor_parallel import tp_refusal

    half = _attention_and_mlp("up", "down")
    assert tp_refusal(half, 2) is None  # the zoo's rule: the rest of a block may stay replicated
    assert "mlp.up, mlp.down" in tp_refusal(half, 2, strict=True)
    assert tp_refusal(_attention_and_mlp("w1", "w2", "w3"), 2, strict=True) is None


def test_simulate_refuses_tp_where_the_runtime_cannot_run_it_as_the_api_does(capsys, tmp_path):
    from dataclasses import replace

    from paraplan.plans.plan import LayerStrategy
    from paraplan.plans.plan_file import write_plan

    reference = f"{DATA / 'custom_block.py'}:build"
    even = paraplan.plan(reference, "local", batch=8, planner="dp")
    tp = replace(even, stages=tuple(replace(s, strategies=tuple(LayerStrategy(tp=2) for _ in s.strategies))
                                    for s in even.stages), prediction=None)
    write_plan(tp, tmp_path / "tp.json")
    res = run_cli_here(capsys, "simulate", str(tmp_path / "tp.json"), "--json")
    prediction = json.loads(res.stdout)
    assert not prediction["feasible"] and "cannot shard" in prediction["reason"]


def test_a_zoo_models_failure_outside_paraplan_is_one_line_saying_it_is_paraplans_to_fix(monkeypatch):
    import torch

    from paraplan.models import measure

    # raised inside torch (a C function: the innermost Python frame is this stand-in, not paraplan's)
    monkeypatch.setattr(measure, "measure_layers", lambda *args, **kwargs: torch.empty(0).item())
    with pytest.raises(ParaplanError, match="it is a zoo model, paraplan's own definition"):
        paraplan.plan("lenet-5", "local", batch=8, planner="even")
