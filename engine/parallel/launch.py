"""A tensor-parallel LLM's ranks: `join` (the `LLM` constructor's one call) checks the size and the
devices and returns this process's `TensorParallel`: rank 0 in the caller's process, or, inside a worker
that rank 0 launched (`engine.parallel.worker`), that worker's rank.

Rank 0 launches the other ranks itself once its own shard is built (`start`): one
`python -m engine.parallel.worker` subprocess per rank, which builds the same `LLM` from the same
arguments (its shard, its cache of the same pages), reports ready (or the one-line error it met) on its
stdout, joins the process group and then reads one step per forward from its stdin. Closing the stdin
pipes stops the workers: `close`, the `TensorParallel` being collected (its LLM deleted) or the process
exiting; a worker also exits when rank 0 dies (its stdin ends, or its parent changes).
"""
from __future__ import annotations

import inspect
import logging
import pickle
import subprocess
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from engine.errors import EngineError
from engine.parallel.collectives import all_reduce, process_group, serve_store
from engine.parallel.step import pack_step

log = logging.getLogger(__name__)
WORKER: TensorParallel | None = None  # this process's rank when it is a launched worker (set by worker.py)
STOP_TIMEOUT_S = 10.0  # a worker that has not exited this long after its stdin closed is killed


class ParallelError(EngineError):
    """A tensor-parallel size or device the machine cannot run, or a rank that failed."""


@dataclass(frozen=True)
class WorkerInit:
    """The first message a worker reads: who it is, where the store is, and the `LLM` arguments."""

    rank: int
    world: int
    port: int
    device: str
    settings: dict[str, Any]
    threads: int


def join(size: int, device: torch.device, settings: dict[str, Any]) -> TensorParallel:
    """This process's rank of an LLM of `size` ranks; `settings`: the `LLM` constructor's arguments."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ParallelError(f"tensor_parallel_size must be an integer >= 1, got {size!r}")
    if WORKER is not None:
        return WORKER
    if settings.get("weights") not in (None, "fp32"):
        raise ParallelError(f"weights={settings['weights']!r} is a single-process CPU mode: leave weights unset "
                            "under tensor parallelism (or drop --tensor-parallel-size)")
    return TensorParallel(0, size, first_device(size, device), settings)


def first_device(size: int, device: torch.device) -> torch.device:
    """Rank 0's device: the CPU (gloo; any number of ranks), or the first of `size` GPUs (rank r on the r-th)."""
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ParallelError(f"tensor parallelism runs on CUDA GPUs (NCCL) or the CPU (gloo), not on {device.type}")
    first, have = device.index or 0, torch.cuda.device_count()
    if first + size > have:
        fix = "use --device cpu (gloo)" if have == 0 else f"use --tensor-parallel-size {max(have - first, 1)} or less"
        raise ParallelError(f"tensor_parallel_size {size} needs GPUs cuda:{first}..cuda:{first + size - 1}, this "
                            f"machine has {have}: {fix}")
    return torch.device("cuda", first)


class TensorParallel:
    """One rank of a tensor-parallel LLM: builds its shard (`llama`, `m3`, `indexer`), sums partial
    outputs (`all_reduce`); rank 0 also launches the others (`start`), sends each forward's inputs
    (`send_step`) and stops them (`close`)."""

    def __init__(self, rank: int, world: int, device: torch.device, settings: dict[str, Any] | None = None):
        self.rank, self.world, self.device = rank, world, device
        self.settings = settings or {}
        self.pg: Any = None  # the process group, joined by `start` (rank 0) or the worker
        self._workers: list[subprocess.Popen] = []
        self._stop: weakref.finalize | None = None
        self._store: Any = None
        self._threads: int | None = None  # rank 0's torch threads before a CPU group took its share
        self.failed: str | None = None  # why the group stopped (a forward failed), or None

    # -- this rank's shard --------------------------------------------------------------------
    def llama(self, cfg, weights):
        from engine.parallel.model import ParallelModel, llama_shard

        return ParallelModel(llama_shard(cfg, weights, self.rank, self.world), self)

    def m3(self, path, cfg, device: torch.device, dtype: torch.dtype):
        from engine.parallel.model import ParallelModel, m3_shard

        return ParallelModel(m3_shard(path, cfg, device, dtype, self.rank, self.world), self)

    def indexer(self, indexer, cfg):
        from engine.parallel.sharding import shard_indexer

        return shard_indexer(indexer, cfg, self.rank, self.world)

    # -- each forward -------------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.pg, t)

    def send_step(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> None:
        """Rank 0: hand this forward's inputs to every other rank."""
        if self.failed is not None:
            raise ParallelError(f"the tensor-parallel ranks stopped after a forward failed ({self.failed}): close "
                                "this LLM and load it again")
        blob = pickle.dumps(pack_step(input_ids, positions, meta), protocol=pickle.HIGHEST_PROTOCOL)
        for r, p in enumerate(self._workers, 1):
            try:
                p.stdin.write(blob)
                p.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                raise ParallelError(f"tensor-parallel rank {r} has exited (code {p.poll()}): close this LLM "
                                    "and load it again") from None

    def fail(self, e: BaseException) -> None:
        """Rank 0's forward failed midway: stop the other ranks at once (they may wait in a collective)."""
        self.failed = f"{type(e).__name__}: {e}"
        _stop_workers(self._workers, timeout=0)

    # -- start and stop -----------------------------------------------------------------------
    def start(self, llm) -> None:
        """Rank 0, once its LLM is built: launch ranks 1..N-1 with the same arguments (and its cache size),
        wait until each has built its shard, join the process group. A worker: nothing (it joins itself)."""
        if self.rank != 0:
            return
        if self.device.type == "cuda" and self.settings.get("cuda_graphs", True):
            log.warning("tensor parallel: CUDA graphs are off, decode steps run eagerly")
        self._store = serve_store(self.world)
        params = inspect.signature(type(llm)).parameters  # the constructor's arguments, nothing else
        settings = {**{k: v for k, v in self.settings.items() if k in params}, "progress": False,
                    "kv_cache_tokens": llm.cache.cfg.num_pages * llm.cache.page_size}
        for _ in range(1, self.world):
            self._workers.append(subprocess.Popen([sys.executable, "-m", "engine.parallel.worker"],
                                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE))
        self._stop = weakref.finalize(self, _stop_workers, list(self._workers))
        try:
            first = self.device.index or 0
            threads = torch.get_num_threads()
            if self.device.type == "cpu":  # the ranks share the cores: each (this one too, until close) its share
                self._threads, threads = threads, max(1, threads // self.world)
                torch.set_num_threads(threads)
            for r, p in enumerate(self._workers, 1):
                dev = "cpu" if self.device.type == "cpu" else f"cuda:{first + r}"
                pickle.dump(WorkerInit(r, self.world, self._store.port, dev, settings, threads),
                            p.stdin)
                p.stdin.flush()
            for r, p in enumerate(self._workers, 1):
                _await_ready(r, p)
            self.pg = process_group(self._store, 0, self.world, self.device)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the other ranks (idempotent)."""
        if self._stop is not None:
            self._stop()
        self.pg = None
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            self._threads = None


def _await_ready(rank: int, p: subprocess.Popen) -> None:
    try:
        kind, text = pickle.load(p.stdout)
    except (EOFError, pickle.UnpicklingError):
        raise ParallelError(f"tensor-parallel rank {rank} exited while starting (code {p.wait()}): see its "
                            "error above") from None
    if kind != "ready":
        raise ParallelError(f"tensor-parallel rank {rank} failed to start: {text}")


def _stop_workers(workers: list[subprocess.Popen], timeout: float = STOP_TIMEOUT_S) -> None:
    for p in workers:
        try:
            p.stdin.close()  # the worker's loop ends at the end of its stdin
        except OSError:
            pass
    for p in workers:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()
