"""Seeded single-site bug injection by AST (family `regression`), SWE-smith procedural style.

Each operator finds a node with exact source positions and rewrites only the operator or
constant text on one line, so the mutated file differs from the original in a few characters
and the gold patch is the exact reverse.
Operators: comparison flip, arithmetic swap, boolean and/or swap, integer off-by-one,
dropped `not`.
"""
from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

_CMP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
        ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
        ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
_BIN = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "+"), ast.Div: ("/", "*"), ast.FloorDiv: ("//", "*"),
        ast.Mod: ("%", "//")}
_BOOL = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclass
class Mutation:
    op: str
    line: int  # 1-based
    function: str
    before: str  # the whole original line
    after: str  # the whole mutated line


def _between(lines: list[str], a: ast.expr, b: ast.expr) -> tuple[int, int, int] | None:
    """(line index, start col, end col) of the text between two nodes on one line."""
    if a.end_lineno != b.lineno or a.end_col_offset is None:  # parsed nodes always have an end
        return None
    return b.lineno - 1, a.end_col_offset, b.col_offset


def _sub_op(lines, span, old: str, new: str) -> str | None:
    """Replace the one occurrence of operator `old` in the span, or None if not exactly one."""
    li, c0, c1 = span
    seg = lines[li][c0:c1]
    if old[0].isalpha():
        pat = r"\b" + re.escape(old) + r"\b"
    else:
        pat = r"(?<![=<>!/*%+\-])" + re.escape(old) + r"(?![=<>/*%])"
    if "#" in seg or len(re.findall(pat, seg)) != 1:
        return None
    return lines[li][:c0] + re.sub(pat, new, seg, count=1) + lines[li][c1:]


def candidates(source: str) -> list[Mutation]:
    """Every single-line mutation site inside a function body, in source order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out: list[Mutation] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            for op, li, new in _node_mutations(node, lines):
                out.append(Mutation(op, li + 1, fn.name, lines[li], new))
    uniq = {(m.line, m.after): m for m in out}
    return sorted(uniq.values(), key=lambda m: (m.line, m.after))


def _node_mutations(node, lines):
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        span = _between(lines, node.left, node.comparators[0])
        old, new = _CMP[type(node.ops[0])]
        if span and (line := _sub_op(lines, span, old, new)):
            yield "flip-comparison", span[0], line
    elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        span = _between(lines, node.left, node.right)
        old, new = _BIN[type(node.op)]
        if span and (line := _sub_op(lines, span, old, new)):
            yield "swap-arithmetic", span[0], line
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        span = _between(lines, node.values[0], node.values[1])
        old, new = _BOOL[type(node.op)]
        if span and (line := _sub_op(lines, span, old, new)):
            yield "swap-boolean", span[0], line
    elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 64 \
            and node.lineno == node.end_lineno:
        li = node.lineno - 1
        text = lines[li][node.col_offset:node.end_col_offset]
        if text.isdigit():
            yield "off-by-one", li, lines[li][:node.col_offset] + str(node.value + 1) + lines[li][node.end_col_offset:]
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and node.lineno == node.operand.lineno:
        li = node.lineno - 1
        seg = lines[li][node.col_offset:node.operand.col_offset]
        if seg.strip() == "not" and lines[li][node.operand.col_offset - 1:node.operand.col_offset] in (" ", "("):
            yield "drop-not", li, lines[li][:node.col_offset] + lines[li][node.operand.col_offset:]


def seeded_order(muts: list[Mutation], seed: int) -> list[Mutation]:
    rng = random.Random(seed)
    order = list(muts)
    rng.shuffle(order)
    return order
