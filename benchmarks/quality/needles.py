"""Needle in a haystack on the default model under several attention settings, paired per sample.

Samples come from the runner's own generators (`tasks/helmet/recall_niah.py`: `niah_single`,
`niah_mk2`; chat mode, depths on the task's 11-point 0-100% grid; per-sample seeds hash (seed, task,
length, index), so a larger `n` keeps the first samples). Every setting generates greedily for the
same samples, with the task's token budget; a chat whose answer prefix opens the assistant turn is
sent as the templated text plus the prefix, as the runner sends it to a local backend. Scored by
RULER recall (`tasks.metrics.ruler_recall`).

Settings: `dense`, `msa` (the model's shipped indexer, B128/k16), `msa-b64k8` (the same projections
at block 64 / top-8), `msa-ref`, `msa-oracle` (the shipped budget, blocks chosen by true
attention mass), `NAME=ADAPTER_DIR` (`--attention msa` with that adapter, its own
B/k; `NAME=ADAPTER_DIR@b64k8` runs it at B 64 / k 8), `NAME=+` (the shipped indexer under that
name) and `NAME=+L1,L2` (the shipped indexer with layers L1, L2 also dense:
`engine.sparsify.subset.keep_dense`, byte for byte what `sparsify --dense-layers ...` trains).
Any setting with the suffix `@fp8` (`dense@fp8`, `msa@fp8`, `NAME=DIR@fp8`) runs on an FP8 (e4m3) KV cache
(`LLM(kv_cache_dtype="fp8")`), with `@fp8-hadamard` on the rotated one (`kv_cache_dtype="fp8-hadamard"`), and is
paired against the same setting without it (its `baseline`);
every other setting is paired against `dense`.
"""
from __future__ import annotations

import math
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

B64K8 = {"block_size": 64, "topk": 8}
BUILTIN = {"dense": ("dense", {}), "msa": ("msa", {}), "msa-b64k8": ("msa", B64K8), "msa-ref": ("msa-ref", {}),
           "msa-oracle": ("msa-oracle", {})}


@dataclass(frozen=True)
class Needles:
    """Build the samples, run every setting, score; `recall` > 0 also measures the attention-mass
    recall of each MSA setting on the first `recall` niah_single prompts of the longest length
    (reference path, every prompt position and query head, prefill only)."""

    settings: tuple[str, ...]
    n: int = 100
    seed: int = 42
    lengths: tuple[int, ...] = (4096, 8192)
    tasks: tuple[str, ...] = ("niah_single", "niah_mk2")
    recall: int = 4
    max_seqs: int = 64
    model: str = "smollm2-135m"
    topk: int | None = None  # every MSA setting at this top-k (a suite's `msa_overrides`); None: each its own


def shipped_adapter() -> Path:
    import engine

    return Path(engine.__file__).parent / "adapters" / "smollm2-135m"


def samples(cfg: Needles) -> list[dict]:
    from engine.loader import load_tokenizer
    from tasks.base import BuildSpec
    from tasks.registry import get_task

    tok = load_tokenizer(cfg.model, progress=False).tokenizer
    rows = []
    for name in cfg.tasks:
        task = get_task(name)
        for length in cfg.lengths:
            spec = BuildSpec(target_length=length, tokenizer=tok, mode="chat", seed=cfg.seed)
            for s in task.samples(spec, cfg.n):
                rows.append({"id": s.id, "task": name, "length": length, "messages": s.messages,
                             "answers": s.answers, "max_tokens": s.max_tokens, "depth": s.metadata.get("depth")})
    return rows


def to_prompt(messages: list[dict], tok) -> list[dict] | list[int]:
    """A chat as `generate` takes it; a chat ending with an assistant prefill as the token ids of the
    templated text + the prefill (`continue_chat_text`), as the runner sends it to a local backend."""
    from tasks.base import continue_chat_text, continues_assistant

    if not continues_assistant(messages):
        return messages
    return tok.encode(continue_chat_text(messages, tok), add_special_tokens=False)


KV_SUFFIXES = {"@fp8": "fp8", "@fp8-hadamard": "fp8-hadamard"}  # setting suffix -> LLM kv_cache_dtype


def _kv_suffix(spec: str) -> str | None:
    return next((s for s in KV_SUFFIXES if spec.endswith(s)), None)


def baseline(setting: str) -> str:
    """What a setting is paired against: its bf16 twin for an `@fp8` / `@fp8-hadamard` setting, else `dense`."""
    suffix = _kv_suffix(setting)
    return setting.split("=", 1)[0].removesuffix(suffix) if suffix else "dense"


def resolve_setting(model: str, spec: str, workdir: Path) -> tuple[str, str, str, dict, str]:
    """A setting spec -> (name, model for `LLM`, attention, MSA overrides, KV cache dtype)."""
    if suffix := _kv_suffix(spec):
        name, model, attention, over, _ = resolve_setting(model, spec.removesuffix(suffix), workdir)
        return name + suffix, model, attention, over, KV_SUFFIXES[suffix]
    if "=" not in spec:
        attention, over = BUILTIN[spec]
        return spec, model, attention, over, "auto"
    name, path = spec.split("=", 1)
    over = {}
    if path.endswith("@b64k8"):
        path, over = path[: -len("@b64k8")], B64K8
    if path == "+":  # the shipped indexer itself, under another name
        path = str(shipped_adapter())
    elif path.startswith("+"):  # the shipped indexer with more layers dense
        from engine.sparsify.subset import keep_dense

        out = workdir / name
        keep_dense(shipped_adapter(), [int(x) for x in path[1:].split(",")], out)
        path = str(out)
    return name, f"{model}+{path}", "msa", over, "auto"


def generate(model: str, attention: str, over: dict, rows: list[dict], max_seqs: int,
             kv_cache_dtype: str = "auto") -> tuple[list, float]:
    from engine import LLM, SamplingParams

    llm = LLM(model, attention=attention, msa_overrides=over or None, max_num_seqs=max_seqs,
              max_num_batched_tokens=16384, kv_cache_tokens=max_seqs * (max(r["length"] for r in rows) + 256),
              kv_cache_dtype=kv_cache_dtype, progress=False)
    t0 = time.time()
    outs = llm.generate([to_prompt(r["messages"], llm.tokenizer) for r in rows],
                        [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0) for r in rows])
    return outs, time.time() - t0


def recall_by_layer(model: str, over: dict, rows: list[dict]) -> dict[int, float]:
    from engine import LLM, SamplingParams

    top = max(r["length"] for r in rows)
    llm = LLM(model, attention="msa-ref", msa_overrides={"track_recall": True, **over}, max_num_seqs=4,
              max_num_batched_tokens=8192, kv_cache_tokens=4 * (top + 256), progress=False)
    llm.generate([to_prompt(r["messages"], llm.tokenizer) for r in rows], SamplingParams(max_tokens=1))
    return llm.engine.attention.recall_by_layer()


def run(cfg: Needles) -> list[dict]:
    """Rows: one `needle` row per (setting, sample), one `needle_wall` per setting, `recall` per
    (MSA setting, layer)."""
    import torch

    from tasks.metrics import ruler_recall

    data = samples(cfg)
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        for spec in cfg.settings:
            name, model, attention, over, kv = resolve_setting(cfg.model, spec, Path(d))
            if cfg.topk is not None and attention != "dense":
                over = {**over, "topk": cfg.topk}
            outs, wall = generate(model, attention, over, data, cfg.max_seqs, kv)
            out.append({"bench": "needle_wall", "setting": name, "samples": len(data), "wall_s": wall})
            print(out[-1], flush=True)
            out += [{"bench": "needle", "setting": name, "id": r["id"], "task": r["task"], "length": r["length"],
                     "depth": r["depth"], "answers": r["answers"], "output": o.text,
                     "prompt_tokens": len(o.prompt_token_ids), "density": o.metrics.get("attention_density"),
                     "score": ruler_recall(o.text, r["answers"])} for r, o in zip(data, outs, strict=True)]
            if cfg.recall and attention != "dense" and kv == "auto":
                probe = [r for r in data if r["task"] == "niah_single" and r["length"] == max(cfg.lengths)]
                probe = probe[: cfg.recall]
                by_layer = recall_by_layer(model, over, probe)
                out += [{"bench": "recall", "setting": name, "layer": k, "recall": v, "prompts": len(probe)}
                        for k, v in sorted(by_layer.items())]
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return out


# -- scoring ------------------------------------------------------------------------------------

def cells(rows: list[dict]) -> list[dict]:
    """One row per (task, length, setting): n, accuracy %, mean density, and for every setting but dense
    the gap to its `baseline` and the paired counts over the same samples (`dense_better`: the baseline
    right & the setting wrong; `setting_better`: the reverse) with the paired difference's 95% normal
    interval (points)."""
    rows = [r for r in rows if r["bench"] == "needle"]
    score = {(r["setting"], r["id"]): r["score"] for r in rows}
    group: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        group[(r["task"], r["length"], r["setting"])].append(r)
    settings = sorted(dict.fromkeys(r["setting"] for r in rows), key=lambda s: s != "dense")
    out = []
    for task, length in sorted({(r["task"], r["length"]) for r in rows}):
        for s in settings:
            g = group[(task, length, s)]
            dens = [r["density"] for r in g if r["density"] is not None]
            c = {"bench": "needle_cell", "task": task, "length": length, "setting": s, "n": len(g),
                 "acc": 100 * sum(r["score"] for r in g) / len(g), "density": sum(dens) / len(dens) if dens else None}
            base = group.get((task, length, baseline(s)), [])
            if s != "dense" and base:
                d = [score[(s, r["id"])] - score[(baseline(s), r["id"])] for r in base if (s, r["id"]) in score]
                mean = sum(d) / len(d)
                sd = math.sqrt(sum(x * x for x in d) / len(d) - mean * mean)
                c.update(gap=100 * mean, dense_better=sum(x < 0 for x in d), setting_better=sum(x > 0 for x in d),
                         ci95=100 * 1.96 * sd / math.sqrt(len(d)))
            out.append(c)
    return out


def best_setting(cell_rows: list[dict], among: list[str]) -> str:
    """The setting of `among` with the highest accuracy summed over all cells (the first listed wins ties)."""
    total = {s: sum(c["acc"] for c in cell_rows if c["setting"] == s) for s in among}
    return max(among, key=lambda s: total[s])


def markdown(rows: list[dict]) -> list[str]:
    cs = cells(rows)
    if not cs:
        return []
    settings = list(dict.fromkeys(c["setting"] for c in cs))
    sparse = [s for s in settings if s != "dense"]
    by = {(c["task"], c["length"], c["setting"]): c for c in cs}
    keys = sorted({(c["task"], c["length"]) for c in cs})

    def fmt(v: float | None, f: str) -> str:
        return format(v, f) if v is not None else "-"

    out = ["| task | length | n | " + " | ".join(f"{s} acc" for s in settings) + " | "
           + " | ".join(f"{s} - {baseline(s)}" for s in sparse) + " | "
           + " | ".join(f"{s} density" for s in sparse) + " |",
           "|" + " --- |" * (3 + len(settings) + 2 * len(sparse))]
    for t, n in keys:
        c = {s: by[(t, n, s)] for s in settings if (t, n, s) in by}
        out.append(f"| {t} | {n} | {c[settings[0]]['n']} | " + " | ".join(fmt(c[s]["acc"], ".1f") for s in settings)
                   + " | " + " | ".join(fmt(c[s].get("gap"), "+.1f") for s in sparse) + " | "
                   + " | ".join(fmt(c[s]["density"], ".3f") for s in sparse) + " |")
    paired = [s for s in sparse if baseline(s) in settings]  # (an msa / msa@fp8 run pairs without dense)
    if paired:
        out += ["", "| task | length | " + " | ".join(f"{s}: {baseline(s)} better / {s} better (paired 95%)"
                                                   for s in paired)
                + " |", "|" + " --- |" * (2 + len(paired))]
        for t, n in keys:
            out.append(f"| {t} | {n} | " + " | ".join(
                f"{by[(t, n, s)]['dense_better']} / {by[(t, n, s)]['setting_better']} "
                f"({by[(t, n, s)]['gap']:+.0f} +- {by[(t, n, s)]['ci95']:.1f})" if "gap" in by.get((t, n, s), {})
                else "-" for s in paired) + " |")
    rec = [r for r in rows if r["bench"] == "recall"]
    if rec:
        names = list(dict.fromkeys(r["setting"] for r in rec))
        val = {(r["setting"], r["layer"]): r["recall"] for r in rec}
        layers = sorted({r["layer"] for r in rec})
        out += ["", f"Attention-mass recall, first {rec[0]['prompts']} niah_single prompts of the longest length:", "",
                "| layer | " + " | ".join(f"{s} recall" for s in names) + " |", "|" + " --- |" * (1 + len(names))]
        out += [f"| {k} | " + " | ".join(fmt(val.get((s, k)), ".3f") for s in names) + " |" for k in layers]
        means = [sum(v for (s2, _), v in val.items() if s2 == s) / sum(1 for s2, _ in val if s2 == s) for s in names]
        out.append("| **mean** | " + " | ".join(f"**{m:.3f}**" for m in means) + " |")
    wall = [r for r in rows if r["bench"] == "needle_wall"]
    out += ["", "Wall: " + ", ".join(f"{r['setting']} {r['wall_s']:.1f} s ({r['samples']} samples)" for r in wall)]
    return out
