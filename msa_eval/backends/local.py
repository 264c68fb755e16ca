"""`local` backend: the in-process engine (`engine.LLM`), dense or MSA attention.

Completion-mode requests are tokenized as given; chat-mode requests go through the model's
chat template (tools rendered the same way the server renders them), so `--backend local`
and `--backend openai` against `msa-eval serve` see the identical token sequence.
Requests are submitted at once and served by continuous batching (sizes per device: `BATCHING`);
`generate_stream` yields each result as its request finishes, so the runner records it then. The
engine's metrics other than the timings go to `GenResult.extra` (`attention_density`; with
`msa_telemetry=True`, the MSA arms' selection telemetry `msa_telemetry`, engine/msa/telemetry.py, which the
runner keeps in the record).
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from msa_eval.backends.base import BackendError, ChatResponse, GenRequest, GenResult, ToolCall


@dataclass(frozen=True)
class Batching:
    """How many requests the runner hands over at once (`concurrency`) and the engine decodes together
    (`max_num_seqs`, prefill chunks of `max_num_batched_tokens`), per device: 2 CPU cores gain nothing from a
    wide batch (the main job's timings are at concurrency 1), while a GPU chunking 64 8K prompts 2048 tokens at a
    time and decoding 8 of them at once runs at a fraction of its speed."""

    concurrency: int
    max_num_seqs: int
    max_num_batched_tokens: int


BATCHING = {"cpu": Batching(1, 8, 2048), "cuda": Batching(64, 64, 16384)}


def batching(device: str | None = None) -> Batching:
    """The batching defaults of `device` (None: the engine's default device)."""
    import torch

    from engine.llm import default_device

    kind = torch.device(device).type if device else default_device().type
    return BATCHING.get(kind, BATCHING["cpu"])


class LocalBackend:
    name = "local"

    def __init__(self, model: str = "smollm2-135m", attention: str = "dense", device: str | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, progress: bool = True, **llm_opts: Any):
        from engine import LLM

        self.attention = attention
        b = batching(device)
        self.llm = LLM(model, attention=attention, device=device, max_num_seqs=max_num_seqs or b.max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens or b.max_num_batched_tokens,
                       max_model_len=max_model_len, progress=progress, **llm_opts)
        self.tokenizer = self.llm.tokenizer

    def close(self) -> None:
        """Stop the engine's tensor-parallel workers, if any (the runner calls it when a backend is done)."""
        self.llm.close()

    # -- interface ------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        llm = self.llm
        d = {"backend": "local", "model": llm.model_id, "model_path": str(llm.model_path),
             "model_sha256": llm.model_sha256, "tokenizer_sha256": self.tokenizer.fingerprint(),
             "attention": self.attention, "device": str(llm.device), "dtype": str(llm.dtype).replace("torch.", ""),
             "max_model_len": llm.max_model_len, "kv_cache_dtype": llm.kv_dtype_name}
        msa = getattr(llm, "msa", None)
        if msa is not None:
            d["msa"] = msa.describe() if hasattr(msa, "describe") else repr(msa)
        return d

    def count_tokens(self, text: str) -> int | None:
        return len(self.tokenizer.encode(text, add_special_tokens=True))

    def prompt_ids(self, req: GenRequest) -> list[int]:
        if req.messages is not None:
            text = self.tokenizer.apply_chat_template(req.messages)
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.encode(req.prompt or "", add_special_tokens=True)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        by_id = {res.id: res for res in self.generate_stream(requests)}
        return [by_id[r.id] for r in requests]

    def generate_stream(self, requests: Iterable[GenRequest], window: int | None = None) -> Iterator[GenResult]:
        """Continuous batching over `requests`: at most `window` of them held by the engine at once (None: all;
        `max_num_seqs` bounds what runs), the next handed over as one finishes, each result yielded when its
        request finishes (finishing order). A prompt the harness sized wrong (too long for the context, a token
        the model lacks) and a request the engine ended with an error are error results; the others go on.
        Closed early, the generator aborts what has not finished."""
        from engine import SamplingParams
        from engine.errors import ContextTooLongError

        eng = self.llm.engine
        todo = iter(requests)
        live: dict[str, tuple[GenRequest, int, float]] = {}
        try:
            while True:
                while window is None or len(live) < window:
                    r = next(todo, None)
                    if r is None:
                        break
                    ids = self.prompt_ids(r)
                    sp = SamplingParams(max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p,
                                        stop=list(r.stop), seed=r.seed)
                    rid = f"local-{r.id}-{time.monotonic_ns()}"
                    try:
                        eng.add_request(rid, ids, sp)
                    except (ValueError, ContextTooLongError) as e:
                        yield GenResult(r.id, "", "error", prompt_tokens=len(ids), error=str(e))
                        continue
                    live[rid] = (r, len(ids), time.perf_counter())
                if not live:
                    return
                for out in eng.step():
                    if out.finished and out.request_id in live:
                        yield self._result(out.request_id, *live.pop(out.request_id))
                if live and not eng.has_unfinished():
                    raise BackendError(f"local engine went idle with {len(live)} requests unfinished")
        finally:
            for rid in live:
                eng.abort(rid)

    def _result(self, rid: str, r: GenRequest, n_prompt: int, t0: float) -> GenResult:
        try:
            out = self.llm.engine.finish(rid)
        except Exception as e:  # noqa: BLE001 - the engine ended this request with an error: an error record
            return GenResult(r.id, "", "error", prompt_tokens=n_prompt, latency_s=time.perf_counter() - t0,
                             error=f"{type(e).__name__}: {e}")
        m = out.metrics
        extra = {k: v for k, v in m.items() if k not in ("queue_s", "prefill_s", "decode_s", "ttft_s")}
        extra["kv_cache_dtype"] = self.llm.kv_dtype_name  # the record tells bf16 and fp8 runs apart
        return GenResult(
            r.id, out.text, out.finish_reason or "stop", prompt_tokens=n_prompt,
            completion_tokens=len(out.token_ids), latency_s=time.perf_counter() - t0,
            ttft_s=m.get("ttft_s"), queue_s=m.get("queue_s"), prefill_s=m.get("prefill_s"),
            decode_s=m.get("decode_s"), extra=extra)

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             max_tokens: int = 512, temperature: float = 0.0, seed: int | None = None) -> ChatResponse:
        from engine.server.chatoutput import parse_chat_output
        from engine.server.reasoning import prompt_opens_block, reasoning_tags
        from engine.server.toolcalls import messages_for_template, offered_tools, template_supports_tools

        native = template_supports_tools(self.tokenizer.chat_template)
        msgs, tpl_tools = messages_for_template(messages, tools, "auto", native)
        text = self.tokenizer.apply_chat_template(msgs, tools=tpl_tools)
        from engine import SamplingParams

        t0 = time.perf_counter()
        ids = self.tokenizer.encode(text, add_special_tokens=False)

        out = self.llm.generate([ids], SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed))[0]
        # what the server answers: tool calls typed by the offered schemas, <think> blocks (when the template
        # has them, as `--reasoning-parser auto`) split off into extra["reasoning_content"]
        tags = reasoning_tags("auto", self.tokenizer.chat_template)
        parsed = parse_chat_output(out.text, offered_tools(tools), tags,
                                   starts_inside=tags is not None and prompt_opens_block(text[-64:], tags))
        calls = [ToolCall(c.id, c.name, c.arguments) for c in parsed.tool_calls]
        extra = dict(out.metrics)
        if parsed.reasoning_content is not None:
            extra["reasoning_content"] = parsed.reasoning_content
        return ChatResponse(content=parsed.content, tool_calls=calls,
                            finish_reason="tool_calls" if calls else (out.finish_reason or "stop"),
                            prompt_tokens=len(ids), completion_tokens=len(out.token_ids),
                            latency_s=time.perf_counter() - t0, cost_usd=0.0, extra=extra)
