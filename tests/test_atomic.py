"""msa_common.atomic: a whole-file write replaces the target whole, or leaves it as it was."""
import json
import os
import stat

import pytest

from msa_common.atomic import atomic_open, atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text


def _names(d):
    return sorted(p.name for p in d.iterdir())


def test_content_is_replaced_whole_and_no_temp_file_stays(tmp_path):
    p = tmp_path / "f.bin"
    atomic_write_bytes(p, b"old content that is longer than the new one")
    atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"new"
    assert _names(tmp_path) == ["f.bin"]


def test_text_and_json_variants(tmp_path):
    atomic_write_text(tmp_path / "t.txt", "caf\u00e9\n")
    assert (tmp_path / "t.txt").read_bytes() == "caf\u00e9\n".encode()
    atomic_write_json(tmp_path / "a.json", {"b": 1, "p": tmp_path})
    text = (tmp_path / "a.json").read_text()
    assert text.endswith("}\n") and "\n  " in text  # indent 2, one trailing newline
    assert json.loads(text) == {"b": 1, "p": str(tmp_path)}
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "a.json", {"p": tmp_path}, default=None)
    assert json.loads((tmp_path / "a.json").read_text())["p"] == str(tmp_path)


def test_missing_parent_directories_are_created(tmp_path):
    p = tmp_path / "x" / "y" / "z.txt"
    atomic_write_text(p, "hi")
    assert p.read_text() == "hi"


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_a_failure_mid_write_leaves_the_old_file_and_no_temp_file(tmp_path, exc):
    p = tmp_path / "f.txt"
    p.write_text("old")
    with pytest.raises(exc):
        with atomic_open(p, "w", encoding="utf-8") as f:
            f.write("half of the new")
            f.flush()
            raise exc("disk on fire")
    assert p.read_text() == "old"
    assert _names(tmp_path) == ["f.txt"]


def test_a_check_inside_the_block_can_refuse_the_file(tmp_path):
    p = tmp_path / "model.bin"
    with pytest.raises(ValueError):
        with atomic_open(p) as f:
            f.write(b"unverified")
            raise ValueError("checksum mismatch")
    assert not p.exists() and _names(tmp_path) == []


def test_a_failing_replace_removes_the_temp_file(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inside").write_text("keep")
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "d", "cannot replace a non-empty directory")
    assert _names(tmp_path) == ["d"] and (tmp_path / "d" / "inside").read_text() == "keep"


def test_atomic_path_for_writers_that_take_a_name(tmp_path):
    p = tmp_path / "plot.png"
    with atomic_path(p, suffix=".png") as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".png") and tmp.name != p.name
        tmp.write_bytes(b"png bytes")
        assert not p.exists()
    assert p.read_bytes() == b"png bytes" and _names(tmp_path) == ["plot.png"]
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer crashed")
    assert p.read_bytes() == b"png bytes" and _names(tmp_path) == ["plot.png"]


def test_the_file_gets_the_umask_mode_like_a_plain_open(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "m.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.txt").stat().st_mode) == 0o644


def test_atomic_open_refuses_append_mode(tmp_path):
    with pytest.raises(ValueError, match="whole file"):
        with atomic_open(tmp_path / "f", "ab"):
            pass
    assert _names(tmp_path) == []
