"""Prometheus metrics of the server (one private registry per app, served at GET /metrics)."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("msa_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter("msa_prompt_tokens", "prompt tokens processed", registry=r)
        self.generation_tokens = Counter("msa_generation_tokens", "tokens generated", registry=r)
        self.latency = Histogram("msa_request_latency_seconds", "end-to-end request latency", ["endpoint"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("msa_time_to_first_token_seconds", "time to first generated token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("msa_time_per_output_token_seconds", "decode time per output token after the first",
                              buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2), registry=r)
        self.aborted = Counter("msa_requests_aborted", "engine requests aborted before they finished "
                               "(client disconnected, stop string, error)", registry=r)
        self.running = Gauge("msa_requests_running", "admitted requests that produced a first token", registry=r)
        self.queue_depth = Gauge("msa_queue_depth", "admitted requests still waiting for their first token", registry=r)
        self.forward_passes = Counter("msa_forward_passes", "model forward passes the engine ran", registry=r)
        self.prefill_tokens = Counter("msa_prefill_tokens", "prompt tokens run through the model (prefill chunks)",
                                      registry=r)
        self.kv_cache_usage = Gauge("msa_kv_cache_usage_ratio", "fraction of KV-cache pages in use (0..1)", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def kv_cache_usage(engine: Any) -> float | None:
    """Fraction of KV-cache pages in use (`engine.blocks.usage()`), None if the engine has no pager."""
    blocks = getattr(engine, "blocks", None)
    usage = getattr(blocks, "usage", None)
    return float(usage()) if callable(usage) else None
