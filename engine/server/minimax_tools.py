"""MiniMax's tool-call markup -> (name, arguments) pairs, argument values typed from the tool's JSON schema.

The form (MiniMax-M2's; several <invoke> per block, several blocks per answer, whitespace between tags
free, the name attribute double-, single- or un-quoted):
    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>
A value is the text between its tags; one newline right after the opening tag and one right before the
closing tag are layout and dropped. Typing by the parameter's schema (`type`, a list of types, or the
types of `anyOf` / `oneOf` branches, in order; the first that accepts the text wins): string -> the text
as it is; integer / number / boolean / null -> that JSON value (`True`, `None` accepted); object / array
-> `json.loads` when it gives one. A parameter the schema does not list, or a value no listed type
accepts: `json.loads` when the text is JSON, else the text.

MiniMax-M3 writes the same structure with a namespace marker before every tag and each parameter as
an element named after it, nested for objects and arrays (`parse_m3_block`):
    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="get_weather">
    ]<]minimax[>[<city>Paris]<]minimax[>[</city>
    ]<]minimax[>[<opts>]<]minimax[>[<unit>C]<]minimax[>[</unit>]<]minimax[>[</opts>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>
Leaves are typed as above by the schema node they sit under (array `items`, object `properties`) after
XML entities are decoded; an element whose schema is an array takes its children's values in order; a
repeated element name collects its values in a list; an empty leaf of an array / object schema is
[] / {}. Text beside child elements is malformed.

`parse_block` returns None for anything malformed (text that is neither an invoke nor whitespace, an
unclosed parameter, a repeated parameter, a tool that was not offered, an empty block): the caller
then keeps the whole answer as text, as for a malformed Hermes call (`engine.server.toolcalls`). An
invoke left unclosed at the end of its block (the model stopped there) is accepted when its
parameters are complete.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

BLOCK_OPEN, BLOCK_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
_NAME = r"""\s+name\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>"']+))\s*>"""
_INVOKE = re.compile(r"\s*<invoke" + _NAME + r"(.*?)(?:</invoke>|\Z)", re.DOTALL)
_PARAM = re.compile(r"\s*<parameter" + _NAME + r"(.*?)</parameter>", re.DOTALL)
_INTEGER = re.compile(r"-?\d+")
_MISSING = object()


def _name(m: re.Match) -> str:
    return next(g for g in m.groups()[:3] if g is not None).strip()


def schema_types(schema: Any) -> list[str]:
    """The JSON types a schema allows, in order (`type` string or list, else its anyOf/oneOf branches)."""
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        for branch in branches if isinstance(branches, list) else []:
            out += [x for x in schema_types(branch) if x not in out]
    return out


def _json(text: str) -> Any:
    try:
        v = json.loads(text)
    except ValueError:
        return _MISSING
    if isinstance(v, float) and not math.isfinite(v):  # NaN / Infinity: not JSON for the client
        return _MISSING
    return v


def _as_type(raw: str, t: str) -> Any:
    s = raw.strip()
    if t == "string":
        return raw
    if t == "integer":
        return int(s) if _INTEGER.fullmatch(s) else _MISSING
    if t == "number":
        v = _json(s)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else _MISSING
    if t == "boolean":
        return {"true": True, "false": False}.get(s.lower(), _MISSING)
    if t == "null":
        return None if s.lower() in ("null", "none") else _MISSING
    if t in ("object", "array"):
        v = _json(s)
        return v if isinstance(v, dict if t == "object" else list) else _MISSING
    return _MISSING


def typed_value(raw: str, schema: Any) -> Any:
    """One parameter's text -> its JSON value (see the module rules)."""
    raw = raw.removeprefix("\n").removesuffix("\n")
    for t in schema_types(schema):
        v = _as_type(raw, t)
        if v is not _MISSING:
            return v
    v = _json(raw.strip())
    return raw if v is _MISSING else v


def _properties(parameters: Any) -> dict[str, Any]:
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    return props if isinstance(props, dict) else {}


def _arguments(body: str, parameters: Any) -> dict[str, Any] | None:
    props, args, pos = _properties(parameters), {}, 0
    while body[pos:].strip():
        m = _PARAM.match(body, pos)
        if m is None:
            return None
        key = _name(m)
        if key in args:
            return None
        args[key] = typed_value(m.group(4), props.get(key))
        pos = m.end()
    return args


def parse_block(body: str, tools: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls of one block's inner text, or None when it is malformed. `tools`: offered name -> its
    `parameters` schema (None when it has none)."""
    calls, pos = [], 0
    while body[pos:].strip():
        m = _INVOKE.match(body, pos)
        if m is None:
            return None
        name = _name(m)
        if name not in tools:
            return None
        args = _arguments(m.group(4), tools[name])
        if args is None:
            return None
        calls.append((name, args))
        pos = m.end()
    return calls or None


# ---------------------------------------------------------------- MiniMax-M3's namespaced form
NS = "]<]minimax[>["
M3_BLOCK_OPEN, M3_BLOCK_CLOSE = NS + "<tool_call>", NS + "</tool_call>"
_M3_INVOKE = re.compile(r"\s*" + re.escape(NS) + r"<invoke" + _NAME)
_M3_INVOKE_CLOSE = NS + "</invoke>"
_M3_ELEMENT = re.compile(r"\s*" + re.escape(NS) + r"<([^/<>\s][^<>]*?)\s*>")
_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'"), ("&amp;", "&"))
Node = str | list  # a leaf's text, or the (name, node) children of an element


def _m3_content(s: str, pos: int, name: str) -> tuple[Node, int] | None:
    """The content of element `name` opened before `pos`, up to its closing tag: (node, end) or None."""
    close, text, children = f"{NS}</{name}>", [], []
    while True:
        j = s.find(NS, pos)
        if j < 0:
            return None
        text.append(s[pos:j])
        if s.startswith(close, j):
            pos = j + len(close)
            break
        m = _M3_ELEMENT.match(s, j)
        if m is None:
            return None
        child = _m3_content(s, m.end(), m.group(1).strip())
        if child is None:
            return None
        children.append((m.group(1).strip(), child[0]))
        pos = child[1]
    if not children:
        return "".join(text), pos
    if "".join(text).strip():  # text beside elements
        return None
    return children, pos


def _m3_value(node: Node, schema: Any) -> Any:
    types = schema_types(schema)
    if isinstance(node, str):
        for a, b in _ENTITIES:
            node = node.replace(a, b)
        if not node.strip() and types[:1] in (["array"], ["object"]):
            return [] if types[0] == "array" else {}
        return typed_value(node, schema)
    if "array" in types and "object" not in types[:types.index("array")]:
        items = schema.get("items") if isinstance(schema, dict) else None
        return [_m3_value(child, items) for _, child in node]
    return _m3_object(node, _properties(schema))


def _m3_object(children: list, props: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    repeated: set[str] = set()
    for key, child in children:
        value = _m3_value(child, props.get(key))
        if key not in out:
            out[key] = value
        elif key in repeated:
            out[key].append(value)
        else:
            out[key] = [out[key], value]
            repeated.add(key)
    return out


def parse_m3_block(body: str, tools: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]] | None:
    """`parse_block` for the namespaced form (the text between its block tags)."""
    calls, pos = [], 0
    while body[pos:].strip():
        m = _M3_INVOKE.match(body, pos)
        if m is None:
            return None
        name = _name(m)
        if name not in tools:
            return None
        children, pos = [], m.end()
        while True:
            p = len(body) - len(body[pos:].lstrip())
            if p == len(body):  # unclosed at the end of its block
                pos = p
                break
            if body.startswith(_M3_INVOKE_CLOSE, p):
                pos = p + len(_M3_INVOKE_CLOSE)
                break
            e = _M3_ELEMENT.match(body, p)
            got = _m3_content(body, e.end(), e.group(1).strip()) if e is not None else None
            if got is None:
                return None
            children.append((e.group(1).strip(), got[0]))  # type: ignore[union-attr]
            pos = got[1]
        calls.append((name, _m3_object(children, _properties(tools[name]))))
    return calls or None
