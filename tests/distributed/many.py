"""Several training runs in one launch of the ranks: each rank joins the process group once and
trains the runs one after the other (every run makes its own groups and meshes), so that a test
module pays the start of 2 or 4 Python processes with torch once, not once per plan."""

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paraplan.system.localnet import free_port
from paraplan.system.processes import start_method


def _ranks(rank: int, world: int, port: int, configs: list) -> None:
    from paraplan.runtime.kinds import train_rank
    from paraplan.runtime.launcher.launch import die_with_parent

    die_with_parent()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        for config in configs:
            train_rank(config)
    finally:
        dist.destroy_process_group()


def train_many(configs: list, world: int) -> None:
    for config in configs:  # each run writes into its own directory
        if config.out_dir is not None:
            Path(config.out_dir).mkdir(parents=True, exist_ok=True)
    # from the warm forkserver, as `paraplan train` starts its ranks (system/processes.py)
    mp.start_processes(_ranks, args=(world, free_port(), configs), nprocs=world, start_method=start_method())


def train_sgd(root: Path, plans: dict, world: int) -> dict:
    """Each plan (name -> Plan) trained 2 SGD steps (lr 0.1, no dropout) into root/name, in one
    launch of `world` ranks: the recipe the agreement-with-one-process tests compare; name -> config."""
    from paraplan.runtime.config import TrainConfig

    configs = {name: TrainConfig(plan=plan, model=plan.model, out_dir=str(Path(root) / name), dropout=False, steps=2,
                                 optimizer="sgd", lr=0.1) for name, plan in plans.items()}
    train_many(list(configs.values()), world)
    return configs
