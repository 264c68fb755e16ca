"""One of our tasks as an inspect-ai task, scored with our metric: `inspect eval` drives any
OpenAI-compatible server (`msa-eval serve`, vLLM, ...) on the prompts `msa-eval run` sends.

    MSA_BASE_URL=http://127.0.0.1:8000/v1 MSA_API_KEY=unused \\
      inspect eval msa_eval/inspect_task.py --model openai-api-completions/msa/smollm2-135m \\
      -T task=niah_single -T length=1k -T samples=3

The samples are those of `msa-eval run SUITE --tasks TASK --lengths LENGTH --samples N --seed SEED
--mode MODE --backend openai` (same generator, seed and reference tokenizer; a suite's per-task
max_tokens is `-T max_tokens=N` here), and each request is
the one our openai backend sends for it (`msa_eval.runner.requests.to_request`: greedy, the task's
max_tokens and stop, the sample's seed). How a prompt goes out decides inspect's provider:
- a plain chat (`prompt_format` "chat": HELMET's chat tasks such as json_kv) goes as messages:
  `openai-api/SERVICE/MODEL` (inspect's OpenAI-compatible chat provider);
- text (completion mode, or a chat ending with an assistant prefill, as the niah tasks do: the
  reference tokenizer's chat template plus the prefill, "chat-prefill-ref") goes to /v1/completions:
  `openai-api-completions/SERVICE/MODEL`. Right only when the server serves the reference model
  (the same limit as `msa-eval run --backend openai`).
A sample sent through the other kind of provider fails with one line naming the right one.
SERVICE is any name; inspect reads `<SERVICE>_BASE_URL` and `<SERVICE>_API_KEY`. Give the file's
path relative to the working directory: inspect-ai 0.3.285 refuses an absolute task path.

The scorer is the task's own (`Sample.score`): its value is our headline score (0-1) under the
scorer named after our metric, with `parsed` as the answer and every metric in the metadata.
"""
from __future__ import annotations

from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset
from inspect_ai.dataset import Sample as InspectSample
from inspect_ai.model import ChatMessage, ChatMessageAssistant, ChatMessageSystem, ChatMessageUser, ModelName, get_model
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver

from msa_eval.runner.config import Mode, parse_lengths
from msa_eval.runner.plan import make_task
from msa_eval.runner.reference import load_reference_tokenizer
from msa_eval.runner.requests import to_request
from tasks.base import BuildSpec
from tasks.base import Sample as OurSample

_ROLES = {"system": ChatMessageSystem, "user": ChatMessageUser, "assistant": ChatMessageAssistant}


@task
def msa_eval(task: str = "niah_single", length: str | int = "1k", samples: int = 3, seed: int = 42,
             mode: Mode = "chat", max_tokens: int | None = None, tokenizer: str = "smollm2-135m") -> Task:
    """`samples` samples of our `task` at one target `length` (e.g. 1k), built with the reference
    `tokenizer` (msa-eval run's default for openai backends) and scored with the task's metric."""
    (target,) = parse_lengths(str(length))
    ours = make_task(task, {})
    tok, _info = load_reference_tokenizer(tokenizer)
    built = list(ours.samples(BuildSpec(target, tok, mode, seed, max_tokens), samples))
    return Task(dataset=MemoryDataset([_inspect_sample(s, tok) for s in built], name=f"{task}/{target}"),
                solver=_send_as_msa_eval_run(), scorer=_our_metric(ours.metric, {s.id: s for s in built}),
                name=task)


def _inspect_sample(s: OurSample, tok: Any) -> InspectSample:
    request, prompt_format = to_request(s, None, tok)
    chat: list[ChatMessage] = [_ROLES[m["role"]](content=m.get("content") or "") for m in request.messages or []]
    prompt: str | list[ChatMessage] = request.prompt if request.prompt is not None else chat
    # the task's own metadata (target_length, depth, ...; its 64-bit sample seed left out), then how it is sent
    meta = {k: v for k, v in s.metadata.items() if k != "seed"} | {
        "task": s.task, "category": s.category, "prompt_hash": s.prompt_hash(), "prompt_format": prompt_format,
        "max_tokens": request.max_tokens, "stop": request.stop, "seed": request.seed}
    return InspectSample(input=prompt, target=list(s.answers), id=s.id, metadata=meta)


@solver
def _send_as_msa_eval_run() -> Solver:
    """Generate with the request our openai backend sends for the sample: greedy, its max_tokens,
    stop and seed; text prompts only through a /v1/completions provider, chats only through a chat one."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        m = state.metadata
        api = ModelName(get_model()).api
        completions = api.endswith("-completions")
        if (m["prompt_format"] != "chat") != completions:
            kind, want = (("text", "openai-api-completions/SERVICE/MODEL") if m["prompt_format"] != "chat"
                          else ("chat messages", "openai-api/SERVICE/MODEL"))
            raise ValueError(f"sample {state.sample_id} goes out as {kind} ({m['prompt_format']}), which {api} "
                             f"does not send as msa-eval run does: use --model {want}")
        return await generate(state, temperature=0.0, max_tokens=m["max_tokens"], stop_seqs=m["stop"] or None,
                              seed=m["seed"])

    return solve


def _our_metric(metric: str, by_id: dict[str, OurSample]) -> Scorer:
    @scorer(metrics=[mean(), stderr()], name=metric)
    def ours() -> Scorer:
        async def score(state: TaskState, target: Target) -> Score:
            out = state.output.completion
            d = by_id[str(state.sample_id)].score(out or None)
            extra = {k: v for k, v in d.items() if k not in ("score", "parsed")}
            return Score(value=float(d["score"]), answer=d.get("parsed"), metadata=extra)

        return score

    return ours()
