"""Issue 46: the input size a plan is for, and where it came from, is always said.

`paraplan plan --model llama2-7b` silently planned at 32 tokens (CSIMD Table V's setting, kept for
the reproductions); a hub name answered "no such config file"; the zoo had no model at today's
published context lengths.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli_here

from paraplan.models import source
from paraplan.workload import size_note


@pytest.mark.parametrize("reference, flags, expected", [
    ("llama2-7b", {}, "seq 32 (the zoo's setting for llama2-7b: CSIMD Table V"),
    ("llama2-7b", {"seq_len": 4096}, "seq 4096 (--seq-len)"),
    ("llama2-7b?seq_len=128", {}, "seq 128 (the model reference's seq_len=128)"),
    ("llama3.1-8b", {}, "seq 8192 (the zoo's setting for llama3.1-8b"),
    ("vit-tiny", {}, "image 32x32 (the zoo's setting for vit-tiny"),
    ("vit-tiny", {"image_size": 48}, "image 48x48 (--image-size)"),
    ("t5-tiny", {}, "seq 32, decoder 8 (the zoo's setting"),
    ("hf:qwen2?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=2",
     {}, "seq 512 (paraplan's default for hf: models, 512, capped at the config's positions"),
])
def test_the_note_says_the_size_and_where_it_came_from(reference, flags, expected):
    built = source.build(reference, **flags)
    assert size_note(built, **flags).startswith(expected)


def test_plan_inspect_and_simulate_print_the_size(capsys, tmp_path):
    plan = tmp_path / "p.json"
    res = run_cli_here(capsys, "plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--batch", "64",
                       "--planner", "csimd", "--out", str(plan))
    assert res.returncode == 0 and "input: seq 32 (the zoo's setting for llama2-7b" in res.stdout
    assert "--seq-len N to change" in res.stdout
    res = run_cli_here(capsys, "simulate", str(plan))
    assert "input: seq 32 (the zoo's setting for llama2-7b" in res.stdout
    res = run_cli_here(capsys, "inspect", "llama2-7b", "--seq-len", "4096")
    assert "input: seq 4096 (--seq-len)" in res.stdout
    res = run_cli_here(capsys, "inspect", "gpt2-tiny", "--json")
    assert json.loads(res.stdout)["input_note"].startswith("seq 32 (the zoo's setting for gpt2-tiny")


def test_the_comparison_prints_the_size(capsys, tmp_path):
    res = run_cli_here(capsys, "plan", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--out",
                       str(tmp_path / "p.json"), "--time-limit", "30")
    assert res.returncode == 0 and "input: image 32x32 (the zoo's setting for lenet-5" in res.stdout


def test_a_hub_name_says_where_configs_come_from_and_names_the_zoo_entry(capsys):
    res = run_cli_here(capsys, "inspect", "hf:meta-llama/Llama-3.1-8B")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "reads no model hub" in res.stderr and "hf:path/to/config.json" in res.stderr
    assert "llama3.1-8b" in res.stderr


def test_a_directory_holding_a_config_is_read(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}))
    res = run_cli_here(capsys, "inspect", f"hf:{tmp_path}")
    assert res.returncode == 0, res.stderr
