"""runtime/launcher/launch_script.py: the torchrun command of each node and the Slurm script that
`paraplan train --print-launch` prints (tests/distributed/test_print_launch.py runs the node commands
on loopback), and the command line's flags."""

import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli_here

from paraplan.errors import FieldError
from paraplan.runtime.launcher.launch_script import (
    launch_text,
    make_launch,
    node_argv,
    node_commands,
    sbatch_script,
)

ROOT = Path(__file__).resolve().parents[2]
PLAN_2 = ROOT / "examples" / "gpt2-tiny-local-1f1b-2x4.json"  # 2 devices


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_each_node_gets_its_rank_and_the_same_rendezvous():
    launch = make_launch(8, "plan.json", nodes=4, master="10.0.0.1", port=29533, train_options=["--steps", "2"])
    assert launch.gpus_per_node == 2  # the plan's devices split evenly by default
    commands = [shlex.split(c) for c in node_commands(launch)]
    assert [_value(c, "--node-rank") for c in commands] == ["0", "1", "2", "3"]
    for argv in commands:
        assert argv[0] == "torchrun"
        assert (_value(argv, "--nnodes"), _value(argv, "--nproc-per-node")) == ("4", "2")
        assert (_value(argv, "--master-addr"), _value(argv, "--master-port")) == ("10.0.0.1", "29533")
        assert argv[argv.index("-m"):] == ["-m", "paraplan", "train", "--plan", "plan.json", "--steps", "2"]


def test_defaults_one_node_on_loopback():
    launch = make_launch(2, "p.json")
    assert (launch.nodes, launch.gpus_per_node, launch.master, launch.port) == (1, 2, "127.0.0.1", 29500)
    assert len(node_commands(launch)) == 1


@pytest.mark.parametrize("world,kwargs,field,needle", [
    (2, {"nodes": 2, "gpus_per_node": 8}, "gpus_per_node", "2 nodes x 8 processes = 16 ranks, but the plan runs on 2"),
    (16, {"nodes": 2, "gpus_per_node": 4}, "gpus_per_node", "= 8 ranks, but the plan runs on 16"),
    (2, {"nodes": 0}, "nodes", "at least 1, got 0"),
    (2, {"nodes": -1, "gpus_per_node": 2}, "nodes", "at least 1"),
    (2, {"nodes": 3}, "nodes", "2 devices do not split evenly over 3 nodes"),
    (2, {"gpus_per_node": 0}, "gpus_per_node", "at least 1, got 0"),
    (2, {"port": 0}, "port", "1..65535, got 0"),
    (2, {"port": 65536}, "port", "1..65535, got 65536"),
    (2, {"master": ""}, "master", "host name or address"),
    (2, {"master": "10.0.0.1 x"}, "master", "host name or address"),
])
def test_impossible_launches_are_refused(world, kwargs, field, needle):
    with pytest.raises(FieldError) as exc:
        make_launch(world, "p.json", **kwargs)
    assert exc.value.field == field and needle in exc.value.detail
    assert "\n" not in str(exc.value)


def test_paths_with_spaces_and_quotes_stay_one_word():
    plan, out = "my plans/it's 2.json", "runs/a b"
    launch = make_launch(2, plan, nodes=2, train_options=["--out-dir", out, "--lr", "0.01"])
    for k, command in enumerate(node_commands(launch)):
        assert shlex.split(command) == node_argv(launch, k)
        assert shlex.split(command)[-5:] == [plan, "--out-dir", out, "--lr", "0.01"]
    with pytest.raises(ValueError):
        node_argv(launch, 2)


def test_the_sbatch_script_asks_one_task_per_node():
    script = sbatch_script(make_launch(16, "gpt2.json", nodes=2, gpus_per_node=8, port=29533))
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=paraplan-train", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --gpus-per-node=8"]
    # sbatch reads directives only above the first command
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(lines.index(d) < first_command for d in directives)
    srun = [line for line in lines if line.startswith("srun ")]
    assert len(srun) == 1 and "torchrun --nnodes 2 --nproc-per-node 8" in srun[0]
    assert '--node-rank "$SLURM_NODEID"' in srun[0] and "--master-port 29533" in srun[0]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in script
    assert not script.rstrip().endswith("\\")


def test_the_sbatch_script_starts_each_node_command(tmp_path):
    """The script run by bash with stand-ins for scontrol, srun (one task per node, $SLURM_NODEID
    set in each) and torchrun (records its arguments): each node's torchrun gets exactly the node
    command's arguments, quoting included, with the allocation's first host as master."""
    launch = make_launch(6, "my plans/it's a plan.json", nodes=3, master="node-a", port=29533,
                         train_options=["--out-dir", "runs/a b", "--steps", "2", "--no-dropout"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {"scontrol": 'printf "node-a\\nnode-b\\nnode-c\\n"',
                 "srun": 'for k in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do SLURM_NODEID=$k "$@"; done',
                 "torchrun": f'printf "%s\\0" "$@" > {shlex.quote(str(tmp_path))}/node-$SLURM_NODEID'}
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(sbatch_script(launch))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node-[a-c]", "SLURM_JOB_NUM_NODES": "3"}
    res = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    for k in range(3):
        argv = (tmp_path / f"node-{k}").read_text().split("\0")[:-1]
        assert ["torchrun", *argv] == node_argv(launch, k)


def test_launch_text_heads_the_node_commands_and_the_script():
    launch = make_launch(2, "p.json", nodes=2)
    text = launch_text(launch)
    assert [line for line in text.splitlines() if line.startswith("torchrun ")] == node_commands(launch)
    assert "# on node 0:" in text and "# on node 1:" in text and text.endswith(sbatch_script(launch))
    assert launch_text(launch, slurm_only=True) == sbatch_script(launch)


def test_train_print_launch_passes_on_the_options_given(capsys, tmp_path):
    res = run_cli_here(capsys, "train", "--plan", str(PLAN_2), "--print-launch", "--nodes", "2", "--master", "10.0.0.1",
                       "--port", "29533", "--steps", "2", "--out-dir", str(tmp_path / "o u t"), "--no-dropout",
                       "--lr", "0.01", "--seed", "0")
    assert res.returncode == 0, res.stderr
    commands = [shlex.split(line) for line in res.stdout.splitlines() if line.startswith("torchrun ")]
    assert len(commands) == 2
    for k, argv in enumerate(commands):
        assert _value(argv, "--node-rank") == str(k) and _value(argv, "--nproc-per-node") == "1"
        # what differs from the defaults, in the parser's order; --seed 0 is the default
        assert argv[argv.index("-m"):] == ["-m", "paraplan", "train", "--plan", str(PLAN_2), "--steps", "2",
                                           "--lr", "0.01", "--no-dropout", "--out-dir", str(tmp_path / "o u t")]
    assert "#SBATCH --nodes=2" in res.stdout
    assert not (tmp_path / "o u t").exists()  # nothing started, nothing made
    slurm = run_cli_here(capsys, "train", "--plan", str(PLAN_2), "--print-launch", "--nodes", "2", "--slurm")
    assert slurm.returncode == 0 and slurm.stdout.startswith("#!/bin/bash\n")
    assert "torchrun --nnodes 2 --nproc-per-node 1" in slurm.stdout and "# on node" not in slurm.stdout


@pytest.mark.parametrize("args,needle", [
    (["--print-launch", "--nodes", "2", "--gpus-per-node", "8"], "--gpus-per-node: 2 nodes x 8 processes = 16 ranks"),
    (["--print-launch", "--port", "70000"], "--port: must be a TCP port"),
    (["--nodes", "2"], "--nodes: only with --print-launch"),
    (["--slurm", "--master", "h"], "--master, --slurm: only with --print-launch"),
])
def test_train_launch_flags_refused_in_one_line(capsys, args, needle):
    res = run_cli_here(capsys, "train", "--plan", str(PLAN_2), *args)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not res.stdout


def test_train_print_launch_reads_the_plan(capsys, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    res = run_cli_here(capsys, "train", "--plan", str(bad), "--print-launch", "--nodes", "2")
    assert res.returncode == 2 and str(bad) in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not res.stdout


def test_gloo_is_held_to_loopback_only_when_the_master_is_on_this_host():
    from paraplan.runtime.launcher.launch import _loopback

    assert _loopback("127.0.0.1") and _loopback("localhost") and _loopback("::1") and _loopback("127.0.0.2")
    assert not _loopback("10.0.0.1") and not _loopback("node-0") and not _loopback("")
