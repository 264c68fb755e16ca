"""Text tool-call protocol, for models or servers without native function calling.

The model writes one or more blocks

    <tool_call>
    {"name": "read_file", "arguments": {"path": "a.py"}}
    </tool_call>

and receives each result as a user message `<tool_result name="...">...</tool_result>`.
The same parser rescues native-mode replies that put such a block in plain content.
"""
from __future__ import annotations

import json
import re
from typing import Any

from agents.protocol import ToolCall

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


def protocol_prompt(tools: list[dict[str, Any]]) -> str:
    lines = ["You can call these tools (JSON schemas):"]
    for t in tools:
        f = t["function"]
        lines.append(json.dumps({"name": f["name"], "description": f["description"],
                                 "parameters": f["parameters"]["properties"]}))
    lines += ["", "To call a tool, reply with exactly this format (one call per block):",
              "<tool_call>", '{"name": "TOOL_NAME", "arguments": {"ARG": "VALUE"}}', "</tool_call>",
              "Tool results come back in <tool_result> blocks. Call submit when you are done."]
    return "\n".join(lines)


def parse_text_calls(text: str | None, step: int) -> tuple[list[ToolCall], str | None]:
    """(calls, error). Calls keep the raw JSON arguments text; error names what is wrong."""
    if not text:
        return [], None
    bodies = _BLOCK.findall(text)
    if not bodies:
        bodies = [b for b in _FENCE.findall(text) if '"name"' in b]
    calls: list[ToolCall] = []
    for i, body in enumerate(bodies):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            return calls, f"tool call {i + 1} is not valid JSON ({e.msg} at char {e.pos})"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return calls, f'tool call {i + 1} must be an object {{"name": ..., "arguments": {{...}}}}'
        args = obj.get("arguments", {})
        calls.append(ToolCall(id=f"call_{step}_{i}", name=obj["name"],
                              arguments=args if isinstance(args, str) else json.dumps(args)))
    return calls, None


def render_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def result_message(name: str, output: str) -> dict[str, Any]:
    return {"role": "user", "content": f'<tool_result name="{name}">\n{output}\n</tool_result>'}
