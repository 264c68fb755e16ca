"""The agent batch's records file under a torn last line: the next record never glues onto it."""
from __future__ import annotations

import json

from agents.batch import _append_line, read_records


def test_a_record_appended_after_a_torn_line_stays_readable(tmp_path):
    p = tmp_path / "records.jsonl"
    p.write_bytes(b'{"task_id": "a", "status": "submitted"}\n{"task_id": "b", "sta')  # kill -9 mid-write
    _append_line(p, json.dumps({"task_id": "c", "status": "submitted"}) + "\n")
    assert [r["task_id"] for r in read_records(tmp_path)] == ["a", "c"]  # b is run again on resume
    assert p.read_bytes().endswith(b'"sta\n{"task_id": "c", "status": "submitted"}\n')


def test_undecodable_bytes_are_skipped_not_raised(tmp_path):
    (tmp_path / "records.jsonl").write_bytes(b'\xff\xfe garbage\n{"task_id": "a"}\n')
    assert [r["task_id"] for r in read_records(tmp_path)] == ["a"]


def test_an_empty_file_takes_a_record_without_a_leading_newline(tmp_path):
    p = tmp_path / "records.jsonl"
    p.touch()
    _append_line(p, '{"task_id": "a"}\n')
    assert p.read_bytes() == b'{"task_id": "a"}\n'
