"""GraphWalks-style graph traversal (offline analogue, generated here).

A random directed graph on 8-character hex node names, given as an edge list ("a -> b", one per line)
in GraphWalks' prompt form; the operation is either "Perform a BFS from node X with depth d." (the
nodes at exactly depth d, d in 1..3) or "Find the parents of node X." (the nodes with an edge to X).
Answer format: a last line `Final Answer: [n1, n2, ...]`; graded by the F1 of that set against the
gold set (`tasks.metrics.set_f1`; no such line scores 0).

Construction: the question's structure is planted (BFS: X -> layers of 1-3 nodes -> a last layer of
2-6 nodes, plus edges back into earlier layers; parents: 2-6 parents, and 1-3 children of X as
decoys) and its edges are scattered at seeded positions through a prefix-stable stream of filler
edges that grows the graph (every other edge brings a new node) and never changes the answer:
filler edges never leave a node at depth < d of the BFS (so every other node is deeper than d) and
never enter X for a parents question. The gold set is then computed from the finished edge list.
`metadata["depth"]` is the position (0..1) of the first edge the answer depends on (edges out of the
nodes at depth < d, or into X); `edge_depths` lists them all. The prompt is fitted by `fit_pieces`
(one piece per edge line); the generation budget is the gold line's length + 24 tokens and takes up
to 32 more that the last whole edge could not fill.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import finish, rng_for
from tasks.fitting import fit_pieces
from tasks.metrics import parse_final_answer, set_f1

VERSION = "graphwalks-1"  # bump when the generated prompts or the grading change
FINAL = "Final Answer:"

PREAMBLE = (
    "You will be given a graph as a list of directed edges. All nodes are at least degree 1. You will also get "
    "a description of an operation to perform on the graph.\n"
    "Your job is to execute the operation on the graph and return the set of nodes that the operation results "
    "in. If asked for a breadth-first search (BFS), only return the nodes that are reachable at that depth, do "
    "not return the starting node.\n"
    "If asked for the parents of a node, only return the nodes that have an edge leading to the given node, do "
    "not return the given node itself.\n\n"
    "Here is an example:\n<begin example>\nThe graph has the following edges:\n"
    "uvwx -> alke\nabcd -> uvwx\nabcd -> efgh\nefgh -> uvwx\n\n"
    "Example 1:\nOperation:\nPerform a BFS from node abcd with depth 1.\nFinal Answer: [uvwx, efgh]\n\n"
    "Example 2:\nOperation:\nPerform a BFS from node alke with depth 1.\nFinal Answer: []\n\n"
    "Example 3:\nOperation:\nFind the parents of node uvwx.\nFinal Answer: [abcd, efgh]\n\n"
    "Example 4:\nOperation:\nFind the parents of node abcd.\nFinal Answer: []\n<end example>\n\n"
    "Here is the graph to operate on:\nThe graph has the following edges:\n"
)
INSTRUCTION = (
    "You should immediately return the set of nodes that the operation results in, with no additional text. "
    "Return your final answer as a list of nodes in the very last line of your response. For example, if the "
    "operation returns the set of nodes [node1, node2, ..., nodeN], the response should be:\n"
    "Final Answer: [node1, node2, ..., nodeN]"
)

Edge = tuple[str, str]


def _node(rng: random.Random) -> str:
    return f"{rng.getrandbits(32):08x}"


def bfs_at_depth(edges: Sequence[Edge], start: str, depth: int) -> set[str]:
    """The nodes whose shortest distance from `start` is exactly `depth`."""
    out: dict[str, list[str]] = {}
    for u, v in edges:
        out.setdefault(u, []).append(v)
    seen, frontier = {start}, {start}
    for _ in range(depth):
        frontier = {v for u in frontier for v in out.get(u, ()) if v not in seen}
        seen |= frontier
    return frontier


def parents_of(edges: Sequence[Edge], node: str) -> set[str]:
    return {u for u, v in edges if v == node}


class GraphWalks(Task):
    name = "graphwalks"
    category = "graph"
    metric = "set_f1"
    max_tokens = 96  # nominal; each sample's budget is its gold line's length + margin
    description = ("GraphWalks-style traversal: BFS at depth 1-3 or parents of a node in a random directed "
                   "graph of 8-hex-char nodes given as an edge list; F1 over the node set")

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        kind = "parents" if index % 2 == 0 else "bfs"  # alternate, and cycle the BFS depth 1, 2, 3
        d = 1 + (index // 2) % 3 if kind == "bfs" else 1
        names: set[str] = set()

        def fresh() -> str:
            while (x := _node(rng)) in names:
                pass
            names.add(x)
            return x

        start = fresh()
        core: list[Edge] = []
        if kind == "bfs":
            layers = [[start]] + [[fresh() for _ in range(rng.randint(2, 6) if j == d else rng.randint(1, 3))]
                                  for j in range(1, d + 1)]
            for j in range(1, d + 1):
                for v in layers[j]:  # one parent in the layer above, sometimes two
                    for u in rng.sample(layers[j - 1], min(len(layers[j - 1]), 1 + (rng.random() < 0.3))):
                        core.append((u, v))
            for _ in range(rng.randint(0, 2)):  # edges back into the same or an earlier layer
                j = rng.randint(1, d)
                u, v = rng.choice(layers[j]), rng.choice([x for layer in layers[:j + 1] for x in layer])
                if u != v and (u, v) not in core:
                    core.append((u, v))
            closed = {x for layer in layers[:d] for x in layer}  # no filler edge leaves these
            banned_target: set[str] = set()
            operation = f"Perform a BFS from node {start} with depth {d}."
            relevant = [e for e in core if e[0] in closed]
        else:
            parents, children = [fresh() for _ in range(rng.randint(2, 6))], [fresh() for _ in range(rng.randint(1, 3))]
            core = [(p, start) for p in parents] + [(start, c) for c in children]
            closed, banned_target = set(), {start}
            operation = f"Find the parents of node {start}."
            relevant = [e for e in core if e[1] == start]
        rng.shuffle(core)
        fracs = [rng.random() for _ in core]

        r = random.Random(seed ^ 0x6A7)
        pool = sorted(names)  # the nodes filler edges may use (core nodes included), grown by fresh_filler
        taken = set(core)
        filler: list[Edge] = []

        def filler_edges(n: int) -> list[Edge]:  # a prefix-stable stream; every other edge adds a node
            while len(filler) < n:
                new = None
                if len(filler) % 2 == 0:
                    new = fresh_filler()
                while True:
                    u, v = r.choice(pool), r.choice(pool)
                    if new is not None:
                        u, v = (new, v) if r.random() < 0.5 else (u, new)
                    if u != v and u not in closed and v not in banned_target and (u, v) not in taken:
                        break
                taken.add((u, v))
                filler.append((u, v))
            return filler[:n]

        def fresh_filler() -> str:
            while (x := _node(r)) in names:
                pass
            names.add(x)
            pool.append(x)
            return x

        def edges_for(n: int) -> list[Edge]:
            edges = list(filler_edges(n))
            for f, e in sorted(zip(fracs, core, strict=True), reverse=True):
                edges.insert(round(f * n), e)
            return edges

        before, after = PREAMBLE, f"\n\nOperation:\n{operation}\n\n{INSTRUCTION}"
        planted = sorted(bfs_at_depth(core, start, d) if kind == "bfs" else parents_of(core, start))
        gold_line = f"{FINAL} [{', '.join(planted)}]"
        budget = spec.max_tokens or len(spec.tokenizer.encode(gold_line)) + 24

        def make(n: int, tail: int) -> tuple[PromptParts, list[str]]:
            edges = edges_for(n)
            pieces = [("\n" if i else "") + f"{u} -> {v}" for i, (u, v) in enumerate(edges)]
            return PromptParts(before, "", after, FINAL), pieces

        fit = fit_pieces(make, spec, budget, self.name, n_min=8, n_guess=64)
        edges = edges_for(fit.n)
        gold = sorted(bfs_at_depth(edges, start, d) if kind == "bfs" else parents_of(edges, start))
        where = {e: i / max(1, len(edges) - 1) for i, e in enumerate(edges)}
        edge_depths = sorted(round(where[e], 4) for e in relevant)
        sample = finish(self, index, spec, fit, gold, seed, depth=edge_depths[0], edge_depths=edge_depths,
                        task_version=VERSION, operation=kind, bfs_depth=d if kind == "bfs" else None,
                        node=start, n_edges=len(edges), n_nodes=len({x for e in edges for x in e}))
        if spec.max_tokens is None:  # the last whole edge's leftover goes to the generation budget
            sample.max_tokens = budget + max(0, min(32, spec.target_length - budget - fit.prompt_tokens))
        return sample

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric, precision=0.0, recall=0.0)
        text = (FINAL + output) if sample.mode == "completion" else output
        pred = parse_final_answer(text)
        if pred is None:
            return failed_score(self.metric, precision=0.0, recall=0.0)
        f1, p, r = set_f1(pred, sample.answers)
        return {"score": f1, "metric": self.metric, "parsed": "[" + ", ".join(pred) + "]",
                "extraction_failed": False, "precision": p, "recall": r}
