"""`python -m engine.parallel.worker`: one tensor-parallel rank above 0, launched by rank 0
(`engine.parallel.launch.TensorParallel.start`), never by hand.

It reads its `WorkerInit` from stdin, builds the `LLM` rank 0 built (its own shard of the model, its KV
cache, its attention object for its local heads), replies ("ready", None) or ("error", one line) on its
stdout, joins the process group, then runs one forward per `Step` read from stdin (planning the decode
step first when rank 0 did), in lockstep with rank 0's through the all-reduces. Its outputs are
discarded: the logits are rank 0's. A forward that fails here ends the worker (rank 0's next collective
then fails, and rank 0 stops the group). It exits when stdin ends (rank 0 closed the LLM or died) or its
parent process changes. Anything it prints goes to stderr (rank 0's stderr).
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from typing import BinaryIO

import torch

PARENT_POLL_S = 1.0


def _reply(out: BinaryIO, kind: str, text: str | None) -> None:
    pickle.dump((kind, text), out)
    out.flush()


def _exit_with_parent() -> None:
    """Exit when rank 0 dies even if this rank is blocked in a collective (its stdin ending covers the rest)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


@torch.inference_mode()
def serve(llm, steps: BinaryIO) -> None:
    """Run rank 0's forwards on this rank's shard until `steps` ends."""
    from engine.parallel.step import unpack_step

    eng = llm.engine
    while True:
        try:
            step = pickle.load(steps)
        except EOFError:
            return
        input_ids, positions, meta = unpack_step(step, llm.device)
        try:
            if step.planned:
                eng.attention.plan_decode(meta, eng.shapes, key="eager")
            llm.model.hidden_states(input_ids, positions, meta, llm.cache, eng.attention)
        except Exception:  # noqa: BLE001 - the ranks may be out of step: exit, rank 0's collective then fails
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)


def main() -> int:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints (and C libraries' output) go to stderr; the old stdout carries the replies
    steps = sys.stdin.buffer
    init = pickle.load(steps)
    _exit_with_parent()
    torch.set_num_threads(init.threads)
    from engine.parallel import launch
    from engine.parallel.collectives import join_store, process_group

    group = launch.WORKER = launch.TensorParallel(init.rank, init.world, torch.device(init.device))
    if group.device.type == "cuda":
        torch.cuda.set_device(group.device)  # before anything is built: Triton launches on the current device
    try:
        from engine.llm import LLM

        llm = LLM(**init.settings)
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which raises it as one line
        _reply(replies, "error", f"{type(e).__name__}: {e}")
        return 1
    _reply(replies, "ready", None)
    group.pg = process_group(join_store(init.port, init.world), init.rank, init.world, group.device)
    serve(llm, steps)
    sys.stderr.flush()
    os._exit(0)  # nothing left to write; skips the interpreter's teardown of torch (seconds)


if __name__ == "__main__":
    sys.exit(main())
