"""Load benchmark of `msa-eval serve`: requests/s and time-to-first-token percentiles at several
numbers of concurrent clients (closed loop: each client sends its next request as soon as the
previous one finished).

    python -m benchmarks.serve.run --preset cpu [--json OUT]                 # starts a server itself
    python -m benchmarks.serve.run --preset cpu --base-url http://127.0.0.1:8000/v1

Every request is a streaming chat completion with temperature 0 and a fixed max_tokens; the model
may stop early at EOS (generated tokens are counted from usage). Prompts differ per request (a
counter in the text) so no two requests are identical. TTFT = time from sending the request to the
first content delta, measured in the client. Per level: `repeats` timed runs after one warm-up level;
each column of the table is the median over the runs (the JSON keeps every request).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cli import env_row, parser, run_sections, table

QUESTIONS = ["Name a fruit that is red.", "What is the capital of Italy?", "Give one word that rhymes with cat.",
             "How many legs does a spider have?", "Name a planet in the solar system.", "What colour is the sky?"]


@dataclass(frozen=True)
class Preset:
    doc: str
    device: str = "cpu"
    clients: tuple[int, ...] = (1, 8, 32)
    rounds: int = 3  # requests per client at each level
    min_requests: int = 8
    repeats: int = 3
    max_tokens: int = 16
    max_batch: int = 32
    model: str = "smollm2-135m"
    attention: str = "dense"


PRESETS: dict[str, Preset] = {
    "cpu": Preset("the README's CPU row: default model, dense, 1 / 8 / 32 clients, 3 requests each, median of 3"),
    "gpu": Preset("the README's H200 row: the same on cuda, 8 requests per client", device="cuda", rounds=8),
    "ci": Preset("tiny: 1 and 2 clients, 2 requests, 4 tokens, one run (under a minute with the server start)",
                 clients=(1, 2), rounds=1, min_requests=2, repeats=1, max_tokens=4),
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(client, model: str, i: int, max_tokens: int) -> dict:
    msg = f"Request {i}. {QUESTIONS[i % len(QUESTIONS)]}"
    start = time.perf_counter()
    ttft, usage = None, None
    stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": msg}],
                                                  temperature=0, max_tokens=max_tokens, stream=True,
                                                  stream_options={"include_usage": True})
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage
    return {"ttft_s": ttft, "latency_s": time.perf_counter() - start,
            "completion_tokens": usage.completion_tokens if usage else None}


async def level(base_url: str, model: str, clients: int, requests: int, max_tokens: int, offset: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    counter = iter(range(offset, offset + requests))
    results: list[dict] = []

    async def worker() -> None:
        for i in counter:
            results.append(await one_request(client, model, i, max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - start
    await client.close()
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    toks = sum(r["completion_tokens"] or 0 for r in results)
    return {"clients": clients, "requests": len(results), "wall_s": wall, "req_per_s": len(results) / wall,
            "gen_tok_per_s": toks / wall, "ttft_p50": pct(ttfts, 0.5), "ttft_p90": pct(ttfts, 0.9),
            "ttft_p99": pct(ttfts, 0.99), "latency_p50": statistics.median(r["latency_s"] for r in results),
            "raw": results}


async def bench(p: Preset, base_url: str) -> list[dict]:
    await level(base_url, p.model, 2, 4, p.max_tokens, 10_000)  # warm-up
    rows, offset = [], 0
    for c in p.clients:
        n = max(p.min_requests, c * p.rounds)
        runs = []
        for _ in range(p.repeats):
            runs.append(await level(base_url, p.model, c, n, p.max_tokens, offset))
            offset += n
            r = runs[-1]
            print(f"clients={c:3d} requests={r['requests']:4d} req/s={r['req_per_s']:.3f} "
                  f"TTFT p50/p90/p99={r['ttft_p50']:.2f}/{r['ttft_p90']:.2f}/{r['ttft_p99']:.2f}s", flush=True)
        keys = [k for k in runs[0] if k not in ("clients", "requests", "raw")]
        rows.append({"bench": "serve", "clients": c, "requests": n, "repeats": len(runs),
                     "requests_x_repeats": f"{n} x {len(runs)}",
                     **{k: statistics.median(r[k] for r in runs) for k in keys}, "runs": runs})
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(p: Preset, startup_s: float = 300.0) -> Iterator[str]:
    """`msa-eval serve` (or `python -m engine.server`, the same options, where the msa-eval script is
    not installed) on a free local port; yields its base URL and stops it afterwards."""
    import httpx

    port = free_port()
    exe = Path(sys.executable).with_name("msa-eval")
    launcher = [str(exe), "serve"] if exe.exists() else [sys.executable, "-m", "engine.server"]
    cmd = [*launcher, "--host", "127.0.0.1", "--port", str(port), "--model", p.model, "--attention", p.attention,
           "--device", p.device, "--max-batch", str(p.max_batch), "--max-queue", "64"]
    print("server:", " ".join(cmd[1:]), flush=True)
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + startup_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"server did not come up (exit code {proc.poll()}): {log.read()[-3000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(p: Preset, base_url: str | None) -> list[dict]:
    if base_url:
        return asyncio.run(bench(p, base_url))
    with running_server(p) as url:
        return asyncio.run(bench(p, url))


COLUMNS = [("clients", "clients", "{}"), ("requests x repeats", "requests_x_repeats", "{}"),
           ("requests/s", "req_per_s", "{:.3f}"), ("generated tok/s", "gen_tok_per_s", "{:.1f}"),
           ("TTFT p50 (s)", "ttft_p50", "{:.2f}"), ("TTFT p90 (s)", "ttft_p90", "{:.2f}"),
           ("TTFT p99 (s)", "ttft_p99", "{:.2f}"), ("latency p50 (s)", "latency_p50", "{:.2f}")]


def main(argv: list[str] | None = None) -> None:
    ap = parser("python -m benchmarks.serve.run", __doc__, PRESETS)
    ap.add_argument("--base-url", help="load a running server instead of starting one (its model must be the "
                    "preset's)")
    args = ap.parse_args(argv)
    p = PRESETS[args.preset]
    rows: list[dict] = [env_row(args.preset, ("openai", "uvicorn"), model=p.model, attention=p.attention,
                                device=p.device, max_tokens=p.max_tokens, max_batch=p.max_batch,
                                base_url=args.base_url)]
    run_sections([("serve", lambda: run(p, args.base_url) + [{"bench": "end", "loadavg_1m": os.getloadavg()[0]}])],
                 rows, args.json)
    print(table([r for r in rows if r["bench"] == "serve"], COLUMNS))
    for r in rows:
        if r["bench"] == "error":
            print("error:", r)


if __name__ == "__main__":
    main()
