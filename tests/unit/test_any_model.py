"""Any model, everywhere: references, the generic transformers cut, the torch.fx cut of a plain
module, and the command line with models the zoo does not have."""

import json
import os
from pathlib import Path

import pytest
import torch
from paraplan_process import run_paraplan

from paraplan.costs.model import profile_cost_model
from paraplan.costs.profile import LayerProfile, Profile, Timing
from paraplan.errors import FieldError, ParaplanError
from paraplan.hardware import load_cluster
from paraplan.models import measure, source
from paraplan.models.ref import parse

DATA = Path(__file__).resolve().parent.parent / "data"
MIXER = f"{DATA / 'mixer.py'}:build"
SMALL = "num_hidden_layers=4&hidden_size=64&num_attention_heads=4&intermediate_size=128&vocab_size=512&seq_len=32"
QWEN2 = f"hf:qwen2?{SMALL}&num_key_value_heads=2"
MISTRAL = f"hf:mistral?{SMALL}&num_key_value_heads=2"
OPT = "hf:opt?num_hidden_layers=4&hidden_size=64&num_attention_heads=4&ffn_dim=128&vocab_size=512&seq_len=32"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


# --------------------------------------------------------------------------- references
def test_reference_text_round_trips_and_folds_in_the_command_line_sizes():
    ref = parse("hf:qwen2?num_hidden_layers=4&rope_scaling=null&tie_word_embeddings=true&name=x")
    assert ref.kind == "hf" and ref.target == "qwen2"
    assert ref.config_overrides == {"num_hidden_layers": 4, "tie_word_embeddings": True, "name": "x"}
    assert parse(ref.text) == ref
    assert source.resolve("gpt2-tiny", seq_len=16).text == "gpt2-tiny?seq_len=16"
    assert source.resolve("lenet5").text == "lenet-5"  # aliases become the zoo's name
    assert parse("models/net.py:make?layers=body.blocks").layers_path == "body.blocks"


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("hf:", "model type"),
    ("net.py", "file.py:build_fn"),
    ("gpt2-tiny?hidden_size=3", "unknown setting"),
    ("gpt2-tiny?seq_len=0", "positive"),
    ("gpt2-tiny?seq_len=4&seq_len=5", "twice"),
    ("net.py:make?layers=a/b", "dotted"),
])
def test_bad_references_name_the_problem(text, says):
    with pytest.raises(FieldError, match=says):
        parse(text)


def test_unknown_names_suggest_close_ones():
    with pytest.raises(ParaplanError, match="did you mean qwen3"):
        source.build("hf:qwen3x?num_hidden_layers=1")
    with pytest.raises(ParaplanError, match="gpt2-tiny"):
        source.build("gpt2-tiyn")


# --------------------------------------------------------------------------- the generic transformers cut
@pytest.mark.parametrize("reference", [QWEN2, MISTRAL, OPT, f"hf:phi3?{SMALL}&num_key_value_heads=2&pad_token_id=0",
                                       f"hf:gpt_neox?{SMALL}"])
def test_generic_cut_computes_what_the_library_computes(reference):
    built = source.build(reference, device="cpu", seed=0)
    assert built.family == "hf"  # not one of the hand-written adapters
    built.module.eval()
    tokens, _ = built.batch(3, seed=1)
    want = built.module(tokens).logits
    out = tokens
    layers = built.layers()
    assert [kind for _, kind, _ in layers] == ["embedding"] + ["block"] * 4 + ["head"]
    for _, _, layer in layers:
        out = layer(out)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
    # every parameter of the model belongs to a layer
    held = {id(p) for _, _, layer in layers for p in layer.parameters()}
    assert held == {id(p) for p in built.module.parameters()}


def test_adapted_families_are_chosen_by_model_type_not_class_name():
    built = source.build("hf:gpt2?n_layer=2&n_embd=32&n_head=2&vocab_size=128&seq_len=16")
    assert built.family == "gpt2"
    assert len(built.layers()) == 4


@pytest.mark.parametrize("reference, says", [
    ("hf:bloom?n_layer=2&hidden_size=32&n_head=2&vocab_size=128&seq_len=16", "alibi"),
    (f"hf:gemma2?{SMALL}&num_key_value_heads=2&head_dim=16", "outside its modules"),
    ("hf:qwen2?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=2&vocab_size=128"
     "&intermediate_size=64&layers=model.norm", "not a non-empty nn.ModuleList"),
])
def test_what_cannot_be_cut_is_said_in_one_line(reference, says):
    with pytest.raises(FieldError, match=says):
        source.build(reference)


def test_measurement_of_a_generic_model_counts_every_parameter():
    built = source.build(QWEN2)
    spec = measure.measure(built)
    assert spec.ref == QWEN2 and spec.n_layers == 6
    assert spec.param_count == sum(p.numel() for p in built.module.parameters())
    assert spec.layers[1].forward_flops.per_sample > 0


# --------------------------------------------------------------------------- plain modules via torch.fx
@pytest.mark.parametrize("layers, names", [
    (None, ["stem", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"]),
    ("blocks", ["embedding", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]),
])
def test_a_plain_module_is_cut_through_its_trace(layers, names):
    built = source.build(MIXER, device="cpu", layers=layers)
    assert built.family == "module"
    cut = built.layers()
    assert [n for n, _, _ in cut] == names
    images, labels = built.batch(5, seed=3)
    assert labels.dtype == torch.int64 and int(labels.max()) < 10
    out = images
    for _, _, layer in cut:
        out = layer(out)
    assert torch.equal(out, built.module(images))
    # the layers hold the model's own modules (weights are shared, not copied)
    assert {id(p) for _, _, m in cut for p in m.parameters()} == {id(p) for p in built.module.parameters()}


def test_a_skip_across_layers_is_refused_with_the_layers_named():
    with pytest.raises(FieldError, match="c uses a value from a"):
        source.build(f"{DATA / 'mixer.py'}:build_skipping").layers()


def test_untraceable_forward_says_how_to_help(tmp_path):
    (tmp_path / "branchy.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class Branchy(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)\n"
        "    def forward(self, x):\n        return self.a(x) if x.sum() > 0 else self.b(x)\n"
        "def build():\n    return Branchy(), torch.randn(2, 4)\n")
    with pytest.raises(FieldError, match="layers=PATH"):
        source.build(f"{tmp_path / 'branchy.py'}:build").layers()


# --------------------------------------------------------------------------- profiles know their model
def test_a_profile_of_another_model_is_refused():
    spec = measure.measure(source.build("lenet-5"))
    timing = Timing(median_s=1e-3, min_s=1e-3, max_s=1e-3, q1_s=1e-3, q3_s=1e-3, repeats=1)
    layers = tuple(LayerProfile(name=layer.name, kind=layer.kind, batch_sizes=(1,), forward=(timing,),
                                backward=(timing,), output_bytes=(4,), saved_bytes=(4,), peak_bytes=(4,))
                   for layer in spec.layers)
    profile = Profile(model="lenet-5?image_size=64", inputs="", device="cpu", device_name="cpu", machine="",
                      torch_version="", threads=1, date="", warmup=0, repeats=1, layers=layers)
    with pytest.raises(ParaplanError, match="measured for 'lenet-5\\?image_size=64', not 'lenet-5'"):
        profile_cost_model(spec, load_cluster("local"), profile)
    profile_cost_model(spec, load_cluster("local"), Profile(**{**profile.__dict__, "model": "lenet-5"}))


# --------------------------------------------------------------------------- every subcommand takes any model
def _run(*args, cwd=None):
    return run_paraplan(*args, env=ENV,
                          cwd=cwd, timeout=180)


def test_inspect_plan_simulate_take_a_users_module_and_a_config(tmp_path):
    out = _run("inspect", MIXER, "--cluster", "local", "--json")
    assert out.returncode == 0, out.stderr
    assert [row["name"] for row in json.loads(out.stdout)["layers"]][0] == "stem"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 64,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                                  "vocab_size": 256}))
    plan = tmp_path / "plan.json"
    out = _run("plan", "--model", f"hf:{config}", "--seq-len", "16", "--cluster", "local", "--batch", "8",
               "--planner", "even", "--stages", "2", "--micro-batches", "2", "--out", str(plan))
    assert out.returncode == 0, out.stderr
    stored = json.loads(plan.read_text())["model"]
    assert stored == f"hf:{config}?seq_len=16"  # the plan rebuilds the same model, sizes included
    out = _run("simulate", str(plan), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["iteration_s"] > 0


def test_layers_flag_and_missing_file_are_one_line(tmp_path):
    out = _run("inspect", MIXER, "--layers", "blocks", "--cluster", "local", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["layers"][0]["name"] == "embedding"
    out = _run("inspect", "nowhere.py:build", "--cluster", "local")
    assert out.returncode == 2 and "no such file 'nowhere.py'" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
