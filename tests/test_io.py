"""Atomic output folders: nothing half-written, nothing the user had lost."""

from __future__ import annotations

import pytest

from mystique.errors import UsageError
from mystique.io import atomic_write_text, check_output_dir, staged_output_dir


def test_staged_dir_appears_only_on_success(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staged_output_dir(out) as stage:
            (stage / "a.txt").write_text("partial")
            raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
    with staged_output_dir(out) as stage:
        (stage / "a.txt").write_text("done")
    assert (out / "a.txt").read_text() == "done"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_existing_non_empty_folder_needs_force_and_keeps_foreign_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("user data")
    (out / "a.txt").write_text("old")
    with pytest.raises(UsageError, match="--force"):
        check_output_dir(out)
    with staged_output_dir(out, force=True) as stage:
        (stage / "a.txt").write_text("new")
    assert (out / "a.txt").read_text() == "new"
    assert (out / "mine.txt").read_text() == "user data"


def test_file_in_place_of_folder_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        check_output_dir(f)


def test_unwritable_location_is_refused_before_work(tmp_path):
    with pytest.raises(UsageError, match="cannot write"):
        check_output_dir("/proc/mystique-out")


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "x.json"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [q.name for q in tmp_path.iterdir()] == ["x.json"]
