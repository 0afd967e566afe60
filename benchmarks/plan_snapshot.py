"""Snapshot of what paraplan plans, to show that a refactoring changed no behaviour.

Runs the README's and the user guide's planning commands that do not measure this machine (preset
clusters, committed examples; every planner per command; `--time-limit` generous so that no search
is cut short by the clock), plus `simulate` and `inspect --json` of the committed plans, and writes
one JSON file: each command's exit status and its plan file / JSON output with the wall-clock
fields (search seconds, the measured planner times of a comparison) removed.

    .venv/bin/python benchmarks/plan_snapshot.py --out before.json            # on the old commit
    .venv/bin/python benchmarks/plan_snapshot.py --out after.json --compare before.json

`--paraplan` names the command to run (default: the `paraplan` beside this Python), so the same
script can snapshot another checkout: `--paraplan /tmp/old/.venv/bin/paraplan`; or `--src DIR` runs
another checkout's source with this Python (`git worktree add /tmp/old COMMIT`, then
`--src /tmp/old/src`). Exit status 1 when `--compare` finds a difference, with the differing paths
printed.

The commands on `--cluster local` read this machine's cached calibration (`paraplan calibrate`,
which `make demo` runs, replaces it): take both snapshots under the same one; `--compare` says when
they were not.

Beside the documented commands, the axes a refactoring of the parallel dimensions moves (issue 47):
a Galvatron-BMW plan with `context_parallel=2` (through the Python API, which had that option before
the command line did) that chooses CP, then `simulate` and `export` of it; a hybrid TP+SDP plan
(tp 4 x sdp 2 layers); a Megatron-style plan with sequence parallelism, simulated and exported.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = "600"  # seconds per planner in a comparison: none of these comes near it
QWEN = ("hf:qwen2?num_hidden_layers=4&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
        "&intermediate_size=128&vocab_size=512&seq_len=32")
# (name, argv after `paraplan`, the file it writes or None for its JSON on stdout)
COMMANDS = [
    ("readme-auto-gpt2-xl", ["plan", "--model", "gpt2-xl", "--cluster", "galvatron-8xtitan", "--batch", "64",
                             "--memory", "16GiB", "--time-limit", LIMIT, "--out", "OUT"], "OUT"),
    ("readme-csimd-vgg16", ["plan", "--planner", "csimd", "--model", "vgg-16", "--cluster", "csimd-v100-1gbe",
                            "--batch", "64", "--stages", "4", "--out", "OUT"], "OUT"),
    ("readme-csimd-qwen2", ["plan", "--planner", "csimd", "--model", QWEN, "--cluster", "local", "--batch", "8",
                            "--stages", "2", "--out", "OUT"], "OUT"),
    ("readme-galvatron-bert", ["plan", "--planner", "galvatron-bmw", "--model", "bert-huge-32", "--cluster",
                               "galvatron-8xtitan", "--memory", "16GiB", "--batch", "max", "--out", "OUT"], "OUT"),
    ("readme-fddps-resnet50", ["plan", "--planner", "fddps", "--model", "resnet-50", "--cluster", "fddps-8xp100",
                               "--batch", "64", "--out", "OUT"], "OUT"),
    ("guide-csimd-gpt2-xl", ["plan", "--model", "gpt2-xl", "--cluster", "csimd-v100-10gbe", "--batch", "64",
                             "--planner", "csimd", "--out", "OUT"], "OUT"),
    ("guide-auto-gpt2-tiny-8", ["plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8",
                                "--time-limit", LIMIT, "--out", "OUT"], "OUT"),
    ("guide-auto-gpt2-tiny-16", ["plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "16",
                                 "--time-limit", LIMIT, "--out", "OUT"], "OUT"),
    ("guide-fddps-vgg16", ["plan", "--model", "vgg-16", "--cluster", "fddps-8xp100", "--batch", "32",
                           "--planner", "fddps", "--out", "OUT"], "OUT"),
    ("guide-gropipe-resnet50", ["plan", "--model", "resnet-50", "--cluster", "gropipe-8xt4", "--batch", "128",
                                "--planner", "gropipe", "--out", "OUT"], "OUT"),
    ("guide-csimd-vgg16-free", ["plan", "--model", "vgg-16", "--cluster", "csimd-v100-1gbe", "--batch", "64",
                                "--planner", "csimd", "--out", "OUT"], "OUT"),
    ("guide-csimd-vgg16-exact4", ["plan", "--model", "vgg-16", "--cluster", "csimd-v100-1gbe", "--batch", "64",
                                  "--planner", "csimd", "--stages", "4", "--exact-stages", "--out", "OUT"], "OUT"),
    ("guide-bipartition-lenet", ["plan", "--model", "lenet-5", "--cluster", "bipartition-7vm", "--batch", "64",
                                 "--planner", "bipartition", "--out", "OUT"], "OUT"),
    ("guide-csimd-two-servers", ["plan", "--model", "gpt2-xl", "--cluster", str(ROOT / "examples/two-servers.toml"),
                                 "--batch", "32", "--planner", "csimd", "--out", "OUT"], "OUT"),
    ("guide-even-gpt2-tiny", ["plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--planner",
                              "even", "--stages", "2", "--micro-batches", "4", "--out", "OUT"], "OUT"),
    ("inspect-gpt2-xl", ["inspect", "gpt2-xl", "--batch", "8", "--cluster", "galvatron-8xtitan", "--json"], None),
] + [(f"simulate-{p.stem}", ["simulate", str(p), "--json"], None) for p in sorted((ROOT / "examples").glob("*.json"))]

# A plan through the Python API: the code runs with OUT in $SNAPSHOT_OUT (context_parallel was an
# API-only option before `plan --option`); "@name" in an argv is the file command `name` wrote.
API = "--api"
CP_PLAN = ("import os\nfrom paraplan import api\nfrom paraplan.plans.plan_file import write_plan\n"
           "write_plan(api.plan('llama3.1-8b', 'dgx-h100-80gb', 8, planner='galvatron-bmw', precision='bf16', "
           "seq_len=16384, options={'context_parallel': 2}), os.environ['SNAPSHOT_OUT'])\n")
COMMANDS += [
    ("axes-galvatron-cp2-llama", [API, CP_PLAN], "OUT"),
    ("axes-simulate-cp", ["simulate", "@axes-galvatron-cp2-llama", "--json"], None),
    ("axes-export-cp-torchtitan", ["export", "@axes-galvatron-cp2-llama", "--to", "torchtitan", "--out", "OUT"], "OUT"),
    ("axes-export-cp-megatron", ["export", "@axes-galvatron-cp2-llama", "--to", "megatron", "--out", "OUT"], "OUT"),
    ("axes-galvatron-tp-sdp-llama13b", ["plan", "--planner", "galvatron-bmw", "--model", "llama2-13b", "--cluster",
                                        "galvatron-16xa100", "--batch", "64", "--memory", "24GiB", "--out", "OUT"], "OUT"),
    ("axes-simulate-tp-sdp", ["simulate", "@axes-galvatron-tp-sdp-llama13b", "--json"], None),
    ("axes-grid-sp-llama8b", ["plan", "--planner", "megatron-grid", "--model", "llama3.1-8b", "--cluster",
                              "dgx-h100-80gb", "--batch", "32", "--precision", "bf16", "--out", "OUT"], "OUT"),
    ("axes-simulate-sp", ["simulate", "@axes-grid-sp-llama8b", "--json"], None),
    ("axes-export-sp-megatron", ["export", "@axes-grid-sp-llama8b", "--to", "megatron", "--out", "OUT"], "OUT"),
    ("axes-export-sp-torchtitan", ["export", "@axes-grid-sp-llama8b", "--to", "torchtitan", "--out", "OUT"], "OUT"),
]

CLOCK_KEYS = {"search_s", "seconds", "elapsed_s", "wall_s", "planner_s"}  # wall-clock fields: differ run to run


def _strip_clock(value):
    if isinstance(value, dict):
        return {k: _strip_clock(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [_strip_clock(v) for v in value]
    return value


def snapshot(paraplan: list[str], python: list[str], env_extra: dict) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **env_extra}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, argv, writes) in enumerate(COMMANDS, 1):
            target = str(Path(tmp) / f"{name}.json")
            argv = [target if a == "OUT" else str(Path(tmp) / f"{a[1:]}.json") if a.startswith("@") else a
                    for a in argv]
            command = [*python, "-c", argv[1]] if argv[0] == API else [*paraplan, *argv]
            t0 = time.perf_counter()
            res = subprocess.run(command, capture_output=True, text=True, env={**env, "SNAPSHOT_OUT": target}, cwd=tmp)
            print(f"[{i}/{len(COMMANDS)}] {name}: exit {res.returncode} ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr)
            entry = {"exit": res.returncode}
            if res.returncode != 0:
                entry["stderr"] = res.stderr.strip().splitlines()[-1:]
            else:
                text = Path(target).read_text() if writes else res.stdout
                # the checkout's own path (a cluster file's name) and the scratch folder differ run to run
                text = text.replace(json.dumps(str(ROOT))[1:-1], "<repo>").replace(tmp, "<tmp>")
                try:
                    entry["output"] = _strip_clock(json.loads(text))
                except json.JSONDecodeError:  # an engine's launch script or TOML
                    entry["output"] = text
            out[name] = entry
    return out


def differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = [f"{path}/{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            found += differences(a[k], b[k], f"{path}/{k}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}"]


def main() -> int:
    from _paraplan_cli import bench_parser

    ap = bench_parser(__doc__)
    ap.add_argument("--out", default=str(Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "plan_snapshot.json"),
                    help="the snapshot (JSON) to write (default: bench-out/plan_snapshot.json, as the other benchmarks)")
    ap.add_argument("--compare", help="a snapshot written before: print every difference, exit 1 if any")
    ap.add_argument("--paraplan", default=str(Path(sys.executable).parent / "paraplan"),
                    help="the paraplan command to snapshot")
    ap.add_argument("--src", help="run this source folder (another checkout's src/) with this Python instead")
    args = ap.parse_args()
    if args.src:
        env_extra = {"PYTHONPATH": str(Path(args.src).resolve())}
        snap = snapshot([sys.executable, "-m", "paraplan"], [sys.executable], env_extra)
    else:
        snap = snapshot([args.paraplan], [str(Path(args.paraplan).parent / "python")], {})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
    print(f"{len(snap)} commands, {sum(e['exit'] == 0 for e in snap.values())} exit 0: {args.out}")
    if args.compare:
        found = differences(json.loads(Path(args.compare).read_text()), snap)
        print(f"against {args.compare}: {len(found)} difference(s)")
        if any("/cost_source:" in line for line in found):
            # `--cluster local` reads this machine's cached calibration, which `paraplan calibrate`
            # (make demo) replaces: the two snapshots must be taken under the same one
            print("  this machine's calibration changed between the two snapshots: take both again under one")
        for line in found:
            print("  " + line)
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
