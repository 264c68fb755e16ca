"""Tokenizer and chat template, read from the same files as the weights.

Text <-> ids through the `tokenizers` library (HF `tokenizer.json`, or a byte-level BPE
rebuilt from a GGUF's `tokenizer.ggml.*` fields); chats rendered with the model's own
Jinja chat template, the way transformers renders it.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer

# answer markup the server parses (reasoning blocks, tool calls): `decode` keeps it even where a
# tokenizer marks these tokens special (MiniMax's do), so skipping special tokens does not erase it
MARKUP_TOKENS = ("<think>", "</think>", "<mm:think>", "</mm:think>", "<minimax:tool_call>", "</minimax:tool_call>",
                 "<tool_call>", "</tool_call>", "]<]minimax[>[")


def _raise(msg: str):
    raise jinja2.exceptions.TemplateError(msg)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Tokenizer:
    """`encode`/`decode` plus `apply_chat_template`. Special tokens stay single ids."""

    def __init__(self, tok: HFTokenizer, chat_template: str | None, bos_token: str | None,
                 eos_token: str | None, eos_token_ids: set[int], add_bos: bool):
        self._tok = tok
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_token_ids = set(eos_token_ids)
        self.add_bos = add_bos
        self.bos_token_id = tok.token_to_id(bos_token) if bos_token else None
        self._template = None
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        kept = {tok.token_to_id(t) for t in MARKUP_TOKENS} & special
        self._skipped_ids = special - kept if kept else None  # None: the library's own skipping is right

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # encode_batch releases the GIL (encode holds it): a server thread tokenising a long prompt
        # leaves the event loop free
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens and self._skipped_ids is not None:
            return self._tok.decode([i for i in ids if i not in self._skipped_ids], skip_special_tokens=False)
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def to_json(self) -> str:
        """The `tokenizers` serialization (tokenizer.json text): what a grammar library reads the vocabulary from."""
        return self._tok.to_str()

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, idx: int) -> str | None:
        return self._tok.id_to_token(idx)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, **extra: Any) -> str:
        """Render `messages` with the model's template (a plain fallback if it has none)."""
        if self.chat_template is None:
            parts = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
            return "\n".join(parts) + ("\nassistant:" if add_generation_prompt else "")
        if self._template is None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        return self._template.render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)

    def fingerprint(self) -> str:
        """sha256 of the serialized tokenizer + template (for run manifests)."""
        import hashlib

        h = hashlib.sha256(self._tok.to_str().encode())
        h.update((self.chat_template or "").encode())
        return h.hexdigest()
