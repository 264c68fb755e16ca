"""Context policies: what part of the full history is sent to the model each step.

The full history is always kept (and written to the trajectory); a policy only builds the
*view* sent to the model, and every change it makes is recorded as an event.

  none                   send everything; over the window -> exit `context_overflow`
  truncate-observations  tool results older than the last `keep_recent` are cut to head+tail
                         of `max_old_obs_chars` characters
  summarize              when the view exceeds `trigger` x window, the model is asked to
                         summarise the older part; the view becomes the initial messages, the
                         summary, and the messages after the cut (compaction)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

POLICIES = ("none", "truncate-observations", "summarize")
SUMMARY_REQUEST = "[msa-eval summarize request]"


@dataclass
class ContextPolicy:
    name: str = "none"
    keep_recent: int = 4
    max_old_obs_chars: int = 600
    trigger: float = 0.75
    summaries: list[dict[str, Any]] = field(default_factory=list)  # {"cut": index, "text": str}
    _last_truncated: int = 0

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown context policy {self.name!r}; choose one of {', '.join(POLICIES)}")

    def restore(self, events: list[dict[str, Any]]) -> None:
        """Re-load summaries from a trajectory's events (resume)."""
        self.summaries = [e["detail"] for e in events if e.get("kind") == "summarize"]
        trunc = [e for e in events if e.get("kind") == "truncate-observations"]
        self._last_truncated = trunc[-1]["detail"]["truncated_messages"] if trunc else 0

    def view(self, history: list[dict[str, Any]], n_initial: int, count: Callable[[list], int],
             window: int, summarize: Callable[[list], str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(messages to send, new events)."""
        events: list[dict[str, Any]] = []
        if self.name == "truncate-observations":
            return self._truncate(history, events, count), events
        if self.name == "summarize":
            view = self._summarized(history, n_initial)
            if count(view) > self.trigger * window:
                cut = _cut_point(history, max(n_initial, len(history) - self.keep_recent))
                if cut > (self.summaries[-1]["cut"] if self.summaries else n_initial):
                    before = count(view)
                    text = summarize(self._summarized(history[:cut], n_initial))
                    self.summaries.append({"cut": cut, "text": text})
                    view = self._summarized(history, n_initial)
                    events.append({"kind": "summarize", "detail": {"cut": cut, "text": text,
                                   "tokens_before": before, "tokens_after": count(view)}})
            return view, events
        return list(history), events

    def _truncate(self, history, events, count):
        tool_idx = [i for i, m in enumerate(history) if _is_observation(m)]
        old = set(tool_idx[:-self.keep_recent]) if self.keep_recent else set(tool_idx)
        view, n = [], 0
        for i, m in enumerate(history):
            c = m.get("content") or ""
            if i in old and len(c) > self.max_old_obs_chars:
                h = self.max_old_obs_chars // 2
                note = f"\n...[observation truncated by context policy: {len(c)} chars]...\n"
                m = {**m, "content": c[:h] + note + c[-h:]}
                n += 1
            view.append(m)
        if n != self._last_truncated:
            events.append({"kind": "truncate-observations", "detail": {
                "truncated_messages": n, "tokens_before": count(history), "tokens_after": count(view)}})
            self._last_truncated = n
        return view

    def _summarized(self, history, n_initial):
        if not self.summaries:
            return list(history)
        s = self.summaries[-1]
        note = {"role": "user",
                "content": "Summary of your earlier work (older messages were compacted):\n" + s["text"]}
        return list(history[:n_initial]) + [note] + list(history[s["cut"]:])


def _is_observation(m: dict[str, Any]) -> bool:
    return m.get("role") == "tool" or (m.get("role") == "user" and str(m.get("content", "")).startswith("<tool_result"))


def _cut_point(history: list[dict[str, Any]], at: int) -> int:
    """Move `at` back to an assistant message so no tool result is orphaned from its call."""
    while at > 0 and history[at].get("role") != "assistant":
        at -= 1
    return at


def summary_request(view: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return view + [{"role": "user", "content": SUMMARY_REQUEST + "\nSummarise the work so far: what you have "
                    "learned, the facts you still need, and what you changed. Be concise; do not call tools."}]
