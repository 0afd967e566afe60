"""Issue 46, beyond tests/unit/test_input_note.py: the input note in every --json output, the cases
of models/input_note.py the command-line runs do not reach (a user's sample, a plan's stored
reference, hf's cap and image size), the Llama 3.1 entries' published shapes, and hub names
answered by what paraplan reads instead (the zoo's entry named only where it has that shape)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli_here

from paraplan.errors import FieldError
from paraplan.models import source, zoo
from paraplan.models.input_note import input_note
from paraplan.models.spec import InputSpec

TOKENS_128 = InputSpec(kind="tokens", seq_len=128, vocab_size=512)


@pytest.mark.parametrize("reference, inputs, flag, expected", [
    # a plan stores its model with the sizes it was made at: simulate says where they came from
    ("gpt2-tiny?seq_len=128", TOKENS_128, None, "seq 128 (the model reference's seq_len=128)"),
    ("gpt2-tiny?seq_len=128", TOKENS_128, "--seq-len", "seq 128 (--seq-len)"),
    ("hf:gpt2?n_positions=128", TOKENS_128, None,
     "seq 128 (paraplan's default for hf: models, 512, capped at the config's positions; --seq-len N or seq_len=N"),
    ("hf:vit?num_hidden_layers=2", InputSpec(kind="image", image_size=224, channels=3, num_classes=1000), None,
     "image 224x224 (the config's image size; --image-size N or image_size=N in the reference to change)"),
    ("net.py:build", InputSpec(kind="sample", description="sample: inputs (3, 32, 32) per sample, no targets"), None,
     "inputs (3, 32, 32) per sample, no targets (your build function's sample)"),
])
def test_the_note_of_each_source(reference, inputs, flag, expected):
    assert input_note(reference, inputs, flag=flag).startswith(expected)


def test_a_plan_keeps_the_flags_length_in_its_reference():
    assert source.build("gpt2-tiny", seq_len=128).ref == "gpt2-tiny?seq_len=128"


@pytest.mark.parametrize("name, layers, hidden, ffn, heads", [
    ("llama3.1-8b", 32, 4096, 14336, 32),
    ("llama3.1-70b", 80, 8192, 28672, 64),
    ("llama3.1-405b", 126, 16384, 53248, 128),
])
def test_llama_3_1_has_the_published_shape_at_8192_tokens(name, layers, hidden, ffn, heads):
    built = zoo.build(name)  # parameter counts: tests/unit/test_zoo.py's PAPER_PARAMS (within 1%)
    cfg = built.module.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads) == \
        (layers, hidden, ffn, heads)
    assert cfg.num_key_value_heads == 8 and cfg.vocab_size == 128256 and not cfg.tie_word_embeddings
    assert (cfg.rope_parameters or {}).get("rope_theta", getattr(cfg, "rope_theta", None)) == 500000.0
    assert built.inputs.seq_len == 8192 and cfg.max_position_embeddings >= 8192


@pytest.mark.parametrize("hub_name, entry", [
    ("meta-llama/Llama-3.1-8B", "llama3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama3.1-70b"),
    ("meta-llama/Llama-3.1-405B", "llama3.1-405b"),
    ("meta-llama/Llama-2-7b-chat-hf", "llama2-7b"),
    ("openai-community/gpt2-xl", "gpt2-xl"),
    ("openai-community/gpt2", None),  # 124M: not gpt2-xl's shape
    ("meta-llama/Llama-3.2-1B", None),  # not llama3.2-3b's
    ("Qwen/Qwen2.5-7B", None),
])
def test_a_hub_name_says_how_configs_are_read(hub_name, entry):
    with pytest.raises(FieldError) as err:
        source.build(f"hf:{hub_name}")
    text = str(err.value)
    assert "\n" not in text and "reads no model hub" in text
    assert "hf:path/to/config.json" in text and "hf:llama?num_hidden_layers=" in text
    assert (f"the zoo has its shape as {entry} " in text) if entry else "the zoo has" not in text


def test_a_directory_without_a_config_says_so(tmp_path):
    with pytest.raises(FieldError, match="holds no config.json"):
        source.build(f"hf:{tmp_path}")


def test_plans_json_has_the_note_and_a_length_for_an_image_model_is_one_line(capsys, tmp_path):
    out = str(tmp_path / "p.json")
    res = run_cli_here(capsys, "plan", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--out", out,
                       "--json", "--seq-len", "12")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "image" in res.stderr
    res = run_cli_here(capsys, "plan", "--planner", "csimd", "--model", "lenet-5", "--cluster", "local", "--batch", "8",
                       "--out", out, "--json", "--image-size", "32")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["input_note"] == "image 32x32 (--image-size)"
