"""OpenAI-compatible HTTP server over `engine.LLM` (`msa-eval serve`).

Layout: schemas (pydantic edge), async_engine (the one engine thread), toolcalls (render/parse
tool calls), generation (one request; its text through `engine.textstream`),
chat / completions (routes), tokenize (lm-eval's remote tokenizer endpoints), metrics
(Prometheus), app (assembly). Run it with `msa-eval serve` or `python -m engine.server`.
"""
from engine.server.config import ServerConfig

__all__ = ["ServerConfig", "build_app", "create_app"]


def __getattr__(name: str):
    if name in ("build_app", "create_app"):
        from engine.server import app

        return getattr(app, name)
    raise AttributeError(name)
