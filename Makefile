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
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/paraplan models --no-tiny
	$(BIN)/paraplan clusters
	$(BIN)/paraplan inspect gpt2-tiny --batch 4 --cluster local
	mkdir -p results
	# the main job: every method on GPT-2 XL over 8 TITANs with 16 GiB each, the best plan written, a report
	$(BIN)/paraplan plan --model gpt2-xl --cluster galvatron-8xtitan --batch 64 --memory 16GiB --out results/demo-auto.json --report results/demo-report
	# one method on its own: CSIMD over eight V100 servers, then look at the plan
	$(BIN)/paraplan plan --model gpt2-xl --cluster csimd-v100-10gbe --batch 64 --planner csimd --out results/demo-plan.json
	$(BIN)/paraplan plan --model vgg-16 --cluster csimd-v100-1gbe --batch 64 --stages 4 --planner even --micro-batches 4 --out results/demo-even.json
	$(BIN)/paraplan plan --model vgg-16 --cluster csimd-v100-1gbe --batch 64 --stages 4 --planner csimd --out results/demo-vgg.json
	$(BIN)/paraplan simulate results/demo-plan.json --gantt results/demo-plan.png --trace results/demo-plan.trace.json
	$(BIN)/paraplan simulate examples/gpt2-xl-1f1b-4x8.json --gantt results/demo-1f1b.png
	# and run a small plan for real on this machine's cores, against its prediction
	$(BIN)/paraplan train --plan examples/gpt2-tiny-local-1f1b-2x4.json --steps 6 --compare --out-dir results/demo-train
	$(BIN)/paraplan simulate examples/resnet-50-gropipe-2x4.json
	$(BIN)/paraplan simulate examples/bert-huge-32-dp8.json --memory-gib 12

# Two pytest workers (this machine has two cores), whole files to one worker so that a file's
# module-scoped fixtures run once; `make test` stays under 15 minutes here.
test: $(STAMP)
	$(BIN)/python -m pytest tests -n 2 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# `make bench` writes into bench-out/ (ignored); `make results` regenerates the committed results/
BENCHMARKS := simulator_speed csimd_eval gropipe_bipartition_eval planner_speed_csimd planner_speed_bipartition \
	runtime_vs_simulator profile_nonlinearity galvatron_memory galvatron_eval galvatron_search_speed fddps_search_speed \
	fddps_eval fddps_contention runtime_hybrid runtime_overhead bipartition_modes runtime_bipartition runtime_dag

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
