"""The oracle policy: the ONLY scripted model in msa-eval.

It replays a task's gold actions (`task.gold`, computed by the family's generator from ground
truth) one per model call, through the real loop, tools, trajectory and verifier. It proves
each generated task is solvable end to end, and gives the reference tool-call count and
context size of every task. It implements `agents.protocol.ChatModel`.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

from agents.context import SUMMARY_REQUEST
from agents.protocol import BackendError, ChatResponse, ToolCall
from agents.textproto import render_call
from agents.tokens import MessageCounter, TokenFn, approx_tokens


class OraclePolicy:
    name = "oracle"

    def __init__(self, gold: list[dict[str, Any]], count_tokens: TokenFn | None = None, task_id: str = ""):
        self.gold = gold
        self.i = 0
        self._count = count_tokens
        self._messages_tokens = MessageCounter(count_tokens or approx_tokens)
        self.task_id = task_id

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "oracle (scripted gold replay)", "task": self.task_id,
                "gold_actions": len(self.gold)}

    def count_tokens(self, text: str) -> int | None:
        return self._count(text) if self._count else None

    def on_resume(self, steps: list[dict[str, Any]]) -> None:
        """Continue after the gold actions already taken in a resumed trajectory."""
        self.i = sum(len(s["response"]["tool_calls"]) for s in steps)

    def generate(self, requests: Sequence[object]) -> NoReturn:
        raise BackendError("the oracle policy only drives agent tasks (chat with tools)")

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             max_tokens: int = 512, temperature: float = 0.0, seed: int | None = None) -> ChatResponse:
        prompt = self._messages_tokens(messages)
        last = str(messages[-1].get("content") or "") if messages else ""
        if last.startswith(SUMMARY_REQUEST):
            text = f"(oracle summary) {self.i} of {len(self.gold)} gold actions done; continue with the plan."
            return ChatResponse(text, [], "stop", prompt, approx_tokens(text), 0.0, 0.0)
        if self.i >= len(self.gold):
            text = "(oracle) gold actions exhausted"
            return ChatResponse(text, [], "stop", prompt, approx_tokens(text), 0.0, 0.0)
        act = self.gold[self.i]
        self.i += 1
        # arguments may be raw JSON text, replayed verbatim (recorded or deliberately malformed calls)
        raw = isinstance(act["arguments"], str)
        args = act["arguments"] if raw else json.dumps(act["arguments"])
        if tools is None:  # text protocol
            head = json.dumps({"name": act["name"]})[:-1]
            text = (f'<tool_call>\n{head}, "arguments": {args}}}\n</tool_call>' if raw
                    else render_call(act["name"], act["arguments"]))
            return ChatResponse(text, [], "stop", prompt, approx_tokens(text), 0.0, 0.0)
        call = ToolCall(id=f"oracle_{self.i}", name=act["name"], arguments=args)
        return ChatResponse(None, [call], "tool_calls", prompt, approx_tokens(args), 0.0, 0.0)
