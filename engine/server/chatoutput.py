"""A chat answer -> (reasoning_content, content, tool_calls), whole or incrementally for streaming.

`ChatOutputParser.feed` takes the answer's text deltas and returns the (field, text) deltas that
are safe to send now; `finish` returns the rest and the whole result, which is exactly
`parse_chat_output` of the concatenated text: the streamed deltas of each field concatenate to
its non-streamed value, wherever the text was cut.

  * Reasoning (`engine.server.reasoning`, when the server parses it) streams as it comes.
  * Content without tools offered streams as it comes.
  * Content with tools offered streams up to where a call block may begin (`<tool_call>`,
    `<minimax:tool_call>`); from there it is held to the end, when the answer is parsed
    (`engine.server.toolcalls.parse_tool_calls`): a well-formed call never shows its markup in
    content, a malformed one leaves the whole answer as content, as without streaming. Because
    parsed content is stripped and a malformed answer is not, trailing whitespace is held until
    more text follows, and an answer that starts with whitespace, `{`, `[` or a code fence (a
    possible whole-answer JSON call) is held entirely.
Tool calls are only looked for outside reasoning blocks.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.server.reasoning import ReasoningSplitter, ThinkTags, partial_suffix
from engine.server.toolcalls import BLOCK_OPEN_TAGS, ParsedToolCall, parse_tool_calls

Delta = tuple[str, str]  # ("content" | "reasoning_content", text)
_LONGEST_TAG = max(len(t) for t in BLOCK_OPEN_TAGS)


@dataclass(frozen=True)
class ChatOutput:
    content: str | None
    reasoning_content: str | None
    tool_calls: list[ParsedToolCall]


class ChatOutputParser:
    """Incremental parser of one answer. `tools`: offered name -> parameters schema (empty: no parsing);
    `tags`: the reasoning tag pair, None when reasoning is not parsed; `starts_inside`: the prompt
    opened a reasoning block."""

    def __init__(self, tools: Mapping[str, Any], tags: ThinkTags | None = None, starts_inside: bool = False) -> None:
        self.tools = tools
        self._split = ReasoningSplitter(tags, starts_inside) if tags is not None else None
        self._reasoning: list[str] = []
        self._content = ""
        self._sent = 0  # characters of content already sent
        self._hold_all: bool | None = None  # decided by the content's first character
        self._block_at: int | None = None  # where the first call block opens
        self._scanned = 0  # content searched for block openings up to here

    def _deltas(self, reasoning: str, content: str, final: bool) -> list[Delta]:
        out: list[Delta] = []
        if reasoning:
            self._reasoning.append(reasoning)
            out.append(("reasoning_content", reasoning))
        self._content += content
        if not self.tools:
            if content:
                out.append(("content", content))
            self._sent = len(self._content)
        elif not final:
            safe = self._safe_end()
            if safe > self._sent:
                out.append(("content", self._content[self._sent:safe]))
                self._sent = safe
        return out

    def _safe_end(self) -> int:
        c = self._content
        if not c:
            return 0
        if self._hold_all is None:
            self._hold_all = c[0].isspace() or c[0] in "{[`"
        if self._hold_all:
            return 0
        if self._block_at is None:
            start = max(0, self._scanned - _LONGEST_TAG)
            hits = [i for i in (c.find(t, start) for t in BLOCK_OPEN_TAGS) if i >= 0]
            self._scanned = len(c)
            if hits:
                self._block_at = min(hits)
        end = self._block_at if self._block_at is not None else len(c) - partial_suffix(c, BLOCK_OPEN_TAGS)
        while end > self._sent and c[end - 1].isspace():
            end -= 1
        return end

    def feed(self, piece: str) -> list[Delta]:
        """One text delta of the answer -> the deltas safe to send now."""
        if self._split is None:
            return self._deltas("", piece, final=False)
        return self._deltas(*self._split.feed(piece), final=False)

    def finish(self) -> tuple[list[Delta], ChatOutput]:
        """The answer has ended: the remaining deltas and the whole result."""
        out = self._deltas(*self._split.finish(), final=True) if self._split is not None else []
        reasoning = "".join(self._reasoning) or None
        if self.tools:
            parsed = parse_tool_calls(self._content, self.tools)
            content, calls = parsed.content, parsed.tool_calls
        else:
            content, calls = self._content, []
        if content == "" and reasoning is not None:
            content = None
        rest = (content or "")[self._sent:]  # what was sent is a prefix of it (see the module rules)
        if rest:
            out.append(("content", rest))
        return out, ChatOutput(content, reasoning, calls)


def parse_chat_output(text: str, tools: Mapping[str, Any], tags: ThinkTags | None = None,
                      starts_inside: bool = False) -> ChatOutput:
    """The whole answer at once (the same result as streaming it through `ChatOutputParser`)."""
    p = ChatOutputParser(tools, tags, starts_inside)
    p.feed(text)
    return p.finish()[1]
