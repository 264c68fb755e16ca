"""The agent loop: model call -> tool calls -> observations, until submit or a limit.

Every step is appended to the trajectory before the next model call; every exit (submitted
or not) grades the environment's current state, so a run that hits a limit is still scored
on the diff it left. Model mistakes (bad JSON, unknown tool, missing argument, a reply with
no tool call, any `ToolError`) come back to the model as tool results and count toward the
consecutive format-error cap; harness failures end the run with `environment_error` or
`api_error`. A tool that raises anything but `ToolError` failed in the harness: its step is
recorded, then the run ends with `environment_error` and is graded like any other exit.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agents import textproto
from agents.config import AgentConfig, AgentResult
from agents.context import ContextPolicy, summary_request
from agents.env import Environment, Grade
from agents.errors import AgentHarnessError, EnvironmentFailure, ToolError, ToolFormatError
from agents.protocol import BackendError, ChatModel, ToolCall
from agents.task import AgentTask
from agents.tokens import MessageCounter, counter_for
from agents.trajectory import SCHEMA, TrajectoryWriter, read_trajectory
from msa_common import __version__

SYSTEM = ("You are an autonomous software agent working in a repository or tool environment. "
          "Act only through the tools. Make one or a few tool calls per reply. Call submit when done.")


class AgentLoop:
    def __init__(self, task: AgentTask, env: Environment, backend: ChatModel, config: AgentConfig, trajectory: Path):
        self.task, self.env, self.backend, self.cfg = task, env, backend, config
        self.path = Path(trajectory)
        self.lim = config.limits
        self.policy = ContextPolicy(config.context_policy)
        self._count_text, self.counting = counter_for(backend)
        self._count = MessageCounter(self._count_text)
        self.specs = env.tool_specs()

    # -- public ---------------------------------------------------------------
    def run(self, resume: bool = False) -> AgentResult:
        """Run (or continue, with `resume=True`, the trajectory at `self.path`) to an exit."""
        st = _State()
        if resume and self.path.exists():
            done = self._load(st)
            if done is not None:
                return done
        else:
            self.writer = TrajectoryWriter(self.path)
            self.history = self._initial_messages()
            self.n_initial = len(self.history)
            self.writer.write({"type": "header", "schema": SCHEMA, "harness_version": __version__,
                               "task": {"id": self.task.id, "family": self.task.family,
                                        "hash": self.task.content_hash(), "knobs": self.task.knobs},
                               "config": self.cfg.to_dict(), "config_hash": self.cfg.hash(),
                               "backend": _describe(self.backend), "token_counting": self.counting,
                               "tools": [t["function"]["name"] for t in self.specs], "messages": self.history,
                               "started_at": time.time()})
        t_start = time.monotonic() - st.elapsed
        status, error = ("submitted" if st.submitted else None), None
        while status is None:
            status = self._limit_status(st, time.monotonic() - t_start)
            if status:
                break
            try:
                status = self._step(st, t_start)
            except BackendError as e:
                status, error = ("context_overflow" if _is_context_error(e) else "api_error"), str(e)
            except AgentHarnessError as e:
                status, error = "environment_error", str(e)
            except Exception as e:  # noqa: BLE001 - a harness bug still ends in a named, graded exit
                status, error = "environment_error", f"{type(e).__name__}: {e}"
        return self._finish(st, status, error, time.monotonic() - t_start)

    # -- one step -------------------------------------------------------------
    def _step(self, st: _State, t_start: float) -> str | None:
        view, events = self.policy.view(self.history, self.n_initial, self._count, self.lim.context_window,
                                        self._summarize)
        for ev in events:
            st.events += 1
            self.writer.write({"type": "event", "step": st.steps, **ev})
        ctx = self._count(view)
        if ctx > self.lim.context_window:
            return "context_overflow"
        native = self.cfg.tool_mode == "native"
        t0 = time.monotonic()
        resp = self.backend.chat(view, tools=self.specs if native else None, max_tokens=self.lim.max_output_tokens,
                                 temperature=self.cfg.temperature, seed=self.cfg.seed)
        latency = time.monotonic() - t0
        st.steps += 1
        prompt_tokens = resp.prompt_tokens if resp.prompt_tokens is not None else ctx
        completion_tokens = (resp.completion_tokens if resp.completion_tokens is not None
                             else self._count_text(resp.content or ""))
        st.prompt_tokens += prompt_tokens
        st.completion_tokens += completion_tokens
        st.cost += resp.cost_usd or 0.0
        st.peak = max(st.peak, prompt_tokens)
        calls, parse_error = list(resp.tool_calls), None
        from_text = False
        if not calls:
            calls, parse_error = textproto.parse_text_calls(resp.content, st.steps)
            from_text = bool(calls) or parse_error is not None
        new_msgs, observations, step_format_error = self._execute(st, resp, calls, parse_error, native)
        st.consecutive_format_errors = st.consecutive_format_errors + 1 if step_format_error else 0
        st.format_errors += int(step_format_error)
        record = {"type": "step", "step": st.steps, "context_tokens": ctx, "view_messages": len(view),
                  "response": {"content": resp.content, "finish_reason": resp.finish_reason,
                               "tool_calls": [vars(c) for c in calls], "parsed_from_text": from_text},
                  "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "cost_usd": resp.cost_usd, "reported": resp.prompt_tokens is not None},
                  "latency_s": round(latency, 4), "messages": new_msgs, "observations": observations,
                  "format_error": step_format_error, "elapsed_s": round(time.monotonic() - t_start, 3),
                  "counters": st.counters()}
        cp = self.env.checkpoint()
        if cp != st.last_checkpoint:
            record["checkpoint"] = st.last_checkpoint = cp
        self.history.extend(new_msgs)
        self.writer.write(record)
        if st.harness_error:
            raise EnvironmentFailure(st.harness_error)
        if st.submitted:
            return "submitted"
        if st.consecutive_format_errors >= self.lim.max_consecutive_format_errors:
            return "format_errors"
        return None

    def _execute(self, st, resp, calls: list[ToolCall], parse_error: str | None, native: bool):
        """Run the tool calls; returns (messages to append, observation records, format error?)."""
        native_calls = native and bool(resp.tool_calls)
        assistant: dict[str, Any] = {"role": "assistant", "content": resp.content or ""}
        if native_calls:
            assistant["tool_calls"] = [{"id": c.id, "type": "function",
                                        "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        msgs = [assistant]
        obs: list[dict[str, Any]] = []
        format_error = False
        if not calls:
            format_error = True
            why = parse_error or ("your reply was cut off at the token limit; reply with a shorter tool call"
                                  if resp.finish_reason == "length"
                                  else "your reply contained no tool call; call a tool (or submit)")
            msgs.append({"role": "user", "content": f"error: {why}"})
            obs.append({"name": None, "ok": False, "error": why})
            return msgs, obs, format_error
        for c in calls:
            if st.submitted or st.harness_error:
                out, ok, err = f"ignored: {'already submitted' if st.submitted else 'the harness failed'}", False, None
            else:
                out, ok, err = self._call_one(st, c)
                format_error |= err == "format"
            out = _clip(out, self.lim.max_observation_chars)
            msgs.append({"role": "tool", "tool_call_id": c.id, "content": out} if native_calls
                        else textproto.result_message(c.name, out))
            obs.append({"tool_call_id": c.id, "name": c.name, "ok": ok, "error": err, "output_chars": len(out)})
        if parse_error:
            format_error = True
            msgs.append({"role": "user", "content": f"error: {parse_error}"})
        return msgs, obs, format_error

    def _call_one(self, st, c: ToolCall) -> tuple[str, bool, str | None]:
        try:
            args = json.loads(c.arguments) if c.arguments and c.arguments.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except (json.JSONDecodeError, ValueError) as e:
            return f"error: arguments of {c.name!r} are not a valid JSON object ({e}); resend the call", False, "format"
        st.tool_calls += 1
        if c.name == "submit":
            st.submitted, st.answer = True, str(args.get("answer", "") or "")
            return "submitted", True, None
        try:
            return self.env.call(c.name, args), True, None
        except ToolFormatError as e:
            return f"error: {e}", False, "format"
        except ToolError as e:
            return f"error: {e}", False, "tool"
        except Exception as e:  # noqa: BLE001 - not the model's mistake: the step is recorded, then the run ends
            why = str(e) if isinstance(e, AgentHarnessError) else f"{type(e).__name__}: {e}"
            st.harness_error = f"tool {c.name!r} failed in the harness: {why}"
            return f"error: the harness failed running {c.name!r}; the run ends here", False, "harness"

    # -- limits, exit, resume -------------------------------------------------
    def _limit_status(self, st, elapsed: float) -> str | None:
        if st.steps >= self.lim.max_steps:
            return "step_limit"
        if self.lim.max_total_tokens and st.prompt_tokens + st.completion_tokens >= self.lim.max_total_tokens:
            return "token_limit"
        if self.lim.max_cost_usd is not None and st.cost >= self.lim.max_cost_usd:
            return "cost_limit"
        if self.lim.max_wall_s is not None and elapsed >= self.lim.max_wall_s:
            return "wall_time_limit"
        return None

    def _finish(self, st, status: str, error: str | None, wall: float) -> AgentResult:
        try:
            grade = self.env.grade(st.answer if st.submitted else None)
        except Exception as e:  # noqa: BLE001 - a grading crash is an environment error, scored 0
            grade, status, error = Grade(0.0, {"error": f"{type(e).__name__}: {e}"}), "environment_error", str(e)
        res = AgentResult(self.task.id, self.task.family, status, grade.score, grade.details, st.steps,
                          st.tool_calls, st.format_errors, st.prompt_tokens, st.completion_tokens, st.peak,
                          self._count(self.history), round(st.cost, 6), round(wall, 3), st.events,
                          st.answer if st.submitted else None, str(self.path), self.counting, error)
        self.writer.write({"type": "result", **res.to_dict()})
        return res

    def _load(self, st) -> AgentResult | None:
        t = read_trajectory(self.path, repair=True)
        if t.header["task"]["hash"] != self.task.content_hash():
            raise AgentHarnessError(f"{self.path} was written for a different version of task {self.task.id}; "
                                    "rerun without resume")
        if t.result is not None:
            return AgentResult(**{k: v for k, v in t.result.items() if k != "type"})
        self.writer = TrajectoryWriter(self.path, append=True)
        self.history, self.n_initial = t.history(), len(t.header["messages"])
        self.policy.restore(t.events)
        cp = t.last_checkpoint()
        if cp is not None:
            self.env.restore(cp)
            st.last_checkpoint = cp
        if t.steps:
            st.load(t.steps[-1]["counters"], t.steps[-1]["elapsed_s"])
        st.events = len(t.events)
        for s in t.steps:  # a crash between the submit step and the result line
            # strict=False: a step without a tool call records one observation (the format error)
            for call, ob in zip(s["response"]["tool_calls"], s["observations"], strict=False):
                if call["name"] == "submit" and ob.get("ok"):
                    st.submitted, st.answer = True, json.loads(call["arguments"] or "{}").get("answer", "") or ""
        if hasattr(self.backend, "on_resume"):
            self.backend.on_resume(t.steps)
        return None

    def _initial_messages(self) -> list[dict[str, Any]]:
        system = SYSTEM
        if self.cfg.tool_mode == "text":
            system += "\n\n" + textproto.protocol_prompt(self.specs)
        return [{"role": "system", "content": system}, {"role": "user", "content": self.task.instruction}]

    def _summarize(self, view: list[dict[str, Any]]) -> str:
        resp = self.backend.chat(summary_request(view), tools=None, max_tokens=self.lim.max_output_tokens,
                                 temperature=self.cfg.temperature, seed=self.cfg.seed)
        return resp.content or ""


class _State:
    def __init__(self) -> None:
        self.steps = self.tool_calls = self.format_errors = self.consecutive_format_errors = 0
        self.prompt_tokens = self.completion_tokens = self.peak = self.events = 0
        self.cost = self.elapsed = 0.0
        self.submitted = False
        self.answer: str | None = None
        self.last_checkpoint: dict[str, Any] | None = None
        self.harness_error: str | None = None  # set when a tool failed for a reason that is not the model's

    def counters(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("steps", "tool_calls", "format_errors", "consecutive_format_errors",
                                              "prompt_tokens", "completion_tokens", "peak", "cost")}

    def load(self, c: dict[str, Any], elapsed: float) -> None:
        for k, v in c.items():
            setattr(self, k, v)
        self.elapsed = elapsed


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n // 2] + f"\n...[{len(text) - n} chars elided]...\n" + text[-n // 2:]


def _is_context_error(e: Exception) -> bool:
    s = str(e).lower()
    return "context" in s and ("length" in s or "too long" in s or "exceed" in s)


def _describe(backend: Any) -> dict[str, Any]:
    try:
        return backend.describe()
    except Exception as e:  # noqa: BLE001 - a description is informational: its failure is recorded
        return {"name": getattr(backend, "name", "?"), "describe_error": str(e)}

