"""Real-data loaders: HELMET's JSON-KV files (`data/json_kv/test_k*_dep6.jsonl`: context,
question, answer) and RULER's pre-generated files (`data/ruler/<task>/validation_<L>.jsonl`:
input, outputs, optional answer_prefix). Rows are read in file order (sample i = row i).

HELMET rows are fitted to the target length by context-only truncation (HELMET's policy,
counted in `truncated_tokens`); RULER inputs are whole prompts generated for one length, so
a row longer than the target is refused rather than cut."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, TaskError, failed_score
from tasks.common import after_prefix, finish, first_line
from tasks.fitting import Fit, count_tokens, truncate_context
from tasks.metrics import ruler_recall, substring_exact_match


@lru_cache(maxsize=8)
def read_jsonl(path: str) -> tuple[dict[str, Any], ...]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise TaskError(f"data file {p} not found: put the HELMET/RULER file there or fix options.path")
    rows = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise TaskError(f"{p}:{i} is not valid JSON: the file is damaged") from None
    if not rows:
        raise TaskError(f"{p} holds no rows")
    return tuple(rows)


class _FileTask(Task):
    fidelity = "real-data"

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def _row(self, index: int) -> dict[str, Any]:
        if not self.path:
            raise TaskError(f"task {self.name} needs options: {{path: FILE}} in the suite file")
        rows = read_jsonl(str(self.path))
        if index >= len(rows):
            raise TaskError(f"{self.path} has {len(rows)} rows; ask for at most that many samples")
        return rows[index]


class HelmetJsonKVFile(_FileTask):
    name = "helmet_json_kv_file"
    category = "recall"
    metric = "subem"
    max_tokens = 100
    description = "HELMET's own json_kv data file (options.path), context-only truncation to the length"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        row = self._row(index)
        for k in ("context", "question", "answer"):
            if k not in row:
                raise TaskError(f"{self.path}: row {index} has no '{k}' field (not a HELMET json_kv file)")
        question = row["question"]
        parts = PromptParts(
            "", row["context"],
            f"\n\nExtract the value corresponding to the specified key in the JSON object below."
            f"\n\nKey: {question}", "Corresponding value:")
        budget = self.budget(spec)
        parts, dropped = truncate_context(parts, spec.mode, spec.tokenizer, spec.target_length - budget)
        fit = Fit(parts, int(row.get("num_kvs", 0)), 0, count_tokens(parts, spec.mode, spec.tokenizer))
        answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
        s = finish(self, index, spec, fit, [str(a) for a in answers], seed=index, source=str(self.path))
        s.metadata["truncated_tokens"] = dropped
        return s

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        parsed = first_line(after_prefix(output, "Corresponding value:"))
        return {"score": substring_exact_match(output, sample.answers), "metric": self.metric,
                "parsed": parsed or None, "extraction_failed": not parsed}


class RulerFile(_FileTask):
    name = "ruler_file"
    category = "recall"
    metric = "ruler_recall"
    max_tokens = 128
    description = "a RULER validation_<L>.jsonl file (options.path), scored by RULER recall"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        row = self._row(index)
        if "input" not in row or "outputs" not in row:
            raise TaskError(f"{self.path}: row {index} lacks 'input'/'outputs' (not a RULER file)")
        parts = PromptParts("", row["input"], "", row.get("answer_prefix", "").strip())
        n = count_tokens(parts, spec.mode, spec.tokenizer)
        if n + self.budget(spec) > spec.target_length:
            raise TaskError(
                f"{self.path} row {index} has {n} prompt tokens, more than length "
                f"{spec.target_length} allows: use the file generated for this length")
        s = finish(self, index, spec, Fit(parts, 0, 0, n), [str(o) for o in row["outputs"]],
                   seed=index, source=str(self.path))
        return s

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        parsed = first_line(after_prefix(output, sample.metadata.get("answer_prefix", "")))
        return {"score": ruler_recall(output, sample.answers), "metric": self.metric,
                "parsed": parsed or None, "extraction_failed": not parsed}
