"""Family `ledger` (D): a stateful "project ledger" tool environment seeded from repository facts.

The database holds the real functions of the standard library's `email` package (signature,
line count, exceptions raised, source) and the real tests of `test_email` that reference them,
plus seeded owners per module and distractor tickets. A task asks the agent to open a ticket
for every in-scope function that raises a given exception, assign it to the module's owner
(a fact read once, early), link every referencing test, and report counts. Outputs are paged;
the horizon grows with the number of in-scope functions and links (tens to hundreds of
calls). Graded by the normalised final state (ticket ids excluded) equal to the gold state and
by the reported counts. No test suite runs, so this is the cheapest family at scale.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from typing import Any

from agents.env import Environment, Grade
from agents.errors import ToolError, ToolFormatError
from agents.families.base import Family, validate
from agents.families.ledger_db import LedgerFacts, build_facts
from agents.task import AgentTask
from agents.tools import SUBMIT_SPEC, require, spec
from tasks.repo.fixtures import short_hash
from tasks.repo.sources import package_files, pin, stdlib_dir

PAGE = 10
FIRST_TICKET = 1001
_S, _I = {"type": "string"}, {"type": "integer"}
SPECS = [
    spec("search_functions", "List functions whose qualified name contains `query` (paged).",
         {"query": _S, "page": _I}, ["query"]),
    spec("get_function", "Full record of one function: signature, lines, exceptions raised, docstring, source.",
         {"qualname": _S}, ["qualname"]),
    spec("list_tests", "Tests that reference a function (paged).", {"qualname": _S, "page": _I}, ["qualname"]),
    spec("get_test", "Source of one test.", {"test_id": _S}, ["test_id"]),
    spec("get_owner", "Owner of a module.", {"module": _S}, ["module"]),
    spec("create_ticket", "Open a ticket about a function; returns its id.",
         {"qualname": _S, "owner": _S, "title": _S}, ["qualname", "owner", "title"]),
    spec("link_test", "Link a test to a ticket.", {"ticket": _S, "test_id": _S}, ["ticket", "test_id"]),
    spec("list_tickets", "All tickets (paged).", {"page": _I}, []),
    spec("close_ticket", "Close a ticket.", {"ticket": _S}, ["ticket"]),
]


def email_repo() -> dict[str, Any]:
    lib = stdlib_dir()
    files = {k: v for k, v in package_files(lib / "email", "email").items() if k.endswith(".py")}
    files.update({f"test/test_email/{p.name}": p for p in sorted((lib / "test" / "test_email").glob("test_*.py"))})
    return pin(files)


def facts_of(spec_: dict[str, Any]) -> LedgerFacts:
    return build_facts(json.dumps(spec_["files"], sort_keys=True), spec_["owner_seed"])


def in_scope(facts: LedgerFacts, scope: str, methods: bool) -> list[str]:
    return sorted(q for q, f in facts.functions.items()
                  if (f.module == scope or f.module.startswith(scope + ".")) and (methods or f.toplevel))


class LedgerEnvironment(Environment):
    def __init__(self, task: AgentTask):
        self.task, self.facts = task, facts_of(task.spec)
        self.tickets: list[dict[str, Any]] = [dict(t) for t in task.spec["initial_tickets"]]
        self.next_id = FIRST_TICKET + len(self.tickets)

    def tool_specs(self) -> list[dict[str, Any]]:
        return SPECS + [SUBMIT_SPEC]

    def call(self, name: str, args: dict[str, Any]) -> str:
        fn = getattr(self, f"_t_{name}", None)
        if fn is None:
            names = ", ".join(s["function"]["name"] for s in self.tool_specs())
            raise ToolFormatError(f"unknown tool {name!r}; available: {names}")
        return fn(args)

    def _fn(self, qualname: str):
        if qualname not in self.facts.functions:
            raise ToolError(f"no function {qualname!r}; names look like 'email.utils:formatdate' "
                            "(use search_functions)")
        return self.facts.functions[qualname]

    def _ticket(self, tid: str) -> dict[str, Any]:
        for t in self.tickets:
            if t["id"] == tid:
                return t
        raise ToolError(f"no ticket {tid!r}")

    def _t_search_functions(self, a):
        q = require(a, "query").lower()
        hits = [k for k in sorted(self.facts.functions) if q in k.lower()]
        return _page([f"{k} ({self.facts.functions[k].lines} lines)" for k in hits], a)

    def _t_get_function(self, a):
        f = self._fn(require(a, "qualname"))
        return (f"qualname: {f.qualname}\nmodule: {f.module}\nsignature: {f.signature}\nlines: {f.lines}\n"
                f"raises: {', '.join(f.raises) or '(none)'}\ndocstring: {f.docstring or '(none)'}\nsource:\n{f.source}")

    def _t_list_tests(self, a):
        return _page(self.facts.tests_referencing(self._fn(require(a, "qualname")).name), a)

    def _t_get_test(self, a):
        tid = require(a, "test_id")
        if tid not in self.facts.tests:
            raise ToolError(f"no test {tid!r}")
        return self.facts.tests[tid][0]

    def _t_get_owner(self, a):
        m = require(a, "module")
        if m not in self.facts.owners:
            raise ToolError(f"no module {m!r}")
        return self.facts.owners[m]

    def _t_create_ticket(self, a):
        f = self._fn(require(a, "qualname"))
        owner, title = require(a, "owner"), require(a, "title")
        if owner not in set(self.facts.owners.values()):
            raise ToolError(f"unknown owner {owner!r}; owners come from get_owner")
        tid = f"T-{self.next_id}"
        self.next_id += 1
        self.tickets.append({"id": tid, "qualname": f.qualname, "owner": owner, "title": title, "status": "open",
                             "tests": []})
        return f"created ticket {tid}"

    def _t_link_test(self, a):
        t, test = self._ticket(require(a, "ticket")), require(a, "test_id")
        if test not in self.facts.tests:
            raise ToolError(f"no test {test!r}")
        if test in t["tests"]:
            raise ToolError(f"{test} is already linked to {t['id']}")
        t["tests"].append(test)
        return f"linked {test} to {t['id']}"

    def _t_list_tickets(self, a):
        return _page([f"{t['id']} [{t['status']}] {t['owner']}: {t['title']} ({len(t['tests'])} tests)"
                      for t in self.tickets], a)

    def _t_close_ticket(self, a):
        self._ticket(require(a, "ticket"))["status"] = "closed"
        return f"closed {a['ticket']}"

    def checkpoint(self) -> dict[str, Any]:
        return {"tickets": self.tickets, "next_id": self.next_id}

    def restore(self, state: dict[str, Any]) -> None:
        self.tickets, self.next_id = [dict(t) for t in state["tickets"]], state["next_id"]

    def grade(self, answer: str | None) -> Grade:
        state_ok = state_hash(self.tickets) == self.task.spec["gold_state"]
        want = self.task.spec["answer"]
        got = {k: int(v) for k, v in re.findall(r"(tickets|tests)\s*=\s*(\d+)", answer or "")}
        answer_ok = got == want
        made = len(self.tickets) - len(self.task.spec["initial_tickets"])
        return Grade(1.0 if state_ok and answer_ok else 0.0,
                     {"state_ok": state_ok, "answer_ok": answer_ok, "tickets_expected": want["tickets"],
                      "tickets_made": made})


def _page(items: list[str], a: dict[str, Any]) -> str:
    page = require(a, "page", int) if "page" in a else 1
    n = max(1, -(-len(items) // PAGE))
    if not 1 <= page <= n:
        raise ToolError(f"page {page} out of range 1..{n}")
    body = items[(page - 1) * PAGE: page * PAGE]
    return "\n".join(body or ["(no results)"]) + f"\n[page {page} of {n}; {len(items)} results]"


def state_hash(tickets: list[dict[str, Any]]) -> str:
    norm = sorted((t["qualname"], t["owner"], t["title"], t["status"], tuple(sorted(t["tests"]))) for t in tickets)
    return hashlib.sha256(json.dumps(norm).encode()).hexdigest()[:16]


class LedgerFamily(Family):
    name, version = "ledger", "1"
    description = "open, assign and link tickets for functions found through a paged API over real repo facts"

    def generate(self, seed: int, n: int, n_min: int = 2, n_max: int = 6, scope: str | None = None,
                 exception: str | None = None, include_methods: bool = False, distractors: int = 5) -> list[AgentTask]:
        pinned = email_repo()
        base = {"files": pinned, "owner_seed": seed}
        facts = facts_of(base)
        if scope and exception:
            pairs = [(scope, exception)]
        else:
            modules = sorted({f.module for f in facts.functions.values()})
            pairs = []
            for m in modules:
                c = Counter(e for q in in_scope(facts, m, include_methods) for e in facts.functions[q].raises)
                pairs += [(m, e) for e, k in sorted(c.items()) if n_min <= k <= n_max and m.count(".") >= 1]
            random.Random(seed).shuffle(pairs)
        tasks: list[AgentTask] = []
        for sc, exc in pairs[:n]:
            task = self._task(seed, base, facts, sc, exc, include_methods, distractors)
            if validate(self, task) == {"gold": 1.0, "empty": 0.0}:
                tasks.append(task)
        return tasks

    def _task(self, seed, base, facts, scope, exc, methods, distractors) -> AgentTask:
        rng = random.Random(f"{seed}|{scope}|{exc}")
        names = sorted(facts.functions)
        initial = [{"id": f"T-{FIRST_TICKET + i}", "qualname": q, "owner": facts.owners[facts.functions[q].module],
                    "title": f"Review {q}", "status": "open", "tests": []}
                   for i, q in enumerate(rng.sample(names, distractors))]
        scoped = in_scope(facts, scope, methods)
        targets = [q for q in scoped if exc in facts.functions[q].raises]
        query = scope
        n_hits = sum(1 for k in facts.functions if query.lower() in k.lower())
        gold = [{"name": "search_functions", "arguments": {"query": query, "page": p}}
                for p in range(1, -(-n_hits // PAGE) + 1)]
        gold += [{"name": "get_function", "arguments": {"qualname": q}} for q in scoped]
        owners = {}
        for q in targets:
            m = facts.functions[q].module
            if m not in owners:
                owners[m] = facts.owners[m]
                gold.append({"name": "get_owner", "arguments": {"module": m}})
        links, tid = 0, FIRST_TICKET + len(initial)
        tickets = [dict(t) for t in initial]
        for q in targets:
            f = facts.functions[q]
            gold.append({"name": "create_ticket",
                         "arguments": {"qualname": q, "owner": owners[f.module], "title": f"Audit {q}"}})
            tests = facts.tests_referencing(f.name)
            gold += [{"name": "list_tests", "arguments": {"qualname": q, "page": p}}
                     for p in range(1, max(1, -(-len(tests) // PAGE)) + 1)]
            gold += [{"name": "link_test", "arguments": {"ticket": f"T-{tid}", "test_id": t}} for t in tests]
            tickets.append({"qualname": q, "owner": owners[f.module], "title": f"Audit {q}", "status": "open",
                            "tests": tests})
            links += len(tests)
            tid += 1
        answer = {"tickets": len(targets), "tests": links}
        gold.append({"name": "submit", "arguments": {"answer": f"tickets={len(targets)} tests={links}"}})
        kind = "function or method" if methods else "top-level function"
        package = any(f.module.startswith(scope + ".") for f in facts.functions.values())
        where = f"package `{scope}` (all its modules)" if package else f"module `{scope}`"
        example = targets[0] if targets else "email.utils:formatdate"
        instr = (f"You manage a project ledger through its tools. For every {kind} in {where} whose body raises "
                 f"`{exc}` (check each one with get_function; search_functions with query `{query}` lists them), "
                 "open a ticket assigned to the owner of the function's module (get_owner), titled exactly "
                 f"`Audit <qualname>` (e.g. `Audit {example}`), and link to it every test that references the "
                 "function (list_tests). Do not change other tickets. Finally call submit with the answer "
                 "`tickets=<number of tickets you opened> tests=<number of links you made>`.")
        spec_ = {**base, "scope": scope, "exception": exc, "include_methods": methods, "initial_tickets": initial,
                 "gold": gold, "gold_state": state_hash(tickets), "answer": answer}
        limits = {"max_steps": max(40, 2 * len(gold))}
        task_id = f"{self.name}-{scope.split('.')[-1]}-{short_hash(seed, scope, exc, methods)}"
        return AgentTask(task_id, self.name, self.version, seed, instr, spec_, limits,
                         {"n_entities": len(targets), "links": links, "scope_functions": len(scoped),
                          "gold_tool_calls": len(gold)})

    def environment(self, task: AgentTask, container: bool = False) -> LedgerEnvironment:
        return LedgerEnvironment(task)
