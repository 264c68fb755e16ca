"""The collectives of one tensor-parallel group: a process group of its own (gloo on CPUs, NCCL on GPUs;
not torch.distributed's default group, so several parallel LLMs can live in one process) over a TCP store
that rank 0 serves on 127.0.0.1 (every rank runs on this host), and the in-place all-reduce the layers call.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(minutes=30)  # one collective (a forward's all-reduce), one store wait


def serve_store(world: int) -> dist.TCPStore:
    """Rank 0's store on a free port (`store.port` tells the other ranks)."""
    return dist.TCPStore(HOST, 0, world, is_master=True, timeout=TIMEOUT, wait_for_workers=False)


def join_store(port: int, world: int) -> dist.TCPStore:
    return dist.TCPStore(HOST, port, world, is_master=False, timeout=TIMEOUT)


def process_group(store: dist.Store, rank: int, world: int, device: torch.device) -> dist.ProcessGroup:
    """The group's process group on `device` (blocks until every rank has joined)."""
    store = dist.PrefixStore("tp", store)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = TIMEOUT
        return dist.ProcessGroupNCCL(store, rank, world, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=HOST)]
    opts._timeout = TIMEOUT
    return dist.ProcessGroupGloo(store, rank, world, opts)


def all_reduce(pg: dist.ProcessGroup, t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over the ranks, in place (returns `t`)."""
    pg.allreduce([t]).wait()
    return t
