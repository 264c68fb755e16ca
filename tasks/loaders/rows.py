"""The rows of a data file on disk, read by Hugging Face `datasets` (the data layer of the loaders).

`read_rows(path)`: `datasets.load_dataset(fmt, data_files=path, split="train")` with the format taken from
the suffix (`.jsonl` / `.json`: JSON lines or one JSON array, as HELMET, RULER and LongBench-v2 ship
them; `.parquet`), rows as plain dicts in file order. A field missing from some rows reads as None
there (the columns are the union over rows). `datasets` keeps an Arrow copy in its cache
(`HF_DATASETS_CACHE`), keyed by the file's path, size and modification time, so a changed file is read
again. Every fault is a `TaskError` of one line naming the file and what to do.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from tasks.base import TaskError

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bars and no log lines while reading one file (the run shows its own progress; a fault is
    our one line), both restored afterwards."""
    shown, level = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if shown:
            datasets.enable_progress_bars()


@lru_cache(maxsize=8)
def read_rows(path: str) -> tuple[dict[str, Any], ...]:
    p = Path(path).expanduser()
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise TaskError(f"data file {p} has an unknown suffix: give a {', '.join(FORMATS)} file")
    if not p.is_file():
        raise TaskError(f"data file {p} not found: put the HELMET/RULER/LongBench-v2 file there or fix options.path")
    if p.stat().st_size == 0:
        raise TaskError(f"{p} holds no rows")
    import datasets

    try:
        with _quiet(datasets):
            rows = datasets.load_dataset(fmt, data_files=str(p), split="train").to_list()
    except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise many types for one damaged file
        cause = e.__cause__ or e
        why = " ".join(str(cause).split())[:160]  # one line
        raise TaskError(f"{p} cannot be read as {fmt} ({type(cause).__name__}: {why}): "
                        f"the file is damaged or not {fmt}; fetch it again") from None
    if not rows:
        raise TaskError(f"{p} holds no rows")
    return tuple(rows)
