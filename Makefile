# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_VERBOSITY := error
export PYTHONHASHSEED := 0

.PHONY: demo test lint bench results clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The exact torch first: on these machines it is a CPU build on local disk. A bare `torch`
	# requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# paraplan's own bytecode once, here: an editable install compiles nothing, and where
	# PYTHONDONTWRITEBYTECODE is set every process (each rank, each command of the tests) would
	# compile the package again (~0.3 s of CPU each)
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

# the training engines `paraplan export` writes for, whose own config code the tests load the files with:
# only for `make test`, under constraints.txt so that nothing they pull replaces torch==2.13.0
ENGINES_STAMP := $(VENV)/.engines
$(ENGINES_STAMP): $(STAMP) constraints.txt
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,engines]'
	touch $(ENGINES_STAMP)

demo: $(STAMP)
	mkdir -p results
	# 1. the main job at the papers' scale: every method on GPT-2 XL over 8 TITANs with 16 GiB each,
	#    the best plan written, the lower bound, an HTML report
	$(BIN)/paraplan plan --model gpt2-xl --cluster galvatron-8xtitan --batch 64 --memory 16GiB --out results/demo-auto.json --report results/demo-report
	# 2. proof on real processes, on this machine: measure it once (2 cores as 2 devices), profile a small
	#    model with deliberately uneven layers, plan it with every method, then run the chosen plan, the
	#    even split and one process for real, interleaved, against their predictions
	$(BIN)/paraplan calibrate --quick --devices 2 --out results/demo-local.toml
	$(BIN)/paraplan profile examples/uneven.py:build --batch-sizes 8,16,32,64 --repeats 5 --no-checks --out results/demo-uneven-profile.json
	$(BIN)/paraplan plan --model examples/uneven.py:build --cluster results/demo-local.toml --profile results/demo-uneven-profile.json --batch 64 --out results/demo-uneven.json --prove --prove-rounds 2

# Two pytest workers (this machine has two cores), whole files to one worker so that a file's
# module-scoped fixtures run once, in tests/conftest.py's order (the longest files first; xdist would
# otherwise start the files with the most tests first, and the 3-minute one-test guide page last);
# the 15 slowest tests are listed at the end (7m02s here on a fresh clone on 2026-11-29 at 19:49, load 0.84 at start, set-up 83 s more; 7m28s at 19:38, load 0.97 at start, set-up 77 s more; 6m57s at 19:14, load 1.36 at start, set-up 68 s more; 6m37s at 18:51, load 0.30 at start; 7m06s at 18:00, load 0.77 at start,
# 2,250 tests, set-up 79 s more; 6m53s at 17:48, load 1.74, set-up 77 s more; 7m08s at 17:29, load about 1.5, set-up 74 s more; 6m48s at 15:57, load 1.06, 2,249 tests, set-up 75 s more; 6m56s at 15:44, load 0.05, set-up 70 s more; 7m24s at 14:01, load 1.03, 2,244 tests, set-up 82 s more; 7m12s at 13:48, load 1.47, set-up 78 s more; 7m24s at 13:23, load 1.09, set-up 86 s more; 7m27s at 11:24, load 0.70, 2,238 tests, set-up 74 s more; 7m37s at 10:52, load not recorded; 7m38s at 09:13, load 0.95, 2,235 tests, set-up 73 s more; 7m47s at 08:52, load 0.81; 9m38s at 06:58, load 1.26, set-up 85 s more; 9m11s at 06:37, load 0.63; 8m43s at 04:10, load 1.33, 2,150 tests, set-up 80 s more; 9m00s at 01:49, load about 1, 2,103 tests, set-up 82 s more; 9m07s on 2026-11-28 at 21:20, load 0.86, 2,092 tests, set-up 72 s more; the commit of 19:42 took 9m00s at 21:32 on the same machine, 7m04s at 19:42;
# 7m06s at 18:25, load 0.92, 2,078 tests; 7m11s at 18:11 at 0.59; 6m36s at 16:01 with 2,047 tests, before the mixed clusters',
# the checkpoints' and the fallback ladder's tests; 7m13s at 15:43, 6m41s at 14:00 with 1,993 tests, before
# FP8's and the published FP8 runs' tests; 7m51s at 0.30 that noon, before a transformers model's cut took two meta forwards
# instead of four and one `paraplan models --json` run served three tests).
test: $(ENGINES_STAMP)
	$(BIN)/python -m pytest tests -n 2 --dist loadfile --no-loadscope-reorder --durations=15

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# `make bench` writes into bench-out/ (ignored); `make results` regenerates the committed results/
BENCHMARKS := fidelity simulator_speed csimd_eval gropipe_bipartition_eval planner_speed_csimd planner_speed_bipartition \
	runtime_vs_simulator profile_nonlinearity galvatron_memory galvatron_eval galvatron_search_speed fddps_search_speed \
	fddps_eval fddps_contention runtime_hybrid runtime_overhead bipartition_modes runtime_bipartition runtime_dag \
	literature_memory split_backward_memory efficiency_fit published_runs paper_fidelity galvatron_grid \
	galvatron_bmw_ablation bound_gap local_first_predictions published_moe_runs fp8_linear published_fp8_runs published_fp8_unnamed_runs \
	published_mixed_runs \
	comparison_scale

define run_benchmarks
	mkdir -p $(1)
	for b in $(BENCHMARKS); do PARAPLAN_BENCH_OUT=$(1) $(BIN)/python benchmarks/$$b.py || exit 1; done
	$(BIN)/paraplan profile-links --out $(1)/local-measured.toml
endef

bench: $(STAMP)
	$(call run_benchmarks,bench-out)

results: $(STAMP)
	$(call run_benchmarks,results)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
