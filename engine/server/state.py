"""What every route needs: the model, the engine bridge, metrics, limits and the prompt helpers."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

from engine.server.async_engine import AsyncEngine
from engine.server.config import ServerConfig
from engine.server.errors import ApiError
from engine.server.metrics import ServerMetrics
from engine.server.reasoning import ThinkTags
from engine.server.schemas import ChatCompletionRequest, CompletionRequest
from engine.server.toolcalls import messages_for_template, template_supports_tools


@dataclass
class ServingState:
    llm: Any  # engine.LLM
    engine: AsyncEngine
    metrics: ServerMetrics
    model_names: tuple[str, ...]  # first is the canonical id
    created: int
    reasoning: ThinkTags | None = None  # the tags answers are split on (engine.server.reasoning), None: not split
    # a request that names no limit generates at most this many (capped by the context)
    default_max_tokens: int = ServerConfig.default_max_tokens

    @classmethod
    def build(cls, llm: Any, engine: AsyncEngine, metrics: ServerMetrics, config: ServerConfig) -> ServingState:
        names = tuple(dict.fromkeys((llm.model_id, *config.served_model_names)))
        return cls(llm, engine, metrics, names, int(time.time()), default_max_tokens=config.default_max_tokens)

    @property
    def max_model_len(self) -> int:
        return int(self.llm.max_model_len)

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """Characters beyond which a text cannot fit the context: every token covers at most the
        longest vocabulary entry's characters (a byte-level or SentencePiece entry spells at least
        the characters it covers), so such text is refused without tokenising it."""
        tok = self.llm.tokenizer
        longest = max(len(tok.id_to_token(i) or "") for i in range(tok.vocab_size))
        return self.max_model_len * max(longest, 1)

    @functools.cached_property
    def native_tools(self) -> bool:
        """Whether the chat template renders `tools` itself (else the Hermes prompt convention is used)."""
        return template_supports_tools(getattr(self.llm.tokenizer, "chat_template", None))

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise ApiError(404, f"model {name!r} is not served here; GET /v1/models lists {list(self.model_names)}",
                           param="model", code="model_not_found")

    def check_length(self, prompt_len: int, max_new: int | None, prompt_param: str) -> int:
        """Validate the prompt against the context limit; return the number of tokens to generate
        (no `max_new`: `default_max_tokens`, or the rest of the context when that is less).
        `prompt_param`: the request field holding the prompt ("messages" on chat, "prompt")."""
        limit = self.max_model_len
        if prompt_len >= limit:
            raise ApiError(400, f"this model's maximum context length is {limit} tokens, but the prompt has "
                                f"{prompt_len} tokens; shorten the prompt", param=prompt_param,
                           code="context_length_exceeded")
        if max_new is None:
            return min(self.default_max_tokens, limit - prompt_len)
        if prompt_len + max_new > limit:
            raise ApiError(400, f"this model's maximum context length is {limit} tokens, but {prompt_len} prompt + "
                                f"{max_new} completion tokens were requested; lower max_tokens to at most "
                                f"{limit - prompt_len}", param="max_tokens", code="context_length_exceeded")
        return max_new

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids the way `LLM.generate` does: chats without, plain prompts with special tokens (BOS).
        Blocking (long texts take a while): the routes call it through `asyncio.to_thread`."""
        return list(self.llm.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def prompt_ids(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        """`encode` for a prompt that must fit the context: text that cannot fit is refused before tokenising."""
        if len(text) > self.max_prompt_chars:
            raise ApiError(400, f"this model's maximum context length is {self.max_model_len} tokens, and the prompt "
                                f"has {len(text)} characters, more than that many tokens can hold; shorten the prompt",
                           param=param, code="context_length_exceeded")
        return self.encode(text, add_special_tokens)

    def chat_prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        """Render the chat and tokenise it (blocking: call through `asyncio.to_thread`)."""
        return self.prompt_ids(self.render_chat(req), False, "messages")

    def apply_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       add_generation_prompt: bool = True) -> str:
        try:
            return self.llm.tokenizer.apply_chat_template(messages, tools=tools,
                                                          add_generation_prompt=add_generation_prompt)
        except Exception as e:  # a template that rejects the conversation (e.g. role order)
            raise ApiError(400, f"the chat template rejected the messages: {e}", param="messages") from e

    def render_chat(self, req: ChatCompletionRequest) -> str:
        """Chat messages (+ tools) -> prompt text through the model's chat template."""
        messages = []
        for m in req.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.text()}
            if m.tool_calls:
                d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
            if m.reasoning_content is not None and m.role == "assistant":
                d["reasoning_content"] = m.reasoning_content
            messages.append(d)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        # (tool_choice naming a function outside tools is refused by the request model)
        choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else (req.tool_choice or "auto")
        messages, tools = messages_for_template(messages, tools, choice, self.native_tools)
        return self.apply_template(messages, tools)

    def sampling_params(self, req: ChatCompletionRequest | CompletionRequest, max_new: int,
                        logprobs: int | None = None, prompt_logprobs: int | None = None) -> Any:
        from engine import SamplingParams

        # the engine stops on a stop string; engine.textstream.IncrementalText cuts the text before it
        return SamplingParams(max_tokens=max_new, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                              stop=req.stop_strings(), ignore_eos=req.ignore_eos, logprobs=logprobs,
                              prompt_logprobs=prompt_logprobs)


def reject_unsupported(req: ChatCompletionRequest | CompletionRequest) -> None:
    """Non-default values of parameters the server cannot honour -> 400 (never silently ignored)."""
    if req.n != 1:
        raise ApiError(400, "only n=1 is supported; send n separate requests", param="n")
    if req.presence_penalty or req.frequency_penalty:
        raise ApiError(400, "presence_penalty and frequency_penalty are not supported; leave them at 0",
                       param="presence_penalty")
    if req.logit_bias:
        raise ApiError(400, "logit_bias is not supported", param="logit_bias")
    if isinstance(req, CompletionRequest) and req.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix")
