"""Reasoning blocks: `<think>...</think>` in a model's answer -> `reasoning_content`, the rest -> content.

When. `--reasoning-parser auto` (the default) splits answers of models whose chat template mentions
a think tag (MiniMax-M2's and M3's do; SmolLM2's does not), `think` always, `none` never. The tag pair is
MiniMax-M3's `<mm:think>` / `</mm:think>` when the template names it, else `<think>` / `</think>`.

Rules (one answer, read left to right):
  * the answer starts inside a block when the rendered prompt ends with the open tag (templates
    that open the assistant's thinking themselves); a repeated open tag right there is dropped;
  * each block's text, stripped of surrounding whitespace, is one reasoning part; the parts are
    joined with a blank line; an open tag never closed (a length stop) makes the rest reasoning;
  * content is the text outside the blocks; whitespace and stray close tags before its first
    other character are dropped (MiniMax writes a blank line after the block);
  * no reasoning text (no block, or only empty ones) -> reasoning is None.
`ReasoningSplitter` does this incrementally: what it emits for a text cut anywhere concatenates to
what it gives for the whole text (partial tags are held back until they resolve).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ReasoningParser = Literal["auto", "think", "none"]
REASONING_PARSERS: tuple[ReasoningParser, ...] = ("auto", "think", "none")


@dataclass(frozen=True)
class ThinkTags:
    open: str = "<think>"
    close: str = "</think>"


THINK = ThinkTags()
MM_THINK = ThinkTags("<mm:think>", "</mm:think>")


def reasoning_tags(parser: ReasoningParser, template_source: str | None) -> ThinkTags | None:
    """The tag pair to split on, or None when reasoning is not parsed (the one decision point)."""
    if parser not in REASONING_PARSERS:
        raise ValueError(f"reasoning parser must be one of {', '.join(REASONING_PARSERS)}, got {parser!r}")
    src = template_source or ""
    mentioned = MM_THINK if MM_THINK.open in src else THINK if THINK.open in src else None
    if parser == "none" or (parser == "auto" and mentioned is None):
        return None
    return mentioned or THINK


def prompt_opens_block(prompt_tail: str, tags: ThinkTags) -> bool:
    """Whether a rendered prompt (its tail is enough) leaves the assistant inside a reasoning block."""
    return prompt_tail.rstrip().endswith(tags.open)


def partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class _Trimmed:
    """Stream one text with leading and trailing whitespace removed: trailing whitespace is held
    until more non-whitespace follows (then emitted) or the text ends (then dropped)."""

    def __init__(self) -> None:
        self.started = False
        self.counted = False  # (ReasoningSplitter) this text's first part has been emitted
        self.held = ""

    def feed(self, s: str) -> str:
        if not self.started:
            s = s.lstrip()
            if not s:
                return ""
            self.started = True
        body = s.rstrip()
        if not body:
            self.held += s
            return ""
        out, self.held = self.held + body, s[len(body):]
        return out


class ReasoningSplitter:
    """Incremental split of an answer into (reasoning, content) pieces; see the module rules."""

    def __init__(self, tags: ThinkTags, starts_inside: bool = False) -> None:
        self.tags = tags
        self.inside = starts_inside
        self._buf = ""
        self._fresh_block = starts_inside  # a repeated open tag may follow the prompt's
        self._at_boundary = True  # no content yet: whitespace and stray close tags are dropped
        self._content_started = False
        self._block: _Trimmed | None = _Trimmed() if starts_inside else None
        self._parts = 0  # reasoning parts emitted (a separator goes before the next one)

    def feed(self, piece: str) -> tuple[str, str]:
        """Add text; return the (reasoning, content) that is now safe to emit."""
        self._buf += piece
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        """The text has ended: emit what was held back."""
        return self._drain(final=True)

    def _reason(self, s: str) -> str:
        assert self._block is not None
        out = self._block.feed(s)
        if out and not self._block.counted:  # the block's first text: separate it from the previous part
            self._block.counted = True
            out = ("\n\n" if self._parts else "") + out
            self._parts += 1
        return out

    def _drain(self, final: bool) -> tuple[str, str]:
        t = self.tags
        reasoning, content = [], []
        while self._buf:
            b = self._buf
            if self.inside:
                if self._fresh_block:
                    s = b.lstrip()
                    if not final and t.open.startswith(s) and s != t.open:
                        reasoning.append(self._reason(b[:len(b) - len(s)]))
                        self._buf = s
                        break
                    self._fresh_block = False
                    if s.startswith(t.open):
                        reasoning.append(self._reason(b[:len(b) - len(s)]))
                        self._buf = s[len(t.open):]
                        continue
                i = b.find(t.close)
                if i >= 0:
                    reasoning.append(self._reason(b[:i]))
                    self._buf = b[i + len(t.close):]
                    self.inside, self._block, self._at_boundary = False, None, not self._content_started
                    continue
                keep = 0 if final else partial_suffix(b, (t.close,))
                reasoning.append(self._reason(b[:len(b) - keep]))
                self._buf = b[len(b) - keep:]
                break
            if self._at_boundary:
                s = b.lstrip()
                if not s:
                    self._buf = ""
                    break
                if s.startswith(t.close):
                    self._buf = s[len(t.close):]
                    continue
                if not s.startswith(t.open):
                    if not final and (t.close.startswith(s) or t.open.startswith(s)):
                        self._buf = s
                        break
                    self._at_boundary, self._content_started = False, True
                b = self._buf = s
            i = b.find(t.open)
            if i >= 0:
                content.append(b[:i])
                self._buf = b[i + len(t.open):]
                self.inside, self._fresh_block, self._block = True, False, _Trimmed()
                continue
            keep = 0 if final else partial_suffix(b, (t.open,))
            content.append(b[:len(b) - keep])
            self._buf = b[len(b) - keep:]
            break
        return "".join(reasoning), "".join(content)


def split_reasoning(text: str, tags: ThinkTags, starts_inside: bool = False) -> tuple[str | None, str]:
    """Non-streaming split: (reasoning or None when the answer has no block, content)."""
    sp = ReasoningSplitter(tags, starts_inside)
    r1, c1 = sp.feed(text)
    r2, c2 = sp.finish()
    return (r1 + r2) or None, c1 + c2
