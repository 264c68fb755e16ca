"""Start `msa-eval serve` as a real subprocess on 127.0.0.1 (free port) for the server tests."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(*args: str, startup_s: float = 180.0) -> Iterator[str]:
    """Yield the base URL (`http://127.0.0.1:PORT/v1`) of a live server; stop it afterwards."""
    port = free_port()
    exe = Path(sys.executable).with_name("msa-eval")
    # the real CLI; `python -m engine.server` (same options) where msa-eval is not installed
    launcher = [str(exe), "serve"] if exe.exists() else [sys.executable, "-m", "engine.server"]
    log = tempfile.NamedTemporaryFile("w+", prefix="msa-serve-", suffix=".log", delete=False)
    cmd = [*launcher, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {Path(log.name).read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not come up in {startup_s}s: {Path(log.name).read_text()[-3000:]}")
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)
