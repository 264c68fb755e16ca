"""Sample -> `GenRequest` for one backend, and how its prompt went out (`prompt_format`).

Every backend gets the same sample (same prompt hash). Completion samples and plain chats
are sent as they are. A chat that ends with an assistant prefill (the answer prefix opens
the assistant turn and the model continues it, as RULER and HELMET place it) cannot go
through a chat API: "continue the final assistant message" is not in the OpenAI API (vLLM's
`continue_final_message` is an extension). So the runner applies the chat template itself
and sends the text as a completion prompt:

  prompt_format        backend                 text sent
  "completion"         any                     the sample's completion prompt
  "chat"               any                     the messages (the backend applies its template)
  "chat-prefill"       local                   its own tokenizer's template + the prefill
  "chat-prefill-ref"   openai (/completions)   the REFERENCE tokenizer's template + the prefill:
                                               right when the endpoint serves the reference
                                               model (`msa-eval serve`, vLLM/SGLang with the
                                               same checkpoint), wrong for any other model
  "chat-prefix-in-user" openai, chat_only=true the prefill appended to the user turn (RULER's
                                               API mode, `call_api.py`): chat-only providers
The format is stored in every record, so a report reader sees which backends continued the
prefix and which were asked in the user turn.
"""
from __future__ import annotations

from typing import Any

from msa_eval.backends.base import GenRequest
from msa_eval.runner.config import ConfigError
from tasks.base import Sample, TokenCounter, continue_chat_text, continues_assistant


def to_request(s: Sample, backend: Any = None, reference_tokenizer: TokenCounter | None = None,
               ) -> tuple[GenRequest, str]:
    """(request, prompt_format) for sending sample `s` to `backend` (see the module docstring)."""
    base = dict(id=s.id, max_tokens=s.max_tokens, temperature=0.0, stop=list(s.stop),
                seed=s.metadata.get("seed", 0) % (2**31))
    if s.prompt is not None:
        return GenRequest(prompt=s.prompt, **base), "completion"
    messages = s.messages or []
    if not continues_assistant(messages):
        return GenRequest(messages=messages, **base), "chat"
    prefill = messages[-1].get("content") or ""
    if getattr(getattr(backend, "cfg", None), "chat_only", False):
        head = [dict(m) for m in messages[:-1]]
        head[-1]["content"] = (head[-1].get("content") or "") + "\n" + prefill
        return GenRequest(messages=head, **base), "chat-prefix-in-user"
    own = getattr(backend, "tokenizer", None)
    tok = own if own is not None else reference_tokenizer
    if tok is None:
        raise ConfigError(f"sample {s.id} continues an assistant prefill: the runner needs the "
                          "reference tokenizer to apply the chat template (pass reference_tokenizer)")
    return GenRequest(prompt=prefill_text(messages, tok), **base), \
        "chat-prefill" if own is not None else "chat-prefill-ref"


def prefill_text(messages: list[dict[str, Any]], tok: Any) -> str:
    """A chat ending with an assistant prefill as one completion prompt under `tok`'s template."""
    return _without_auto_bos(continue_chat_text(messages, tok), tok)


def _without_auto_bos(text: str, tok: Any) -> str:
    """Completion prompts are encoded with special tokens: when the tokenizer adds a BOS by
    itself and the template already wrote one as text, drop the text copy (no double BOS)."""
    bos = getattr(tok, "bos_token", None)
    if bos and text.startswith(bos) and tok.encode("", add_special_tokens=True):
        return text[len(bos):]
    return text
