"""`paraplan plan --option NAME=VALUE` (issue 47, item 5): any option a planner declares, its value
read as the type of the option's default and checked by the planner; an option the planner does not
declare, a malformed pair, a bad value and an option without --planner are refused in one line,
exit status 2, before any work and with nothing written. `--options` is the same flag."""

import json

import pytest
from conftest import run_cli_here
from paraplan_process import refused

from paraplan.cli.plan_options import option_pair, typed
from paraplan.errors import ParaplanError
from paraplan.plans.plan_file import read_plan

# Llama 3.1 8B's blocks, 8 of them (the suite's time: a quarter of the search, the same per-layer choice)
LLAMA_8B_BLOCKS = ("hf:llama?num_hidden_layers=8&hidden_size=4096&intermediate_size=14336&num_attention_heads=32"
                   "&num_key_value_heads=8&vocab_size=128256&max_position_embeddings=16384")
CP = ["plan", "--planner", "galvatron-bmw", "--model", LLAMA_8B_BLOCKS, "--cluster", "dgx-h100-80gb", "--batch", "8",
      "--precision", "bf16", "--seq-len", "16384"]
SMALL = ["plan", "--model", "lenet-5", "--cluster", "bipartition-7vm", "--batch", "64"]


def _without_clock(d):
    if isinstance(d, dict):
        return {k: _without_clock(v) for k, v in d.items() if k != "search_s"}
    if isinstance(d, list):
        return [_without_clock(v) for v in d]
    return d


def test_context_parallel_on_the_command_line_is_the_apis_cp_plan(capsys, tmp_path):
    from paraplan import api
    from paraplan.plans.plan_file import plan_to_dict

    out = tmp_path / "cp.json"
    res = run_cli_here(capsys, *CP, "--option", "context_parallel=2", "--out", str(out))
    assert res.returncode == 0, res.stderr
    plan = read_plan(out)
    # CP2 where its K/V exchange pays (issue 48 prices it: no longer free on every layer)
    assert 2 in {st.cp for s in plan.stages for st in s.strategies}
    assert "CP2" in res.stdout
    # the same plan as the Python API's options={"context_parallel": 2}
    ours = api.plan(LLAMA_8B_BLOCKS, "dgx-h100-80gb", 8, planner="galvatron-bmw", precision="bf16", seq_len=16384,
                    options={"context_parallel": 2})
    assert _without_clock(json.loads(out.read_text())) == _without_clock(plan_to_dict(ours))


def test_an_option_the_planner_does_not_declare_is_refused_and_nothing_written(capsys, tmp_path):
    out = tmp_path / "x.json"
    res = run_cli_here(capsys, *SMALL, "--planner", "csimd", "--option", "context_parallel=2", "--out", str(out))
    refused(res, "--option context_parallel: planner 'csimd' has no such option (its options: eta, method)")
    assert not out.exists()


@pytest.mark.parametrize("pair", ["foo", "=3", "context_parallel"])
def test_a_malformed_option_is_refused_in_one_line(capsys, tmp_path, pair):
    out = tmp_path / "x.json"
    res = run_cli_here(capsys, *SMALL, "--planner", "galvatron-bmw", "--option", pair, "--out", str(out))
    refused(res, "--option", "expected NAME=VALUE", repr(pair))
    assert not out.exists()


def test_options_is_the_same_flag_and_its_value_is_typed(capsys, tmp_path):
    by_option, by_flag = tmp_path / "a.json", tmp_path / "b.json"
    res = run_cli_here(capsys, *SMALL, "--planner", "random", "--options", "seed=3", "--out", str(by_option))
    assert res.returncode == 0, res.stderr
    res = run_cli_here(capsys, *SMALL, "--planner", "random", "--seed", "3", "--out", str(by_flag))
    assert res.returncode == 0, res.stderr
    assert _without_clock(json.loads(by_option.read_text())) == _without_clock(json.loads(by_flag.read_text()))
    refused(run_cli_here(capsys, *SMALL, "--planner", "csimd", "--options", "context_parallel=2",
                         "--out", str(tmp_path / "c.json")), "--option context_parallel: planner 'csimd' has no such")


@pytest.mark.parametrize("args,needles", [
    (("--planner", "galvatron-bmw", "--option", "context_parallel=two"),
     ("--option context_parallel: expected a whole number, got 'two'",)),
    (("--planner", "galvatron-bmw", "--option", "context_parallel=0"),
     ("--option context_parallel: must be a whole number of at least 1, got 0",)),
    (("--planner", "galvatron-bmw", "--option", "portfolio=maybe"),
     ("--option portfolio: expected true or false, got 'maybe'",)),
    (("--planner", "galvatron-bmw", "--option", "pp_order=sideways"), ("--option pp_order: unknown 'sideways'",)),
    (("--planner", "csimd", "--eta", "5", "--option", "eta=6"), ("--option eta: given by --eta too",)),
    (("--planner", "csimd", "--option", "eta=5", "--option", "eta=6"), ("--option eta: given twice",)),
    (("--option", "context_parallel=2",), ("--option context_parallel: an option of one planner; give --planner too",)),
])
def test_bad_values_and_places_are_refused_before_any_work(capsys, tmp_path, args, needles):
    out = tmp_path / "x.json"
    refused(run_cli_here(capsys, *SMALL, *args, "--out", str(out)), *needles)
    assert not out.exists()


def test_values_take_the_type_of_the_options_default():
    assert option_pair("context_parallel=2") == ("context_parallel", "2")
    assert option_pair("bmw_partition=even+memory") == ("bmw_partition", "even+memory")
    assert typed("context_parallel", "2", 1) == 2
    assert typed("portfolio", "False", True) is False and typed("portfolio", "true", True) is True
    assert typed("ratio", "0.5", 1.0) == 0.5
    assert typed("pp_order", "descending", "ascending") == "descending"
    with pytest.raises(ParaplanError, match="expected a number"):
        typed("ratio", "half", 1.0)
