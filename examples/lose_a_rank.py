"""Lose a machine mid-run, on purpose: start `paraplan train --plan LADDER --elastic`, wait for its
first checkpoint, kill one rank's process with SIGKILL (as a machine that dies takes its processes
with it), and let the run carry on under the ladder's next rung. Prints the run's output and its
elastic log. Linux (it finds the ranks under /proc).

    python examples/lose_a_rank.py examples/gpt2-tiny-ladder-4-3.json --checkpoint-dir ck --out-dir run

docs/guide/failures.md walks through it."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ladder", nargs="?", default=str(Path(__file__).with_name("gpt2-tiny-ladder-4-3.json")),
                        help="a fallback ladder (default: this folder's gpt2-tiny-ladder-4-3.json)")
    parser.add_argument("--checkpoint-dir", default="lose-a-rank-checkpoints")
    parser.add_argument("--out-dir", default="lose-a-rank-run")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--keep-checkpoint", default=None, metavar="DIR",
                        help="copy the checkpoint the run will carry on from here before the kill (to compare with "
                             "the next rung's own run from it)")
    args = parser.parse_args()
    run = subprocess.Popen([sys.executable, "-m", "paraplan", "train", "--plan", args.ladder, "--elastic",
                            "--checkpoint-dir", args.checkpoint_dir, "--checkpoint-every", str(args.checkpoint_every),
                            "--steps", str(args.steps), "--out-dir", args.out_dir, "--no-dropout"])
    manifest = Path(args.checkpoint_dir) / "checkpoint.json"
    while run.poll() is None:
        try:
            if json.loads(manifest.read_text())["step"] >= args.checkpoint_every:
                break
        except (OSError, ValueError, KeyError):
            time.sleep(0.03)
    else:
        print("the run ended before its first checkpoint", file=sys.stderr)
        return 1
    if args.keep_checkpoint:  # the manifest and the state it names; the next save is steps away
        import shutil

        state = json.loads(manifest.read_text())["state"]
        shutil.copytree(Path(args.checkpoint_dir) / state, Path(args.keep_checkpoint) / state)
        shutil.copy(manifest, Path(args.keep_checkpoint) / manifest.name)
    # the launcher's forkserver's children are the ranks; the last one started goes
    ranks = [p for server in children(run.pid) for p in children(server)]
    print(f"--- killing rank process {max(ranks)} of {len(ranks)} (SIGKILL) ---", flush=True)
    os.kill(max(ranks), signal.SIGKILL)
    code = run.wait()
    print("--- the elastic log ---")
    print((Path(args.checkpoint_dir) / "elastic.log").read_text(), end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
