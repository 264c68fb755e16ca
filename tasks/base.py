"""The task contract shared by every offline suite (HELMET-style, repo-scale coding, ...).

A `Task` turns (target length, sample index, seed, prompt mode, reference tokenizer) into a
`Sample`: one prompt -- completion text or chat messages -- with its gold answers, its
metadata (needle depth, target length, item counts, truncated tokens) and a scorer.
Samples are generated ONCE per (task, length, mode) and the identical text goes to every
backend; each backend reports its own prompt-token count back.

Scoring: `sample.score(output)` returns a dict with at least
    score:   float in [0, 1], the task's headline metric (empty / failed output -> 0.0)
    metric:  str, the headline metric's name ("subem", "recall", "ndcg@10", ...)
    parsed:  str | None, the answer extracted from the output (None = extraction failed)
    extraction_failed: bool
and any secondary metrics as further float entries (e.g. citation_precision).

`tasks/` knows nothing of the engine: the tokenizer comes in as the `TokenCounter` protocol.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

PromptMode = Literal["chat", "completion"]


class TaskError(ValueError):
    """Bad task input (unknown task, impossible length, missing data file); one-line message."""


@runtime_checkable
class TokenCounter(Protocol):
    """The reference tokenizer the prompts are fitted with (e.g. the default model's)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = True
    ) -> str: ...


ChatPrefix = Literal["omit", "user", "assistant"]


@dataclass
class PromptParts:
    """A prompt split so that only `context` is ever truncated (HELMET policy).

    Rendered text = before + context + after; in completion mode the answer prefix follows
    on a new line (the model continues after it). In chat mode the user turn is
    before + context + after and `chat_prefix` places the answer prefix:
      "omit"      -- not sent (HELMET's chat policy);
      "user"      -- appended to the user turn (RULER's API mode);
      "assistant" -- a final assistant message the model continues (RULER/HELMET put the
                     prefix right after the generation prompt; see `continue_chat_text`).
    """

    before: str
    context: str
    after: str
    answer_prefix: str = ""
    system: str | None = None
    chat_prefix: ChatPrefix = "omit"


def continues_assistant(messages: list[dict[str, Any]] | None) -> bool:
    """True when a chat ends with an assistant message the model must continue (a prefill)."""
    return bool(messages and messages[-1].get("role") == "assistant")


def continue_chat_text(messages: list[dict[str, Any]], tok: TokenCounter) -> str:
    """The templated text of a chat whose last message is an assistant prefill: the template
    of the earlier turns with the generation prompt, then the prefill verbatim (what
    `continue_final_message` gives for ChatML-style templates). A chat without a prefill is
    rendered with the generation prompt as usual."""
    if not continues_assistant(messages):
        return tok.apply_chat_template(messages, add_generation_prompt=True)
    head = tok.apply_chat_template(messages[:-1], add_generation_prompt=True)
    return head + (messages[-1].get("content") or "")


@dataclass
class Sample:
    """One prompt with its gold answers. Exactly one of `prompt` / `messages` is set."""

    id: str  # stable and unique across the suite: "<task>/<target_length>/<index>"
    task: str
    category: str
    answers: list[str]  # gold answers (any-of, or all-of: the task's metric decides)
    prompt: str | None = None  # completion mode: full text ending with the answer prefix
    messages: list[dict[str, Any]] | None = None  # chat mode
    mode: PromptMode = "chat"
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    # target_length, prompt_tokens (reference tokenizer), depth (0..1 for needle tasks),
    # n_items, seed, truncated_tokens, answer_prefix, fidelity ...
    metadata: dict[str, Any] = field(default_factory=dict)
    scorer: Callable[[Sample, str | None], dict[str, Any]] | None = field(
        default=None, repr=False, compare=False
    )

    def score(self, output: str | None) -> dict[str, Any]:
        """Score a model output; None or empty output scores 0 with extraction_failed=True."""
        if self.scorer is None:
            raise TaskError(f"sample {self.id} has no scorer; build it through its Task")
        return self.scorer(self, output)

    def prompt_text(self) -> str:
        """The text that identifies this prompt (for hashing): completion text or messages."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(f"<{m['role']}>{m.get('content') or ''}" for m in self.messages or [])

    def prompt_hash(self) -> str:
        return hashlib.sha256(self.prompt_text().encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (no scorer)."""
        return {
            "id": self.id, "task": self.task, "category": self.category,
            "answers": self.answers, "prompt": self.prompt, "messages": self.messages,
            "mode": self.mode, "max_tokens": self.max_tokens, "stop": self.stop,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class BuildSpec:
    """What a task needs to build samples at one length."""

    target_length: int  # tokens: prompt (template included) + generation budget
    tokenizer: TokenCounter
    mode: PromptMode = "chat"
    seed: int = 42
    max_tokens: int | None = None  # override the task's generation budget


def sample_seed(seed: int, task: str, target_length: int, index: int) -> int:
    """Per-sample seed = SHA-256(seed, task, length, index): stable across machines."""
    h = hashlib.sha256(f"{seed}|{task}|{target_length}|{index}".encode()).digest()
    return int.from_bytes(h[:8], "big")


class Task(ABC):
    """A family of samples. Subclasses set the class attributes and implement `build`."""

    name: ClassVar[str]
    category: ClassVar[str]  # e.g. "recall", "rag", "rerank", "cite", "longqa", "summ", "icl", "repo"
    fidelity: ClassVar[str] = "analogue"  # "faithful" | "analogue" | "real-data"
    metric: ClassVar[str]
    max_tokens: ClassVar[int] = 64
    stop: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    open_ended: ClassVar[bool] = False  # free-form output an optional judge may grade (msa_eval/judge.py)

    @abstractmethod
    def build(self, index: int, spec: BuildSpec) -> Sample:
        """Build sample `index` at `spec.target_length`; deterministic in (spec.seed, index)."""

    @abstractmethod
    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        """Score one output (see module docstring for the dict's keys)."""

    def samples(self, spec: BuildSpec, n: int, start: int = 0) -> Iterator[Sample]:
        for i in range(start, start + n):
            yield self.build(i, spec)

    def budget(self, spec: BuildSpec) -> int:
        return spec.max_tokens if spec.max_tokens is not None else self.max_tokens

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name, "category": self.category, "fidelity": self.fidelity,
            "metric": self.metric, "max_tokens": self.max_tokens,
            "stop": list(self.stop), "description": self.description, "open_ended": self.open_ended,
        }


def failed_score(metric: str, **extra: float) -> dict[str, Any]:
    """The score dict of an empty, failed or unparseable output."""
    return {"score": 0.0, "metric": metric, "parsed": None, "extraction_failed": True, **extra}
