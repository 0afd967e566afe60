"""The commands that run a plan on several machines (`paraplan train --print-launch`): one torchrun
command line per node, and a Slurm batch script that runs the same through srun. Pure: plain values
in, text out; nothing is started or read here (what those commands run is runtime/launcher/launch.py's
`run_under_torchrun`, one process per device of the plan)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from paraplan.errors import FieldError

DEFAULT_MASTER = "127.0.0.1"
DEFAULT_PORT = 29500  # torchrun's own default for --master-port
MASTER_VARIABLE = "PARAPLAN_MASTER_ADDR"


@dataclass(frozen=True)
class Launch:
    """How the plan's ranks spread over machines: `nodes` x `gpus_per_node` processes, one per
    device of the plan; rank r (device r of the plan) runs on node r // gpus_per_node."""

    nodes: int
    gpus_per_node: int  # processes per node: one per GPU (on CPU-only machines, one per plan device all the same)
    master: str  # the address of node 0, which hosts the rendezvous
    port: int
    plan_path: str
    train_options: tuple[str, ...] = ()  # `paraplan train`'s other arguments, passed on to every rank as given

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


def make_launch(world: int, plan_path: str, *, nodes: int | None = None, gpus_per_node: int | None = None,
                master: str | None = None, port: int | None = None, train_options: Sequence[str] = ()) -> Launch:
    """The launch of a plan on `world` devices, checked: nodes x processes per node must be the
    plan's devices (each rank runs one device of the plan). None: the default (one node; the
    devices split evenly over the nodes; 127.0.0.1; port 29500)."""
    nodes = 1 if nodes is None else nodes
    master = DEFAULT_MASTER if master is None else master
    port = DEFAULT_PORT if port is None else port
    if nodes < 1:
        raise FieldError("nodes", f"must be at least 1, got {nodes}")
    if gpus_per_node is None:
        if world % nodes:
            raise FieldError("nodes", f"the plan's {world} devices do not split evenly over {nodes} nodes")
        gpus_per_node = world // nodes
    if gpus_per_node < 1:
        raise FieldError("gpus_per_node", f"must be at least 1, got {gpus_per_node}")
    if nodes * gpus_per_node != world:
        raise FieldError("gpus_per_node", f"{_count(nodes, 'node')} x {_count(gpus_per_node, 'process')} = "
                                          f"{nodes * gpus_per_node} ranks, but the plan runs on {world} devices "
                                          "(one rank per device)")
    if not 1 <= port <= 65535:
        raise FieldError("port", f"must be a TCP port, 1..65535, got {port}")
    if not master.strip() or any(c.isspace() for c in master):
        raise FieldError("master", f"must be a host name or address, got {master!r}")
    return Launch(nodes, gpus_per_node, master, port, plan_path, tuple(train_options))


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


def _shape(launch: Launch) -> str:
    return (f"{_count(launch.nodes, 'node')} x {_count(launch.gpus_per_node, 'process')} "
            f"(the plan's {launch.world} devices)")


def _torchrun(launch: Launch, node_rank: str, master: str) -> list[str]:
    """torchrun's static rendezvous (--node-rank, --master-addr/--master-port) rather than c10d's:
    it numbers the ranks by node, node k's processes being ranks k*G..k*G+G-1, so the plan's
    device r is on node r // G as the plan's cluster numbers its devices (a pipeline's neighbouring
    stages on one node's fast links), whereas c10d numbers the nodes in the order they arrive. It
    also maps one to one onto Slurm's $SLURM_NODEID."""
    return ["torchrun", "--nnodes", str(launch.nodes), "--nproc-per-node", str(launch.gpus_per_node),
            "--node-rank", node_rank, "--master-addr", master, "--master-port", str(launch.port),
            "-m", "paraplan", "train", "--plan", launch.plan_path, *launch.train_options]


def node_argv(launch: Launch, node_rank: int) -> list[str]:
    """The command of node `node_rank` (0..nodes-1), as argv."""
    if not 0 <= node_rank < launch.nodes:
        raise ValueError(f"node rank {node_rank} outside 0..{launch.nodes - 1}")
    return _torchrun(launch, str(node_rank), launch.master)


def node_commands(launch: Launch) -> list[str]:
    """One shell command line per node, node 0 first (quoted: paths with spaces stay one word)."""
    return [shlex.join(node_argv(launch, k)) for k in range(launch.nodes)]


def sbatch_script(launch: Launch) -> str:
    """A Slurm batch script: one task per node, each running torchrun with its node's rank."""
    # Every word quoted for the shell of each task, but $SLURM_NODEID and the master's address: that
    # shell expands them (the batch shell runs on node 0 only, where $SLURM_NODEID is 0)
    # (placeholders with a NUL, which no argument can hold)
    expanded = {"\0rank": '"$SLURM_NODEID"', "\0master": f'"${MASTER_VARIABLE}"'}
    inner = " ".join(expanded.get(w) or shlex.quote(w) for w in _torchrun(launch, "\0rank", "\0master"))
    return "\n".join([
        "#!/bin/bash",
        f"# paraplan train on {_shape(launch)}; submit with sbatch",
        "#SBATCH --job-name=paraplan-train",
        f"#SBATCH --nodes={launch.nodes}",
        "#SBATCH --ntasks-per-node=1",
        "# one GPU per process (the ranks use nccl when every rank has a GPU); on CPU-only nodes delete",
        "# this line: the ranks then use gloo",
        f"#SBATCH --gpus-per-node={launch.gpus_per_node}",
        "set -euo pipefail",
        "# the allocation's first node hosts the rendezvous; srun passes the environment on to every task",
        f'export {MASTER_VARIABLE}="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        "# one torchrun per node; inside the single quotes $SLURM_NODEID is expanded by each task's own",
        "# shell, so the k-th node gets node rank k",
        f"srun bash -c {shlex.quote('exec ' + inner)}",
        "",
    ])


def launch_text(launch: Launch, slurm_only: bool = False) -> str:
    """What `paraplan train --print-launch` prints: each node's command, then the Slurm script
    (with `slurm_only`, the script alone, to redirect into a file)."""
    if slurm_only:
        return sbatch_script(launch)
    lines = [f"# {_shape(launch)}; node 0 ({launch.master}) hosts the rendezvous on port {launch.port}"]
    for k, command in enumerate(node_commands(launch)):
        lines += [f"# on node {k}:", command]
    lines += ["", "# or through Slurm: this script into a file (--slurm prints it alone), then sbatch FILE", ""]
    return "\n".join(lines) + "\n" + sbatch_script(launch)
