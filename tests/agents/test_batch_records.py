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


def _trajectory(path, tail: bytes) -> None:
    from agents.trajectory import SCHEMA, TrajectoryWriter

    w = TrajectoryWriter(path)
    w.write({"type": "header", "schema": SCHEMA, "messages": [{"role": "user", "content": "héllo"}]})
    w.write({"type": "step", "index": 0, "messages": [{"role": "assistant", "content": "ça va"}]})
    with open(path, "ab") as f:
        f.write(tail)


def test_a_trajectory_cut_inside_a_character_resumes_without_the_torn_line(tmp_path):
    from agents.trajectory import read_trajectory

    p = tmp_path / "t.jsonl"
    _trajectory(p, '{"type": "step", "index": 1, "messages": [{"content": "é'.encode()[:-1])  # kill -9 mid-character
    before = p.read_bytes()
    t = read_trajectory(p)  # a reader: the file stays as it is
    assert [s["index"] for s in t.steps] == [0] and t.header["messages"][0]["content"] == "héllo"
    assert p.read_bytes() == before
    read_trajectory(p, repair=True)  # resume: the torn line goes, the rest is kept
    assert p.read_bytes() == before[:before.rindex(b"\n") + 1] and before.endswith(b'\xc3')


def test_showing_a_file_that_is_no_trajectory_leaves_it_untouched(tmp_path):
    import pytest

    from agents.errors import AgentHarnessError
    from agents.trajectory import read_trajectory

    p = tmp_path / "t.jsonl"
    p.write_bytes(b"\xff garbage\n")
    for repair in (False, True):
        with pytest.raises(AgentHarnessError, match="no header line"):
            read_trajectory(p, repair=repair)
        assert p.read_bytes() == b"\xff garbage\n"


def test_undecodable_bytes_inside_a_trajectory_are_one_harness_error(tmp_path):
    import pytest

    from agents.errors import AgentHarnessError
    from agents.trajectory import read_trajectory

    p = tmp_path / "t.jsonl"
    _trajectory(p, b'{"type": "event", "x": "\xff"}\n{"type": "step", "index": 1, "messages": []}\n')
    with pytest.raises(AgentHarnessError, match="not UTF-8 .*new --out"):
        read_trajectory(p)
