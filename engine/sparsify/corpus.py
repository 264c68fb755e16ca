"""Calibration text for `sparsify`: an offline corpus found on this machine, or the user's files.

* built-in (no `--data`): the Python standard library's `.py` sources (code) interleaved with the
  long descriptions of the installed packages' metadata (prose, mostly README markdown);
* `--data PATH...`: text files (any extension), folders of them (recursively), `.jsonl` files (the
  `text` field, else the first string field of each line), or a `datasets` dataset saved with
  `save_to_disk` (a folder with `dataset_info.json` or `state.json`; column `text`).
Documents are shuffled with the seed, joined with blank lines, tokenized and cut into sequences.
Never the evaluation tasks' generators.
"""
from __future__ import annotations

import json
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from engine.errors import EngineError


class CorpusError(EngineError):
    """Calibration data that cannot be read or is too small."""


@dataclass
class Document:
    source: str  # a short provenance label
    text: str


def stdlib_documents() -> list[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for p in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "test" in p.parts[-2:-1] or p.name.startswith("test_"):
            continue
        try:
            docs.append(Document(f"stdlib:{p.relative_to(root)}", p.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return docs


def package_descriptions(min_chars: int = 2000) -> list[Document]:
    seen, docs = set(), []
    for dist in metadata.distributions():
        name = dist.metadata.get("Name") or "?"
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if isinstance(body, str) and len(body) >= min_chars:
            docs.append(Document(f"pkg:{name}", body))
    return sorted(docs, key=lambda d: d.source)


def builtin_documents(seed: int) -> list[Document]:
    code, prose = stdlib_documents(), package_descriptions()
    if not code and not prose:
        raise CorpusError("no offline corpus found (no stdlib sources, no package descriptions): pass --data PATH")
    rng = random.Random(seed)
    rng.shuffle(code)
    rng.shuffle(prose)
    out = []
    for i in range(max(len(code), len(prose))):  # alternate prose and code
        out += ([prose[i]] if i < len(prose) else []) + ([code[i]] if i < len(code) else [])
    return out


def _jsonl_texts(p: Path) -> Iterator[str]:
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise CorpusError(f"{p}:{n} is not valid JSON: give one JSON object per line") from None
        text = obj.get("text") if isinstance(obj, dict) else None
        if not isinstance(text, str) and isinstance(obj, dict):
            text = next((v for v in obj.values() if isinstance(v, str)), None)
        if isinstance(text, str) and text.strip():
            yield text


def _dataset_texts(p: Path) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise CorpusError(f"{p} looks like a saved `datasets` dataset but `datasets` is not installed: "
                          "pip install datasets") from None
    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[sorted(ds.keys())[0]]
    if "text" not in ds.column_names:
        raise CorpusError(f"dataset {p} has no 'text' column (columns: {ds.column_names}): add one")
    yield from (t for t in ds["text"] if isinstance(t, str) and t.strip())


def user_documents(paths: list[str], seed: int) -> list[Document]:
    docs: list[Document] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            raise CorpusError(f"--data {raw} does not exist: pass text files, .jsonl files, folders or a saved dataset")
        if p.is_dir() and ((p / "dataset_info.json").is_file() or (p / "state.json").is_file()
                           or (p / "dataset_dict.json").is_file()):
            docs += [Document(f"dataset:{p.name}", t) for t in _dataset_texts(p)]
        elif p.is_dir():
            for f in sorted(x for x in p.rglob("*") if x.is_file()):
                docs += user_documents([str(f)], seed) if f.suffix == ".jsonl" else _text_file(f)
        elif p.suffix == ".jsonl":
            docs += [Document(f"jsonl:{p.name}", t) for t in _jsonl_texts(p)]
        else:
            docs += _text_file(p)
    if not docs:
        raise CorpusError(f"no text found in --data {' '.join(paths)}")
    random.Random(seed).shuffle(docs)
    return docs


def _text_file(p: Path) -> list[Document]:
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []  # binary files inside a folder are skipped
    return [Document(f"file:{p.name}", text)] if text.strip() else []


def token_sequences(docs: list[Document], tokenizer, n_seqs: int, seq_len: int) -> tuple[list[list[int]], list[str]]:
    """Tokenize documents in order until `n_seqs` sequences of `seq_len` tokens are filled.

    Returns the sequences and the sources used. Raises when the corpus is too small."""
    need = n_seqs * seq_len
    ids: list[int] = []
    used: list[str] = []
    for d in docs:
        ids += tokenizer.encode(d.text + "\n\n", add_special_tokens=False)
        used.append(d.source)
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise CorpusError(f"the calibration data has {len(ids)} tokens, {need} are needed "
                          f"({n_seqs} x {seq_len}): add --data or lower --tokens / --seq-len")
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(n_seqs)], used


def with_recurrences(ids: list[int], share: float, seed: int, min_gap: int,
                     span: tuple[int, int] = (16, 64)) -> list[int]:
    """A copy of `ids` in which about `share` of the tokens are overwritten by copies of earlier
    spans of the same sequence (span lengths uniform in `span`, each copy at least `min_gap` tokens
    after its source; no copy overwrites another copy or a span already copied from). Built from the
    calibration text itself, it gives the indexer long-range look-ups to learn: inside a copy,
    induction / retrieval heads read the source span far back, as they read a needle."""
    lo, hi = span
    n = len(ids)
    out = list(ids)
    if share <= 0 or n < min_gap + 2 * hi:
        return out
    rng = random.Random(seed)
    taken = bytearray(n)
    budget, copied = int(share * n), 0
    for _ in range(100 * max(1, budget // lo)):
        if copied >= budget:
            break
        length = rng.randint(lo, hi)
        t = rng.randint(min_gap + length, n - length)
        if any(taken[t:t + length]):
            continue
        s = rng.randint(0, t - min_gap - length)
        out[t:t + length] = out[s:s + length]
        taken[t:t + length] = b"\x01" * length  # neither a later target nor overwritten later
        taken[s:s + length] = b"\x01" * length
        copied += length
    return out
