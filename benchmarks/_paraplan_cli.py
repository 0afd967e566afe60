"""What the runtime benchmarks share: the environment their ranks run in and the command line run
as a child process (its stderr in the error when it fails). Imported by the scripts beside it
(`python benchmarks/x.py` puts this directory on sys.path)."""

import os
import subprocess
import sys

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}


def cli(*args) -> str:
    res = subprocess.run([sys.executable, "-m", "paraplan", *args], capture_output=True, text=True, env=ENV,
                         timeout=900)
    if res.returncode != 0:
        raise RuntimeError(res.stderr)
    return res.stdout
