"""`paraplan bench paper csimd|gropipe|galvatron|fddps|bipartition|all`: regenerate each paper's
reproduction (the benchmark scripts in the repository's benchmarks/) into one directory, and write
an index page (index.html) that shows every table and figure they wrote.

The scripts live beside the package in a source checkout (the install is editable: `make`); each is
run as its own process with PARAPLAN_BENCH_OUT pointing at the output directory, as `make results`
runs them, so the command and `make results` produce the same files.
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
import time
from pathlib import Path

from paraplan.cli.args import check_output
from paraplan.errors import ParaplanError

# paper -> (benchmark scripts, what each writes under the output directory)
PAPERS: dict[str, tuple[tuple[str, str], ...]] = {
    "csimd": (("csimd_eval", "csimd"),),
    "gropipe": (("gropipe_bipartition_eval", "gropipe_bipartition"),),
    "galvatron": (("galvatron_memory", "galvatron_memory.json"), ("galvatron_eval", "galvatron_eval")),
    "fddps": (("fddps_eval", "fddps_eval"), ("fddps_contention", "fddps_contention")),
    "bipartition": (("gropipe_bipartition_eval", "gropipe_bipartition"), ("bipartition_modes", "bipartition_modes")),
}
# Galvatron's Table II is ~130 CPU-minutes of searches, independent per cell: one per core.
SCRIPT_ARGS: dict[str, tuple[str, ...]] = {"galvatron_eval": ("--jobs", str(os.cpu_count() or 1))}
TITLES = {"csimd": "CSIMD (pipeline partition and micro-batches)", "gropipe": "GroPipe (grouped pipelines)",
          "galvatron": "Galvatron-BMW (per-layer hybrid strategies)", "fddps": "FD-DPS (operator placement)",
          "bipartition": "Bi-Partition (separate forward and backward ranges)"}


def benchmarks_dir() -> Path:
    root = Path(__file__).resolve().parents[3] / "benchmarks"
    if not (root / "csimd_eval.py").exists():
        raise ParaplanError("bench paper runs the benchmark scripts of a source checkout (benchmarks/ beside src/); "
                            f"none at {root}")
    return root


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="regenerate a paper's evaluation (tables and figures) with an index page")
    p.add_argument("kind", choices=("paper",), help="paper: the papers' reproductions")
    p.add_argument("paper", help="csimd, gropipe, galvatron, fddps, bipartition or all")
    p.add_argument("--out", default="results", help="the directory the reproductions and index.html go into")
    p.set_defaults(func=run)


def run(args) -> int:
    names = list(PAPERS) if args.paper == "all" else [args.paper]
    if args.paper != "all" and args.paper not in PAPERS:
        raise ParaplanError(f"unknown paper {args.paper!r}; expected one of {', '.join(PAPERS)}, all")
    check_output("--out", args.out, directory=True)
    root = benchmarks_dir()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done: set[str] = set()
    for name in names:
        for script, _ in PAPERS[name]:
            if script in done:  # gropipe and bipartition share one script
                continue
            t0 = time.perf_counter()
            print(f"{name}: running benchmarks/{script}.py (its output: {out / 'logs' / (script + '.log')}) ...",
                  flush=True)
            code, last = run_script(root / f"{script}.py", out, SCRIPT_ARGS.get(script, ()))
            if code != 0:
                raise ParaplanError(f"benchmarks/{script}.py failed: {last}")
            done.add(script)
            print(f"{name}: benchmarks/{script}.py done in {time.perf_counter() - t0:.0f} s", flush=True)
    index = write_index(out)
    print(f"index written to {index}")
    return 0


def run_script(script: Path, out: Path, extra: tuple[str, ...]) -> tuple[int, str]:
    """Run one benchmark script into `out`, its output (stdout and stderr) saved line by line in
    out/logs/<script>.log and its latest line shown live (some take an hour: Galvatron's Table II
    prints a line per cell). Returns the exit status and the last line it printed."""
    from rich.console import Console

    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    env = {**os.environ, "PARAPLAN_BENCH_OUT": str(out), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    last = "(no output)"
    console = Console(stderr=True)
    with open(logs / f"{script.stem}.log", "w") as log, \
            subprocess.Popen([sys.executable, str(script), *extra], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env) as proc, \
            console.status(f"{script.stem}: starting") as status:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if line.strip():
                last = line.strip()
                status.update(f"{script.stem}: {last[:100]}")
    return proc.returncode, last


def write_index(out: Path) -> Path:
    """One page over every paper whose outputs are in `out`: its summaries (Markdown shown as text)
    and figures (linked images, relative paths), and the JSON files listed."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>paraplan: the papers' evaluations</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:12px}img{max-width:100%;"
             "border:1px solid #ddd;margin:.5em 0}h2{border-bottom:1px solid #ccc}</style></head><body>",
             "<h1>The papers' evaluations, reproduced on paraplan's simulator</h1>",
             "<p>Written by <code>paraplan bench paper</code>; each section lists what its benchmark scripts wrote "
             "here (docs/ explains each reproduction and where it differs from the paper).</p>"]
    for name, scripts in PAPERS.items():
        files: list[Path] = []
        for _, target in scripts:
            path = out / target
            if path.is_dir():
                files += sorted(p for p in path.rglob("*") if p.is_file() and "run" not in p.relative_to(path).parts)
            elif path.exists():
                files.append(path)
        if not files:
            continue
        parts.append(f"<h2>{html.escape(TITLES[name])}</h2>")
        for f in files:
            rel = f.relative_to(out).as_posix()
            if f.suffix == ".md":
                parts.append(f"<h3>{html.escape(rel)}</h3><pre>{html.escape(f.read_text())}</pre>")
        for f in files:
            rel = f.relative_to(out).as_posix()
            if f.suffix in (".png", ".svg"):
                parts.append(f"<p><a href='{html.escape(rel)}'><img src='{html.escape(rel)}' alt='{html.escape(rel)}'>"
                             f"</a><br><small>{html.escape(rel)}</small></p>")
        data = [f for f in files if f.suffix == ".json"]
        if data:
            parts.append("<p>data: " + ", ".join(f"<a href='{html.escape(f.relative_to(out).as_posix())}'>"
                                                 f"{html.escape(f.relative_to(out).as_posix())}</a>" for f in data)
                         + "</p>")
    parts.append("</body></html>")
    from paraplan.system.fileio import atomic_write_text

    index = out / "index.html"
    atomic_write_text(index, "\n".join(parts))
    return index
