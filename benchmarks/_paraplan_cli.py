"""What the benchmarks share: each script's own command line (`bench_parser`: `--help` answers
without doing the work, an unknown argument is refused), and for the runtime benchmarks the
environment their ranks run in and the paraplan command line run as a child process (its stderr in
the error when it fails). Imported by the scripts beside it (`python benchmarks/x.py` puts this
directory on sys.path; scripts that tests load by file path import it inside `main`)."""

import argparse
import os
import subprocess
import sys

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}

EPILOG = """environment:
  PARAPLAN_BENCH_OUT  the directory the results are written under (default: bench-out; `make results`
                      sets results/, `paraplan bench paper --out DIR` sets DIR)

Without arguments it runs in full, with its defaults."""


def bench_parser(doc: str | None, **kwargs) -> argparse.ArgumentParser:
    """A benchmark script's parser: the first paragraph of its docstring as the description, where its
    results go in the epilog. Parse it first thing in `main`, so that `--help` prints and exits 0 and
    an unknown argument exits 2 before any work starts; the script adds its own options."""
    description = (doc or "").strip().split("\n\n")[0]
    return argparse.ArgumentParser(description=description, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def cli(*args) -> str:
    res = subprocess.run([sys.executable, "-m", "paraplan", *args], capture_output=True, text=True, env=ENV,
                         timeout=900)
    if res.returncode != 0:
        raise RuntimeError(res.stderr)
    return res.stdout
