import os

import pytest

from attnzoo.io import atomic_path, atomic_write_text


def test_atomic_write_replaces_whole_file_with_normal_permissions(tmp_path):
    path = tmp_path / "sub" / "file.txt"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in path.parent.iterdir()] == ["file.txt"]  # no temporary file left behind


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "file.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]
