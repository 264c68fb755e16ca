"""Real-data loaders: HELMET's JSON-KV files (`data/json_kv/test_k*_dep6.jsonl`: context,
question, answer), RULER's pre-generated files (`data/ruler/<task>/validation_<L>.jsonl`:
input, outputs, optional answer_prefix) and LongBench-v2's `data.json` (context, question,
choice_A..choice_D, answer letter). Each file is JSON lines, a JSON array or parquet, read by
`datasets` (`tasks.loaders.rows`); rows are read in file order (sample i = row i).

HELMET and LongBench-v2 rows are fitted to the target length by context-only truncation (HELMET's
policy, counted in `truncated_tokens`; LongBench-v2's own script cuts the middle of the whole prompt
instead); RULER inputs are whole prompts generated for one length, so a row longer than the target is
refused rather than cut."""
from __future__ import annotations

import re
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, TaskError, failed_score
from tasks.common import after_prefix, finish, first_line
from tasks.fitting import Fit, count_tokens, truncate_context
from tasks.loaders.rows import read_rows
from tasks.metrics import exact_match, ruler_recall, substring_exact_match


class _FileTask(Task):
    fidelity = "real-data"

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def _row(self, index: int) -> dict[str, Any]:
        if not self.path:
            raise TaskError(f"task {self.name} needs options: {{path: FILE}} in the suite file")
        rows = read_rows(str(self.path))
        if index >= len(rows):
            raise TaskError(f"{self.path} has {len(rows)} rows; ask for at most that many samples")
        return rows[index]

    def _fields(self, row: dict[str, Any], index: int, names: tuple[str, ...], kind: str) -> None:
        for k in names:
            if row.get(k) is None:
                raise TaskError(f"{self.path}: row {index} has no '{k}' field (not a {kind} file)")


class HelmetJsonKVFile(_FileTask):
    name = "helmet_json_kv_file"
    category = "recall"
    metric = "subem"
    max_tokens = 100
    description = "HELMET's own json_kv data file (options.path), context-only truncation to the length"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        row = self._row(index)
        self._fields(row, index, ("context", "question", "answer"), "HELMET json_kv")
        question = row["question"]
        parts = PromptParts(
            "", row["context"],
            f"\n\nExtract the value corresponding to the specified key in the JSON object below."
            f"\n\nKey: {question}", "Corresponding value:")
        budget = self.budget(spec)
        parts, dropped = truncate_context(parts, spec.mode, spec.tokenizer, spec.target_length - budget)
        fit = Fit(parts, int(row.get("num_kvs") or 0), 0, count_tokens(parts, spec.mode, spec.tokenizer))
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
        self._fields(row, index, ("input", "outputs"), "RULER")
        parts = PromptParts("", row["input"], "", (row.get("answer_prefix") or "").strip())
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


class LongBenchV2File(_FileTask):
    name = "longbench_v2_file"
    category = "longqa"
    metric = "exact_match"
    max_tokens = 128
    description = "LongBench-v2's data.json (options.path): four-choice questions, its zero-shot prompt and parse"
    _FIELDS = ("context", "question", "choice_A", "choice_B", "choice_C", "choice_D", "answer")

    def build(self, index: int, spec: BuildSpec) -> Sample:
        row = self._row(index)
        self._fields(row, index, self._FIELDS, "LongBench-v2")
        choices = "\n".join(f"({c}) {row['choice_' + c]}" for c in "ABCD")
        parts = PromptParts(
            "Please read the following text and answer the question below.\n\n<text>\n", row["context"],
            f"\n</text>\n\nWhat is the correct answer to this question: {row['question']}\nChoices:\n{choices}"
            f"\n\nFormat your response as follows: \"The correct answer is (insert answer here)\".")
        budget = self.budget(spec)
        parts, dropped = truncate_context(parts, spec.mode, spec.tokenizer, spec.target_length - budget)
        fit = Fit(parts, 0, 0, count_tokens(parts, spec.mode, spec.tokenizer))
        s = finish(self, index, spec, fit, [str(row["answer"]).strip()], seed=index, source=str(self.path))
        s.metadata |= {"truncated_tokens": dropped, "difficulty": row.get("difficulty"), "length": row.get("length"),
                       "domain": row.get("domain")}
        return s

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        """LongBench-v2's parse: the letter in "The correct answer is (X)", else "The correct answer is X"."""
        if not output or not output.strip():
            return failed_score(self.metric)
        text = output.replace("*", "")
        m = (re.search(r"The correct answer is \(([A-D])\)", text)
             or re.search(r"The correct answer is ([A-D])", text))
        parsed = m.group(1) if m else None
        return {"score": exact_match(parsed, sample.answers) if parsed else 0.0,
                "metric": self.metric, "parsed": parsed, "extraction_failed": parsed is None}
