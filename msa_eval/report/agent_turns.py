"""Cost and context growth per turn in the agent report: each record's trajectory (`agents/trajectory.py`,
our loop's or one converted from mini-swe-agent) read step by step.

Per turn (one model call): prompt tokens (= the context length sent, as the provider reported it, else
the loop's count), completion tokens, cached prompt tokens (when reported), cumulative tokens, context
growth over the previous turn, the call's cost from the price table and the cumulative cost, latency.
Per task: the totals (cost per task, as Context-Bench reports it), first / peak / last context and the
mean growth per turn. A step without a cost is unknown (None) for hosted backends; local engines and the
oracle cost 0 (the records' rule, report/agents.py). Trajectories written before the per-call usage field
simply give empty cells; a record whose trajectory file is gone is counted in a note.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from msa_common.atomic import atomic_path

TURN_FIELDS = ("backend", "task_id", "step", "prompt_tokens", "completion_tokens", "cached_tokens",
               "cumulative_tokens", "context_growth", "cost_usd", "cumulative_cost_usd", "latency_s")
TASK_FIELDS = ("backend", "task_id", "family", "status", "score", "steps", "prompt_tokens", "completion_tokens",
               "total_tokens", "first_context_tokens", "peak_context_tokens", "last_context_tokens",
               "mean_context_growth", "cost_usd")


def trajectory_file(record: dict[str, Any]) -> Path | None:
    """The record's trajectory: `<run_dir>/trajectories/<task>.jsonl`, else the path the record names."""
    run_dir = record.get("_run_dir")
    candidates = [Path(run_dir) / "trajectories" / f"{record['task_id']}.jsonl"] if run_dir else []
    if record.get("trajectory"):
        candidates.append(Path(record["trajectory"]))
    return next((p for p in candidates if p.is_file()), None)


def _free(backend: str) -> bool:
    return backend == "oracle" or backend.startswith("local:")


def turns_of(record: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step of `steps` (trajectory step lines) of `record`."""
    rows: list[dict[str, Any]] = []
    tokens, cost, prev = 0, 0.0, None
    cost_known = True
    for s in steps:
        u = s.get("usage") or {}
        p = u.get("prompt_tokens", s.get("context_tokens"))
        k = u.get("completion_tokens")
        tokens += (p or 0) + (k or 0)
        c = u.get("cost_usd")
        if c is None and _free(record["backend"]):
            c = 0.0
        cost_known &= c is not None
        cost += c or 0.0
        rows.append({"backend": record["backend"], "task_id": record["task_id"], "step": s.get("step"),
                     "prompt_tokens": p, "completion_tokens": k, "cached_tokens": u.get("cached_tokens"),
                     "cumulative_tokens": tokens, "context_growth": None if prev is None or p is None else p - prev,
                     "cost_usd": None if c is None else round(c, 6),
                     "cumulative_cost_usd": round(cost, 6) if cost_known else None, "latency_s": s.get("latency_s")})
        prev = p
    return rows


def task_row(record: dict[str, Any], family: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    ctx = [t["prompt_tokens"] for t in turns if t["prompt_tokens"] is not None]
    growth = [t["context_growth"] for t in turns if t["context_growth"] is not None]
    p = sum(t["prompt_tokens"] or 0 for t in turns)
    k = sum(t["completion_tokens"] or 0 for t in turns)
    return {"backend": record["backend"], "task_id": record["task_id"], "family": family,
            "status": record.get("status"), "score": record.get("score"), "steps": len(turns),
            "prompt_tokens": p, "completion_tokens": k, "total_tokens": p + k,
            "first_context_tokens": ctx[0] if ctx else None, "peak_context_tokens": max(ctx, default=None),
            "last_context_tokens": ctx[-1] if ctx else None,
            "mean_context_growth": round(sum(growth) / len(growth), 1) if growth else None,
            "cost_usd": turns[-1]["cumulative_cost_usd"] if turns else None}


def build_turns(records: list[dict[str, Any]], family_of) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                  list[str]]:
    """(per-task rows, per-turn rows, notes) over `records` (`load_agent_runs`)."""
    from agents.errors import AgentHarnessError
    from agents.trajectory import read_trajectory

    tasks: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    missing = 0
    for r in records:
        path = trajectory_file(r)
        try:
            steps = read_trajectory(path).steps if path is not None else None
        except AgentHarnessError:
            steps = None
        if steps is None:
            missing += 1
            continue
        rows = turns_of(r, steps)
        turns.extend(rows)
        tasks.append(task_row(r, family_of(r), rows))
    notes = [("per turn: prompt_tokens = the context sent in that call (provider-reported when available); "
              "context_growth = its change over the previous turn; cost from the price table (local and oracle: 0)")]
    if missing:
        notes.append(f"{missing} record(s) without a readable trajectory file: not in the per-task and per-turn tables")
    return tasks, turns, notes


def table_markdown(fields: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    out = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    out += ["| " + " | ".join("" if r[f] is None else str(r[f]) for f in fields) + " |" for r in rows]
    return "\n".join(out) + "\n"


def plot_context_curves(turns: list[dict[str, Any]], path: Path) -> Path:
    """Context tokens sent per turn and cumulative tokens, one line per (backend, task), a colour per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ctx, ax_cum) = plt.subplots(1, 2, figsize=(11, 4))
    backends = list(dict.fromkeys(t["backend"] for t in turns))
    colours = {b: plt.get_cmap("tab10")(i % 10) for i, b in enumerate(backends)}
    for key in dict.fromkeys((t["backend"], t["task_id"]) for t in turns):
        ts = [t for t in turns if (t["backend"], t["task_id"]) == key]
        steps = [t["step"] for t in ts]
        ax_ctx.plot(steps, [t["prompt_tokens"] for t in ts], marker=".", color=colours[key[0]], alpha=0.8)
        ax_cum.plot(steps, [t["cumulative_tokens"] for t in ts], marker=".", color=colours[key[0]], alpha=0.8)
    for b in backends:
        ax_ctx.plot([], [], color=colours[b], label=b)
    ax_ctx.set(xlabel="turn (model call)", ylabel="context tokens sent", title="context per turn")
    ax_cum.set(xlabel="turn (model call)", ylabel="prompt + completion tokens", title="cumulative tokens")
    ax_ctx.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
