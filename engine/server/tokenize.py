"""Tokenizer endpoints in vLLM's shape, which lm-eval's `tokenizer_backend=remote` uses:
GET /tokenizer_info, POST /tokenize ({"prompt"} or {"messages"}), POST /detokenize."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from engine.server.errors import ApiError
from engine.server.schemas import ChatMessage
from engine.server.state import ServingState


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
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
        if req.prompt is not None:
            ids = state.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            msgs = [{"role": m.role, "content": m.text()} for m in req.messages or []]
            ids = state.encode(tok.apply_chat_template(msgs, add_generation_prompt=req.add_generation_prompt))
        return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}

    @router.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        vocab = tok.vocab_size
        if any(not 0 <= t < vocab for t in req.tokens):
            raise ApiError(400, f"token ids must lie in 0..{vocab - 1}", param="tokens")
        return {"prompt": tok.decode(req.tokens, skip_special_tokens=False)}

    return router
