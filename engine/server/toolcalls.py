"""Tool calling for chat models: render OpenAI-style tools into the prompt, parse calls back out.

Rendering. A chat template that knows about tools (its source mentions `tools`, as Qwen's
and Hermes' templates do) gets the tool specs and the assistant `tool_calls` natively. A
template without a tools section (SmolLM2's is plain ChatML) gets the Hermes convention
written into the messages instead:
  * the tool specs, one JSON object per line inside <tools></tools>, and the instruction to
    answer with <tool_call>{"name": ..., "arguments": {...}}</tool_call>, appended to the
    system message (a system message is created when there is none);
  * an assistant turn with tool calls becomes text with one <tool_call> block per call;
  * `tool` messages become a `user` turn of <tool_response> blocks (consecutive ones merged).
This is a prompt convention, not constrained decoding: a model is free to ignore it, and
`tool_choice` "required" or a named function is only an instruction in the prompt.

Parsing. `parse_tool_calls` accepts the <tool_call> JSON form, MiniMax's <minimax:tool_call>
form and MiniMax-M3's namespaced one (`engine.server.minimax_tools`, values typed from the
tool's schema) and, as a fallback, a
whole answer that is one JSON object (or a list of them) naming an offered tool. Anything
malformed (bad JSON or markup, unknown tool, arguments that are not an object) leaves the output
as plain text: a malformed call is data for the caller, never an exception.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from engine.server import minimax_tools

# a MiniMax-M3 block (group 1), a MiniMax block (2) or a Hermes block (3); an unclosed one runs to the end
# of the text (M3's marker ends in `<tool_call>`: the Hermes alternative never matches inside it, the M3
# match starts earlier)
_CALL_BLOCK = re.compile(
    "|".join(f"{re.escape(a)}(.*?)(?:{re.escape(b)}|\\Z)" for a, b in (
        (minimax_tools.M3_BLOCK_OPEN, minimax_tools.M3_BLOCK_CLOSE),
        (minimax_tools.BLOCK_OPEN, minimax_tools.BLOCK_CLOSE), ("<tool_call>", "</tool_call>"))),
    re.DOTALL)
BLOCK_OPEN_TAGS = (minimax_tools.M3_BLOCK_OPEN, minimax_tools.BLOCK_OPEN, "<tool_call>")  # where a call may start
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass(frozen=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON object text


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ParsedToolCall]


def template_supports_tools(template_source: str | None) -> bool:
    """True when a chat template's Jinja source renders a `tools` variable."""
    return bool(template_source) and re.search(r"\btools\b", template_source) is not None


def tools_system_text(tools: list[dict[str, Any]], tool_choice: Any = "auto") -> str:
    """The Hermes-style tool instructions that go into the system message."""
    lines = [
        "# Tools",
        "",
        "You can call functions to help answer the user. Their signatures, one JSON object per line:",
        "<tools>",
        *(json.dumps(t, ensure_ascii=False) for t in tools),
        "</tools>",
        "",
        "To call a function, answer with one block per call, each holding a JSON object with the",
        "function name and its arguments:",
        "<tool_call>",
        '{"name": "<function name>", "arguments": {<arguments as a JSON object>}}',
        "</tool_call>",
    ]
    if tool_choice == "required":
        lines.append("You must call at least one function.")
    elif isinstance(tool_choice, dict):
        lines.append(f"You must call the function {tool_choice['function']['name']}.")
    return "\n".join(lines)


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def _call_block(call: dict[str, Any]) -> str:
    fn = call["function"]
    body = {"name": fn["name"], "arguments": _arguments_object(fn["arguments"])}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def messages_for_template(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    native_tools: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Return (messages, tools) ready for `tokenizer.apply_chat_template`.

    `messages` are OpenAI-shaped dicts (content already flattened to a string). With
    `native_tools` the template receives the tools and arguments as objects; otherwise the
    Hermes convention is written into plain role/content messages and tools is None.
    `tool_choice == "none"` hides the tools from the model.
    """
    offered = tools if tools and tool_choice != "none" else None
    if native_tools:
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": _arguments_object(c["function"]["arguments"])}}
                    for c in m["tool_calls"]
                ]
            out.append(m)
        return out, offered
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            blocks = [_call_block(c) for c in m["tool_calls"]]
            content = "\n".join(([content] if content else []) + blocks)
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_responses"):
                out[-1]["content"] += "\n" + block
                continue
            out.append({"role": "user", "content": block, "_tool_responses": True})
            continue
        out.append({"role": role, "content": content})
        if m.get("reasoning_content") is not None:  # for templates that show an assistant turn's reasoning
            out[-1]["reasoning_content"] = m["reasoning_content"]
    for m in out:
        m.pop("_tool_responses", None)
    if offered:
        spec = tools_system_text(offered, tool_choice)
        if out and out[0]["role"] == "system":
            out[0]["content"] = (out[0]["content"] + "\n\n" + spec).lstrip()
        else:
            out.insert(0, {"role": "system", "content": spec})
    return out, None


def _strip_fence(text: str) -> str:
    m = _FENCE.match(text.strip())
    return m.group(1) if m else text.strip()


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _as_call(obj: Any, tool_names: Collection[str]) -> ParsedToolCall | None:
    """A parsed JSON value -> a call, or None when it is not a well-formed call of an offered tool."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(name, str) or name not in tool_names:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(_call_id(), name, json.dumps(args, ensure_ascii=False))


def _parse_json(text: str) -> Any:
    try:
        return json.loads(_strip_fence(text))
    except ValueError:
        return None


def _block_calls(m: re.Match, tools: Mapping[str, Any]) -> list[ParsedToolCall] | None:
    m3, minimax, hermes = m.groups()
    if hermes is not None:
        call = _as_call(_parse_json(hermes), tools)
        return None if call is None else [call]
    pairs = minimax_tools.parse_block(minimax, tools) if m3 is None else minimax_tools.parse_m3_block(m3, tools)
    if pairs is None:
        return None
    return [ParsedToolCall(_call_id(), name, json.dumps(args, ensure_ascii=False)) for name, args in pairs]


def offered_tools(tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """OpenAI `tools` (dicts) -> {name: parameters schema or None}, the form `parse_tool_calls` takes."""
    return {t["function"]["name"]: t["function"].get("parameters") for t in tools or []}


def parse_tool_calls(text: str, tool_names: Collection[str] | Mapping[str, Any]) -> ParsedOutput:
    """Split model output into (content, tool calls). Malformed calls -> all text, no calls.

    `tool_names`: the offered tools, a set of names or {name: parameters schema} (the schema types
    MiniMax-form argument values; with names only they are typed as JSON-or-text)."""
    as_text = ParsedOutput(content=text, tool_calls=[])
    if not tool_names:
        return as_text
    tools = tool_names if isinstance(tool_names, Mapping) else dict.fromkeys(tool_names)
    blocks = list(_CALL_BLOCK.finditer(text))
    if blocks:
        calls: list[ParsedToolCall] = []
        for m in blocks:
            got = _block_calls(m, tools)
            if got is None:
                return as_text
            calls += got
        rest = _CALL_BLOCK.sub("", text).strip()
        return ParsedOutput(content=rest or None, tool_calls=calls)
    obj = _parse_json(text)
    items = obj if isinstance(obj, list) and obj else [obj]
    parsed = [_as_call(o, tools) for o in items]
    if obj is None or any(c is None for c in parsed):
        return as_text
    return ParsedOutput(content=None, tool_calls=parsed)  # type: ignore[arg-type]
