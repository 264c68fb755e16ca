"""Load benchmark of `msa-eval serve`: requests/s and time-to-first-token percentiles at
several numbers of concurrent clients (closed loop: each client sends its next request as
soon as the previous one finished).

    .venv/bin/python benchmarks/serve/bench_load.py                       # starts a server itself
    .venv/bin/python benchmarks/serve/bench_load.py --base-url http://127.0.0.1:8000/v1

Every request is a streaming chat completion with temperature 0 and a fixed max_tokens and
the model may stop early at EOS (generated tokens are counted from usage).
Prompts differ per request (a counter in the text) so no two requests are identical.
Writes a JSON file with the raw per-request numbers next to the printed Markdown table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

QUESTIONS = ["Name a fruit that is red.", "What is the capital of Italy?", "Give one word that rhymes with cat.",
             "How many legs does a spider have?", "Name a planet in the solar system.", "What colour is the sky?"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(client: openai.AsyncOpenAI, model: str, i: int, max_tokens: int) -> dict:
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


async def bench(args: argparse.Namespace, base_url: str) -> list[dict]:
    """Per level: `repeats` timed runs after the warm-up; the table shows the median of each column."""
    await level(base_url, args.model, 2, 4, args.max_tokens, 10_000)  # warm-up
    rows, offset = [], 0
    for c in args.clients:
        n = max(args.min_requests, c * args.rounds)
        runs = []
        for _ in range(args.repeats):
            runs.append(await level(base_url, args.model, c, n, args.max_tokens, offset))
            offset += n
            r = runs[-1]
            print(f"clients={c:3d} requests={r['requests']:4d} req/s={r['req_per_s']:.3f} "
                  f"TTFT p50/p90/p99={r['ttft_p50']:.2f}/{r['ttft_p90']:.2f}/{r['ttft_p99']:.2f}s", flush=True)
        keys = [k for k in runs[0] if k not in ("clients", "requests", "raw")]
        rows.append({"clients": c, "requests": n, "repeats": len(runs),
                     **{k: statistics.median(r[k] for r in runs) for k in keys}, "runs": runs})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| clients | requests x repeats | requests/s | generated tok/s | TTFT p50 (s) | TTFT p90 (s) | TTFT p99 (s) | latency p50 (s) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['clients']} | {r['requests']} x {r['repeats']} | {r['req_per_s']:.3f} | {r['gen_tok_per_s']:.1f} | "
                   f"{r['ttft_p50']:.2f} | {r['ttft_p90']:.2f} | {r['ttft_p99']:.2f} | {r['latency_p50']:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=None, help="benchmark a running server instead of starting one")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--attention", default="dense")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=2, help="requests per client at each level")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per level (median reported)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = ap.parse_args()
    if args.base_url:
        rows = asyncio.run(bench(args, args.base_url))
    else:
        from tests.engine.serve_process import running_server

        with running_server("--model", args.model, "--attention", args.attention, "--max-batch", str(args.max_batch),
                            "--max-queue", "64", *(["--device", args.device] if args.device != "cpu" else [])) as url:
            rows = asyncio.run(bench(args, url))
    import torch

    meta = {"command": " ".join(sys.argv), "python": platform.python_version(), "torch": torch.__version__,
            "openai": openai.__version__, "machine": platform.machine(), "cpus": __import__("os").cpu_count(),
            "model": args.model, "attention": args.attention, "device": args.device, "max_tokens": args.max_tokens,
            "max_batch": args.max_batch, "loadavg_1m_at_end": __import__("os").getloadavg()[0]}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(json.dumps({k: v for k, v in meta.items()}))
    print(table(rows))


if __name__ == "__main__":
    main()
