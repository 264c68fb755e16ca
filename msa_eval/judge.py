"""The optional judge: a model grades open-ended outputs (summaries, free-form long-doc QA)
against the gold reference with one fixed rubric. Off by default; its scores live in a
record's separate `judge` field and a separate report section, never in `score`, the
category means or the overall score (HELMET judges with GPT-4o; a judge is a model's
opinion, so the headline stays rule-based and reproducible offline).

`--judge SPEC` names any backend through the one backend interface:
    local                      the default model, dense attention
    local:MODEL[:ATTENTION]    a built-in name, HF dir or .gguf (attention: engine.attention.kinds)
    openai:MODEL@BASE_URL      any OpenAI-compatible endpoint (key from $OPENAI_API_KEY or
                               `--judge-opt api_key_env=NAME`)
    preset:NAME                an endpoint preset of configs/endpoints/
The judge sees the question (QA), the reference and the output, never the long document,
as HELMET's LongQA judge does. Its reply must hold "Score: N" with N in 0..3; anything else
is stored as `unparsed` (score None), never guessed.
"""
from __future__ import annotations

import re
from typing import Any

from engine.attention.kinds import ATTENTION_KINDS, check_kind
from msa_eval.errors import MsaEvalError
from msa_eval.runner.config import BackendSpec

RUBRIC_VERSION = "v1"
SCALE_MAX = 3
JUDGE_MAX_TOKENS = 24

_RUBRIC = """You are grading an answer written by an AI model. Compare it with the reference.
{material}
Model answer:
{output}

Grade the model answer against the reference on this scale:
3 = correct and complete: {complete}
2 = mostly correct: {mostly}
1 = partly correct: {partly}
0 = wrong, empty, or off-topic.
Judge only the content, not the style or length. Reply with one line: "Score: N" (N is 0, 1, 2 or 3)."""

_QA = dict(complete="it gives the reference answer (other words are fine)",
           mostly="it contains the reference answer with a small error or extra wrong claims",
           partly="it names part of the reference answer")
_SUMM = dict(complete="it mentions every key event of the reference, in order, with no invented events",
             mostly="it mentions most key events, with at most one error",
             partly="it mentions at least one key event correctly")


class JudgeError(MsaEvalError):
    """A bad --judge spec or option."""


def judge_messages(task_category: str, question: str | None, reference: list[str],
                   output: str) -> list[dict[str, str]]:
    """The rubric prompt for one output, as one user message (every judge gets the same text)."""
    if task_category == "summ":
        material = "Reference summary (the key events):\n" + "\n".join(reference) + "\n"
        kind = _SUMM
    else:
        material = (f"Question: {question}\n" if question else "") + \
            "Reference answer: " + " | ".join(reference) + "\n"
        kind = _QA
    text = _RUBRIC.format(material=material, output=output.strip() or "(empty)", **kind)
    return [{"role": "user", "content": text}]


_SCORE = re.compile(r"score\s*[:=]?\s*\**\s*([0-9]+)", re.IGNORECASE)


def parse_judge_score(text: str | None) -> int | None:
    """N from "Score: N" (case-insensitive; the last such mention wins), or a reply that is
    just the integer; None when no integer in 0..SCALE_MAX is found."""
    if not text:
        return None
    found = _SCORE.findall(text)
    if not found:
        bare = text.strip().rstrip(".")
        found = [bare] if bare.isdigit() else []
    if not found:
        return None
    n = int(found[-1])
    return n if 0 <= n <= SCALE_MAX else None


def parse_judge_spec(spec: str, options: dict[str, Any] | None = None) -> BackendSpec:
    """`--judge SPEC` -> a BackendSpec (see the module docstring for the forms)."""
    opts = dict(options or {})
    kind, _, rest = spec.strip().partition(":")
    if kind == "local":
        from msa_eval.cli.run_setup import DEFAULT_MODEL

        parts = rest.split(":") if rest else []
        attention = check_kind(parts.pop()) if parts and parts[-1] in ATTENTION_KINDS else "dense"
        return BackendSpec("local", ":".join(parts) or DEFAULT_MODEL, attention=attention, options=opts)
    if kind == "openai":
        model, sep, url = rest.partition("@")
        if not sep or not model or not url:
            raise JudgeError(f"bad --judge {spec!r}: use openai:MODEL@BASE_URL, e.g. "
                             "openai:gpt-4o-mini@https://api.openai.com/v1")
        return BackendSpec("openai", model, base_url=url, options=opts)
    if kind == "preset":
        from msa_eval.backends.endpoints import load_preset

        p = load_preset(rest)
        return BackendSpec("openai", p.model, base_url=p.base_url, options={**p.backend_options(), **opts})
    raise JudgeError(f"bad --judge {spec!r}: use local[:MODEL[:ATTENTION]], openai:MODEL@BASE_URL "
                     "or preset:NAME")


def judge_key(spec: BackendSpec) -> str:
    """How a judge is named in records and reports: `local:smollm2-135m`, `openai:gpt-4o-mini`."""
    if spec.kind == "local":
        att = "" if spec.attention in (None, "dense") else f":{spec.attention}"
        return f"local:{spec.model}{att}"
    return f"openai:{spec.model}"
