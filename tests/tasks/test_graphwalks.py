"""The GraphWalks-style task: seeded determinism, lengths within 1% under the reference tokenizer (2K-32K,
and 128K), the gold set recomputed from the prompt's own edge list, set-F1 grading and its parser, and
the too-short length's one line."""
from __future__ import annotations

import re
from collections import deque

import pytest

from tasks.base import BuildSpec, TaskError
from tasks.helmet.graphwalks import VERSION
from tasks.metrics import parse_final_answer, set_f1
from tasks.registry import get_task
from tests.tasks.lengths import check

EDGE = re.compile(r"^([0-9a-f]{8}) -> ([0-9a-f]{8})$")


def edges_of(sample) -> list[tuple[str, str]]:
    """The edge list the model reads (after the example graph)."""
    body = sample.prompt_text().split("Here is the graph to operate on:", 1)[1].split("\n\nOperation:", 1)[0]
    return [m.groups() for line in body.splitlines() if (m := EDGE.match(line))]


def truth(edges, op: str) -> set[str]:
    """An independent answer: breadth-first distances, or the sources of edges into the node."""
    if m := re.fullmatch(r"Find the parents of node ([0-9a-f]{8})\.", op):
        return {u for u, v in edges if v == m.group(1)}
    m = re.fullmatch(r"Perform a BFS from node ([0-9a-f]{8}) with depth (\d)\.", op)
    start, depth = m.group(1), int(m.group(2))
    out: dict[str, list[str]] = {}
    for a, b in edges:
        out.setdefault(a, []).append(b)
    dist, queue = {start: 0}, deque([start])
    while queue:
        u = queue.popleft()
        for b in out.get(u, ()):
            if b not in dist:
                dist[b] = dist[u] + 1
                queue.append(b)
    return {x for x, d in dist.items() if d == depth}


def operation(sample) -> str:
    return sample.prompt_text().split("\n\nOperation:\n", 1)[1].split("\n", 1)[0]


def test_same_seed_same_bytes_other_seed_other_prompt(ref_tok):
    for mode in ("chat", "completion"):
        a = get_task("graphwalks").build(3, BuildSpec(4096, ref_tok, mode, seed=5))
        b = get_task("graphwalks").build(3, BuildSpec(4096, ref_tok, mode, seed=5))
        c = get_task("graphwalks").build(3, BuildSpec(4096, ref_tok, mode, seed=6))
        assert a.to_dict() == b.to_dict() and a.prompt_text() == b.prompt_text()
        assert a.prompt_hash() != c.prompt_hash()


@pytest.mark.parametrize("length", [2048, 4096, 8192, 32768])
@pytest.mark.parametrize("mode", ["chat", "completion"])
@pytest.mark.parametrize("index", range(2))  # a parents and a BFS question
def test_within_one_percent(length, mode, index, ref_tok):
    check(get_task("graphwalks").build(index, BuildSpec(length, ref_tok, mode)), length, ref_tok)


@pytest.mark.slow
def test_within_one_percent_at_128k(ref_tok):
    s = get_task("graphwalks").build(5, BuildSpec(131072, ref_tok, "chat"))
    check(s, 131072, ref_tok)
    edges = edges_of(s)
    assert len(edges) == s.metadata["n_edges"] > 5000
    assert set(s.answers) == truth(edges, operation(s))


def test_the_gold_is_the_prompts_own_answer(ref_tok):
    seen = set()
    for index in range(6):
        s = get_task("graphwalks").build(index, BuildSpec(4096, ref_tok, "chat"))
        m, op, edges = s.metadata, operation(s), edges_of(s)
        seen.add((m["operation"], m["bfs_depth"]))
        assert m["task_version"] == VERSION and len(edges) == m["n_edges"] == len(set(edges))
        assert all(u != v for u, v in edges)
        gold = truth(edges, op)
        assert gold and sorted(gold) == s.answers and m["node"] in op and m["node"] not in gold
        assert 2 <= len(gold) <= 6
        # the depth is where the first edge the answer depends on sits, and those edges are spread out
        if m["operation"] == "parents":
            relevant = [i for i, (u, v) in enumerate(edges) if v == m["node"]]
        else:
            reached = {m["node"]} | set().union(*(truth(edges, op.replace(f"depth {m['bfs_depth']}", f"depth {j}"))
                                                 for j in range(1, m["bfs_depth"])))
            relevant = [i for i, (u, v) in enumerate(edges) if u in reached]
        assert m["edge_depths"] == pytest.approx([i / (len(edges) - 1) for i in relevant], abs=1e-4)
        assert m["depth"] == m["edge_depths"][0]
    assert seen == {("parents", None), ("bfs", 1), ("bfs", 2), ("bfs", 3)}


def test_relevant_edges_are_scattered(ref_tok):
    spans = [max(d) - min(d) for i in range(12)
             if len(d := get_task("graphwalks").build(i, BuildSpec(8192, ref_tok, "chat")).metadata["edge_depths"]) > 1]
    firsts = [get_task("graphwalks").build(i, BuildSpec(8192, ref_tok, "chat")).metadata["depth"] for i in range(12)]
    assert sum(spans) / len(spans) > 0.3 and max(firsts) - min(firsts) > 0.3


def test_parser_and_set_f1():
    assert parse_final_answer("Final Answer: [ab12cd34, 'ef56ab78' , \"00ff00ff\"]") == ["ab12cd34", "ef56ab78",
                                                                                       "00ff00ff"]
    assert parse_final_answer("thinking\nFinal Answer: [x]\nmore\n**Final Answer:** [AB12CD34, y]\n") == ["ab12cd34",
                                                                                                         "y"]
    assert parse_final_answer("final answer: a, b") == ["a", "b"]
    assert parse_final_answer("Final Answer: []") == [] and parse_final_answer("no list here") is None
    assert parse_final_answer(None) is None
    assert set_f1(["a", "b"], ["a", "b"]) == (1.0, 1.0, 1.0)
    f1, p, r = set_f1(["a", "c"], ["a", "b", "d"])
    assert (p, r) == (0.5, pytest.approx(1 / 3)) and f1 == pytest.approx(0.4)
    assert set_f1([], ["a"]) == (0.0, 0.0, 0.0) and set_f1(None, ["a"])[0] == 0.0


def test_scores(ref_tok):
    s = get_task("graphwalks").build(4, BuildSpec(4096, ref_tok, "chat"))
    gold = s.answers
    line = "Final Answer: [" + ", ".join(gold) + "]"
    assert s.score(line) == {"score": 1.0, "metric": "set_f1", "parsed": "[" + ", ".join(gold) + "]",
                             "extraction_failed": False, "precision": 1.0, "recall": 1.0}
    assert s.score("  The parents are listed below.\n\nFinal Answer: ['" + "', '".join(reversed(gold)) + "']  ")[
        "score"] == 1.0  # order, quotes and whitespace do not matter
    partial = s.score("Final Answer: [" + gold[0] + ", deadbeef]")["score"]
    assert 0.0 < partial < 1.0
    assert s.score("Final Answer: [deadbeef]")["score"] == 0.0 and s.score("Final Answer: []")["score"] == 0.0
    none = s.score(", ".join(gold))  # the right nodes without the answer line: 0
    assert none["score"] == 0.0 and none["extraction_failed"] is True
    assert s.score("")["score"] == 0.0 and s.score(None)["extraction_failed"] is True
    comp = get_task("graphwalks").build(4, BuildSpec(4096, ref_tok, "completion"))
    assert comp.prompt.endswith("\nFinal Answer:") and comp.answers == gold
    assert comp.score(" [" + ", ".join(gold) + "]")["score"] == 1.0  # continues the answer prefix


def test_a_length_too_short_names_the_minimum(ref_tok):
    with pytest.raises(TaskError, match=r"^target length 512 is too small for task graphwalks \(needs > \d+ tokens\); "
                                        r"pick a longer length$"):
        get_task("graphwalks").build(0, BuildSpec(512, ref_tok, "chat"))
