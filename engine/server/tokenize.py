"""Tokenizer endpoints in vLLM's shape, which lm-eval's `tokenizer_backend=remote` uses:
GET /tokenizer_info, POST /tokenize ({"prompt"} or {"messages"}), POST /detokenize.

`prompt` may also be a list of chat messages: lm-eval's remote tokenizer with `--apply_chat_template`
sends the chat history it would render as `{"prompt": [{"role", "content"}, ...]}`; it is rendered
through the chat template, as `messages` is.

/tokenize takes text longer than the context (lm-eval tokenises long documents to truncate
them); the body-size limit bounds it. Tokenising runs in a worker thread, off the event loop."""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import Field

from engine.server.errors import ApiError
from engine.server.schemas import ChatMessage, RequestBody
from engine.server.state import ServingState


class TokenizeRequest(RequestBody):
    prompt: str | list[ChatMessage] | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(RequestBody):
    tokens: list[int] = Field(min_length=0)


def tokenizer_router(state: ServingState) -> APIRouter:
    router = APIRouter()
    tok = state.llm.tokenizer

    @router.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        return {"model": state.model_names[0], "max_model_len": state.max_model_len,
                "eos_token": tok.eos_token, "bos_token": tok.bos_token, "pad_token": None,
                "chat_template": tok.chat_template}

    @router.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "give exactly one of prompt or messages", param="prompt")
        if isinstance(req.prompt, list) and not req.prompt:
            raise ApiError(400, "prompt as chat messages must hold at least one message", param="prompt")
        if isinstance(req.prompt, str):
            ids = await asyncio.to_thread(state.encode, req.prompt, req.add_special_tokens)
        else:
            msgs = [{"role": m.role, "content": m.text()} for m in req.prompt or req.messages or []]
            text = await asyncio.to_thread(state.apply_template, msgs, None, req.add_generation_prompt)
            ids = await asyncio.to_thread(state.encode, text)
        return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}

    @router.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        vocab = tok.vocab_size
        if any(not 0 <= t < vocab for t in req.tokens):
            raise ApiError(400, f"token ids must lie in 0..{vocab - 1}", param="tokens")
        return {"prompt": await asyncio.to_thread(tok.decode, req.tokens, False)}

    return router
