"""Agent suites: a YAML config (validated by pydantic, unknown keys are errors) lists entries per
family; an entry's tasks are generated and gold-validated when first needed, then cached.

Listing (`entry_status`) reads the config and the cache only, so it answers at once. Generation
(seconds to minutes: test baselines, gold replays) happens when a task is run, or on request,
and its result is cached (`suite_cache.py`) in the folder the caller passes (the CLI's is
`$MSA_EVAL_HOME/agent-suites`); a stale or damaged cache is regenerated, never trusted.

`find_task(suite, "regression")` is the first task of a family (letters A-D work too),
`find_task(suite, "regression:<id>")` or `find_task(suite, "<id>")` a task by id; only the
entries of the family the reference names are generated. Unknown ids raise naming known ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from agents.errors import AgentHarnessError, UnknownTaskError
from agents.families import FAMILIES, canonical_task_id, family_name, family_names, get_family, task_family
from agents.suite_cache import Entry, Status, cache_path, read_cache, write_cache
from agents.task import AgentTask

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "agents.yaml"


class _Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    families: dict[str, list[dict[str, Any]]]


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    suites: dict[str, _Suite]


@dataclass(frozen=True)
class Suite:
    name: str
    seed: int
    entries: tuple[Entry, ...]
    cache: Path  # folder of the entry caches


def load_suite_config(name: str, path: Path | None = None) -> dict[str, Any]:
    """{"seed", "families": {family name: [knobs, ...]}} with letters resolved to names."""
    path = Path(path or DEFAULT_CONFIG)
    if not path.is_file():
        raise AgentHarnessError(f"agent suite file {path} not found; pass --config PATH")
    try:
        cfg = _File.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as e:
        raise AgentHarnessError(f"{path}: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    if name not in cfg.suites:
        raise AgentHarnessError(f"no agent suite {name!r} in {path}; suites: {', '.join(cfg.suites)}")
    suite = cfg.suites[name].model_dump()
    families: dict[str, list[dict[str, Any]]] = {}
    for key, entries in suite["families"].items():
        try:
            fam = family_name(key)
        except UnknownTaskError as e:
            raise UnknownTaskError(f"{path}: suite {name!r}: {e}") from None
        if fam in families:
            raise AgentHarnessError(f"{path}: suite {name!r} lists family {fam} twice (as a name and as its letter); "
                                    "merge the entries")
        families[fam] = entries
    return {"seed": suite["seed"], "families": families}


def open_suite(name: str, config: Path | None, cache: Path) -> Suite:
    suite = load_suite_config(name, config)
    entries: list[Entry] = []
    for fam, knob_list in suite["families"].items():
        for knobs in knob_list:
            knobs = dict(knobs)
            n = knobs.pop("n", 1)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise AgentHarnessError(f"suite {name!r}, family {fam}: n must be a whole number >= 1, not {n!r}")
            entries.append(Entry(fam, len(entries), suite["seed"], n, knobs))
    return Suite(name, suite["seed"], tuple(entries), Path(cache))


def entry_status(entry: Entry, cache: Path) -> tuple[Status, list[AgentTask]]:
    """What the cache holds for `entry`, without generating anything."""
    return read_cache(cache_path(entry, cache))


def generate_entry(entry: Entry) -> list[AgentTask]:
    """The entry's `n` validated tasks (deterministic under its seed)."""
    try:
        got = get_family(entry.family).generate(entry.seed, entry.n, **entry.knobs)
    except TypeError as e:
        raise AgentHarnessError(f"family {entry.family}: bad knob in the suite config ({e})") from None
    if len(got) < entry.n:
        raise AgentHarnessError(f"family {entry.family} produced {len(got)} of {entry.n} valid tasks for "
                                f"{entry.knobs}; relax the knobs or lower n")
    return got


def entry_tasks(entry: Entry, cache: Path, regenerate: bool = False) -> list[AgentTask]:
    """The entry's tasks: from its cache when current, else generated, validated and cached."""
    path = cache_path(entry, cache)
    status, tasks = read_cache(path) if not regenerate else ("missing", [])
    if status == "cached":
        return tasks
    tasks = generate_entry(entry)
    write_cache(entry, tasks, path)
    return tasks


def suite_tasks(suite: Suite, families: list[str] | None = None, limit: int | None = None,
                regenerate: bool = False) -> list[AgentTask]:
    """The tasks of the suite's entries (of `families` only, if given), in config order; with
    `limit`, entries past the first `limit` tasks are not generated."""
    keep = {family_name(f) for f in families} if families else None
    tasks: list[AgentTask] = []
    for e in suite.entries:
        if limit is not None and len(tasks) >= limit:
            break
        if keep is None or e.family in keep:
            tasks.extend(entry_tasks(e, suite.cache, regenerate))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise AgentHarnessError("duplicate task ids in the suite; give each family entry different knobs")
    return tasks[:limit] if limit is not None else tasks


def load_suite(name: str, config: Path | None = None, regenerate: bool = False, *, cache: Path) -> list[AgentTask]:
    """Every task of the suite (generated where the cache is not current)."""
    return suite_tasks(open_suite(name, config, cache), regenerate=regenerate)


def find_task(suite: Suite, ref: str) -> AgentTask:
    """A task by family (its first task), FAMILY:ID or ID; generates only that family's entries."""
    fam_ref, _, tid = ref.partition(":")
    if not tid and ref in FAMILIES:
        name = family_name(ref)
        first = [e for e in suite.entries if e.family == name]
        if not first:
            raise UnknownTaskError(f"the suite has no family {name} task")
        return entry_tasks(first[0], suite.cache)[0]
    want = tid or ref
    fam = family_name(fam_ref) if tid else task_family(want)
    entries = [e for e in suite.entries if e.family == fam]
    cached = [e for e in entries if entry_status(e, suite.cache)[0] == "cached"]
    seen: list[str] = []
    for e in cached + [e for e in entries if e not in cached]:
        for t in entry_tasks(e, suite.cache):
            if t.id in (want, canonical_task_id(want)):
                return t
            seen.append(t.id)
    if fam is None:
        known = f"ids start with their family ({', '.join(family_names())})"
    elif not seen:
        known = f"(the suite has no {fam} entry)"
    else:
        known = ", ".join(seen[:12]) + (" ..." if len(seen) > 12 else "")
    raise UnknownTaskError(f"unknown task id {want!r}; known: {known} (see `msa-eval agent list`)")
