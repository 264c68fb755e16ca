"""`python -m engine.server`: the server without the msa-eval CLI (machines that have only the
engine's dependencies, e.g. the GPU device). Same options as `msa-eval serve`."""
from __future__ import annotations

import argparse

import uvicorn

from engine.server.app import create_app
from engine.server.config import ServerConfig


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.server", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--attention", default="dense", choices=["dense", "msa", "msa-ref"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-body-bytes", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--log-level", default="warning")
    a = ap.parse_args()
    config = ServerConfig(model=a.model, attention=a.attention, host=a.host, port=a.port, max_batch=a.max_batch,
                          max_queue=a.max_queue, max_model_len=a.max_model_len, device=a.device,
                          max_body_bytes=a.max_body_bytes)
    uvicorn.run(create_app(config), host=a.host, port=a.port, log_level=a.log_level, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
