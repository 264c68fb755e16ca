"""mini-swe-agent's trajectory JSON (`mini -o FILE.traj.json`, `trajectory_format` "mini-swe-agent-1.x")
-> our trajectory JSONL (header, one step line per model call, result; `agents/trajectory.py`).

What its file holds and how it maps:
  messages[0:2]   system + task prompt                      -> header `messages`
  assistant msg   one model call; `extra.response` is the raw  -> step: response, usage (the provider's
                  OpenAI response (usage included), `extra.actions`  prompt/completion/cached tokens), the
                  the bash commands it ran                     assistant message and its observations
  tool/user msg   an observation (`extra.returncode`)          -> the step's appended messages + observations
  user msg with   a reply without a usable action; the reply    -> step with `format_error: true`
  `extra.response` itself is only in `extra.response`
  exit msg        `extra.exit_status` (Submitted, LimitsExceeded, -> result `status`
                  TimeExceeded, RepeatedFormatError, or an exception's class name)
mini-swe-agent records no per-call latency: `latency_s` is the server's own time (queue + prefill + decode)
when the response carries `msa_eval_timings` (msa-eval serve), else null; it keeps no context count: a step's
`context_tokens` is the prompt tokens the server reported. Cost per call comes from the caller's price
function (our price table), not from litellm (which knows no price for a local model).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.config import AgentResult
from agents.converters import FORMATS
from agents.env import Grade
from agents.errors import AgentHarnessError
from agents.task import AgentTask
from agents.tokens import approx_tokens, messages_text
from agents.trajectory import SCHEMA, TrajectoryWriter
from msa_common import __version__

FORMAT_PREFIX = "mini-swe-agent-1."
CostFn = Callable[[int, int], "float | None"]  # (prompt tokens, completion tokens) -> USD, None when unknown
_STATUS = {"Submitted": "submitted", "TimeExceeded": "wall_time_limit", "RepeatedFormatError": "format_errors"}


@dataclass
class MiniStep:
    response: dict[str, Any]  # the OpenAI chat completion the server returned
    messages: list[dict[str, Any]] = field(default_factory=list)  # what this call appended to the history
    format_error: bool = False
    observations: list[dict[str, Any]] = field(default_factory=list)


def read_mini_trajectory(path: Path) -> dict[str, Any]:
    """The parsed file; anything that is not a mini-swe-agent trajectory is refused in one line."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise AgentHarnessError(f"{path} is not a readable JSON trajectory ({type(e).__name__}); "
                                f"formats read: {', '.join(FORMATS)}") from None
    fmt = data.get("trajectory_format") if isinstance(data, dict) else None
    if not isinstance(fmt, str) or not fmt.startswith(FORMAT_PREFIX) or not isinstance(data.get("messages"), list):
        raise AgentHarnessError(f"{path} has trajectory format {fmt!r}, which is not read here; "
                                f"formats read: {', '.join(FORMATS)}")
    return data


def _clean(m: dict[str, Any]) -> dict[str, Any]:
    """A history message without mini-swe-agent's `extra` (raw responses, timestamps)."""
    return {k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id") and v is not None}


def split_messages(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[MiniStep], dict[str, Any]]:
    """(initial messages, one `MiniStep` per model call, the exit message's `extra` ({} when missing))."""
    initial: list[dict[str, Any]] = []
    steps: list[MiniStep] = []
    exit_extra: dict[str, Any] = {}
    for m in data["messages"]:
        extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
        if m.get("role") == "exit":
            exit_extra = extra
        elif isinstance(extra.get("response"), dict):
            reply = (extra["response"].get("choices") or [{}])[0].get("message") or {}
            if m.get("role") == "assistant":
                steps.append(MiniStep(extra["response"], [_clean(m)]))
            else:  # the reply had no usable action: mini keeps only its correction message, the reply in extra
                assistant = _clean({"role": "assistant", "content": reply.get("content") or "",
                                    "tool_calls": reply.get("tool_calls") or None})
                steps.append(MiniStep(extra["response"], [assistant, _clean(m)], format_error=True,
                                      observations=[{"name": None, "ok": False, "error": m.get("content", "")[:300]}]))
        elif steps:
            steps[-1].messages.append(_clean(m))
            rc = extra.get("returncode")
            steps[-1].observations.append({"tool_call_id": m.get("tool_call_id"), "name": "bash", "ok": rc == 0,
                                           "error": None if rc == 0 else f"exit code {rc}",
                                           "output_chars": len(str(m.get("content") or ""))})
        else:
            initial.append(_clean(m))
    return initial, steps, exit_extra


def _server_latency(response: dict[str, Any]) -> float | None:
    t = response.get("msa_eval_timings")
    if not isinstance(t, dict):
        return None
    return round(sum(float(t.get(k) or 0.0) for k in ("queue_s", "prefill_s", "decode_s")), 4)


def exit_status(exit_extra: dict[str, Any], n_calls: int, step_limit: int) -> tuple[str, str | None]:
    """Our exit status (agents/config.py EXIT_STATUSES) and harness error for mini-swe-agent's exit."""
    name = str(exit_extra.get("exit_status") or "")
    if name in _STATUS:
        return _STATUS[name], None
    if name == "LimitsExceeded":
        return ("step_limit" if 0 < step_limit <= n_calls else "cost_limit"), None
    if not name:
        return "environment_error", "the mini-swe-agent trajectory has no exit message (the run was cut off)"
    why = f"{name}: {exit_extra.get('exception_str') or ''}".strip(": ")
    return ("context_overflow" if "ContextWindow" in name else "api_error"), why


def convert(data: dict[str, Any], task: AgentTask, grade: Grade, out: Path, backend: dict[str, Any],
            cost: CostFn | None = None, wall_s: float = 0.0) -> AgentResult:
    """Write `out` (our trajectory JSONL) for mini-swe-agent's trajectory `data` of `task`, graded `grade`."""
    initial, steps, exit_extra = split_messages(data)
    agent_cfg = (data.get("info", {}).get("config") or {}).get("agent") or {}
    step_limit = int(agent_cfg.get("step_limit") or 0)
    config = {"harness": "mini-swe-agent", "context_policy": "none", "tool_mode": "native",
              "limits": {"max_steps": step_limit, "max_cost_usd": agent_cfg.get("cost_limit") or None,
                         "max_wall_s": agent_cfg.get("wall_time_limit_seconds") or None,
                         "max_consecutive_format_errors": agent_cfg.get("max_consecutive_format_errors")},
              "model": {k: v for k, v in ((data.get("info", {}).get("config") or {}).get("model") or {}).items()
                        if k in ("model_name", "model_kwargs", "cost_tracking")}}
    w = TrajectoryWriter(out)
    w.write({"type": "header", "schema": SCHEMA, "harness_version": __version__,
             "external": {"harness": "mini-swe-agent", "version": data.get("info", {}).get("mini_version"),
                          "trajectory_format": data["trajectory_format"]},
             "task": {"id": task.id, "family": task.family, "hash": task.content_hash(), "knobs": task.knobs},
             "config": config, "config_hash": None, "backend": backend, "token_counting": "provider-usage",
             "tools": ["bash"], "messages": initial})
    c: dict[str, Any] = {"steps": 0, "tool_calls": 0, "format_errors": 0, "consecutive_format_errors": 0,
                         "prompt_tokens": 0, "completion_tokens": 0, "peak": 0, "cost": 0.0}
    cost_known = cost is not None
    history = list(initial)
    for s in steps:
        usage = s.response.get("usage") or {}
        reply = (s.response.get("choices") or [{}])[0]
        p, k = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        call_cost = cost(p, k) if cost is not None else None
        cost_known &= call_cost is not None
        tool_calls = [] if s.format_error else [
            {"id": tc.get("id"), "name": (tc.get("function") or {}).get("name"),
             "arguments": (tc.get("function") or {}).get("arguments")} for tc in s.messages[0].get("tool_calls") or []]
        c["steps"] += 1
        c["tool_calls"] += len(tool_calls)
        c["format_errors"] += int(s.format_error)
        c["consecutive_format_errors"] = c["consecutive_format_errors"] + 1 if s.format_error else 0
        c["prompt_tokens"] += p
        c["completion_tokens"] += k
        c["peak"] = max(c["peak"], p)
        c["cost"] += call_cost or 0.0
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        w.write({"type": "step", "step": c["steps"], "context_tokens": p, "view_messages": len(history),
                 "response": {"content": (reply.get("message") or {}).get("content"),
                              "finish_reason": reply.get("finish_reason"), "tool_calls": tool_calls,
                              "parsed_from_text": False},
                 "usage": {"prompt_tokens": p, "completion_tokens": k, "cached_tokens": cached,
                           "cost_usd": call_cost, "reported": "prompt_tokens" in usage},
                 "latency_s": _server_latency(s.response), "messages": s.messages, "observations": s.observations,
                 "format_error": s.format_error, "elapsed_s": None, "counters": dict(c)})
        history.extend(s.messages)
    status, error = exit_status(exit_extra, c["steps"], step_limit)
    submitted = status == "submitted"
    res = AgentResult(task.id, task.family, status, grade.score, grade.details, c["steps"], c["tool_calls"],
                      c["format_errors"], c["prompt_tokens"], c["completion_tokens"], c["peak"],
                      approx_tokens(messages_text(history)), round(c["cost"], 6) if cost_known else None,  # type: ignore[arg-type]
                      round(wall_s, 3), 0, str(exit_extra.get("submission") or "") if submitted else None, str(out),
                      "provider-usage", error)
    w.write({"type": "result", **res.to_dict()})
    return res
