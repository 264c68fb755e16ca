"""Checks on a parsed request body that the pydantic field types cannot express.

* Nesting depth: at most `MAX_JSON_DEPTH` levels of arrays/objects. Deeper values (a tool's
  `parameters` nested ~950 deep) would hit Python's recursion limit later, in `json.dumps` or
  the chat template, and come back as a 500.
* Lone UTF-16 surrogates (`"\\ud800"` is valid JSON but not valid Unicode text): the tokenizer
  and the UTF-8 response encoder cannot take them. `json.loads` already joins proper pairs into
  one character, so any surrogate left is lone.

The walk is iterative (a recursive one would fail on the very input it guards against).
"""
from __future__ import annotations

import re
from typing import Any

MAX_JSON_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


class RequestError(ValueError):
    """A request-level problem found during validation; `param` names the top-level field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _where(path: tuple) -> str:
    where = ".".join(str(p) for p in path) or "body"
    return where if len(where) <= 120 else where[:117] + "..."


def check_json(body: Any) -> None:
    """Raise `RequestError` for nesting deeper than `MAX_JSON_DEPTH` or a lone surrogate anywhere in `body`."""
    stack: list[tuple[Any, tuple]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            m = _SURROGATE.search(value)
            if m:
                raise RequestError(f"{_where(path)} contains a lone UTF-16 surrogate (\\u{ord(m.group()):04x}), "
                                   "which is not valid Unicode text; send valid UTF-8 text (pair the surrogate or "
                                   "drop it)",
                                   param=str(path[0]) if path else None)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if len(path) >= MAX_JSON_DEPTH:
            raise RequestError(f"{_where(path[:3])}... is nested more than {MAX_JSON_DEPTH} levels deep; "
                               f"flatten it (at most {MAX_JSON_DEPTH} levels of arrays and objects are accepted)",
                               param=str(path[0]))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise RequestError(f"a key in {_where(path)} contains a lone UTF-16 surrogate, which is not valid "
                                   f"Unicode text; send valid UTF-8 text", param=str(path[0]) if path else None)
            if isinstance(item, (str, dict, list)):  # numbers, booleans and null hold nothing to check
                stack.append((item, path + (key,)))
