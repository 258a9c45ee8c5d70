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


# --- issue 19: replace our files, keep yours; check before moving; durable renames ---------------

import json  # noqa: E402
import os  # noqa: E402

from mystique.io import MANIFEST_NAME, read_manifest  # noqa: E402


def _run(out, files: dict[str, str], force: bool = True) -> None:
    with staged_output_dir(out, force=force) as stage:
        for rel, text in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_text(text)


def test_manifest_lists_every_file_we_wrote(tmp_path):
    out = tmp_path / "out"
    _run(out, {"report.html": "r", "traces/llama/trace.json": "t"}, force=False)
    assert read_manifest(out) == {"report.html", "traces/llama/trace.json"}
    doc = json.loads((out / MANIFEST_NAME).read_text())
    assert doc["format"] == "mystique-manifest" and doc["files"] == ["report.html", "traces/llama/trace.json"]


def test_force_keeps_a_users_file_inside_one_of_our_folders(tmp_path):
    out = tmp_path / "out"
    _run(out, {"traces/llama/trace.json": "old", "traces/bert/trace.json": "old", "report.html": "old"}, force=False)
    (out / "traces" / "my_notes.txt").write_text("mine")
    (out / "traces" / "llama" / "notes.md").write_text("mine too")
    _run(out, {"traces/llama/trace.json": "new", "report.html": "new"})
    assert (out / "traces" / "my_notes.txt").read_text() == "mine"
    assert (out / "traces" / "llama" / "notes.md").read_text() == "mine too"
    assert (out / "traces" / "llama" / "trace.json").read_text() == "new"
    assert (out / "report.html").read_text() == "new"
    assert not (out / "traces" / "bert").exists()  # our stale folder went with its files
    assert read_manifest(out) == {"traces/llama/trace.json", "report.html"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_force_replaces_a_file_named_like_ours_without_a_manifest(tmp_path):
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "keep.txt").write_text("mine")
    (out / "report.html").write_text("old")
    _run(out, {"report.html": "new", "traces/x.json": "x"})
    assert (out / "report.html").read_text() == "new"
    assert (out / "traces" / "keep.txt").read_text() == "mine"


def test_a_file_where_a_folder_is_needed_is_refused_before_anything_moves(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "traces").write_text("a user's file named like our folder")
    with pytest.raises(UsageError, match=r"out/traces is a file where the results need a folder") as info:
        _run(out, {"a_report.html": "r", "traces/llama/trace.json": "t"})
    assert "nothing was moved" in str(info.value)
    assert (out / "traces").read_text() == "a user's file named like our folder"
    assert sorted(p.name for p in out.iterdir()) == ["traces"]  # a_report.html was not moved in


def test_a_folder_where_a_file_goes_is_refused(tmp_path):
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    (out / "report.html" / "user.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"report.html is a folder where the results write a file"):
        _run(out, {"results.csv": "c", "report.html": "r"})
    assert (out / "report.html" / "user.txt").read_text() == "mine"
    assert not (out / "results.csv").exists()


def test_our_old_file_may_become_a_folder_and_back(tmp_path):
    out = tmp_path / "out"
    _run(out, {"a": "file"}, force=False)
    _run(out, {"a/b.txt": "now a folder"})
    assert (out / "a" / "b.txt").read_text() == "now a folder"
    _run(out, {"a": "a file again"})
    assert (out / "a").read_text() == "a file again"


def test_the_cli_refuses_a_file_in_place_of_our_folder_with_exit_2(tmp_path, capsys):
    from mystique.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "benchmark.json").mkdir()
    (out / "benchmark.json" / "notes").write_text("mine")
    trace = os.path.join(os.path.dirname(__file__), "data", "traces", "pt2_et.json")
    rc = main(["-q", "generate", trace, "-o", str(out), "--force"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("mystique: error: ") and "internal error" not in err
    assert "benchmark.json is a folder" in err
    assert sorted(p.name for p in out.iterdir()) == ["benchmark.json"]


def test_a_hostile_manifest_deletes_nothing_outside_and_nothing_not_listed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.json").write_text("precious")
    (out / "linked").symlink_to(elsewhere)
    (out / MANIFEST_NAME).write_text(json.dumps({"files": ["../victim.txt", str(victim), "linked/a.json", "", None,
                                                            "./x", "a/../../victim.txt"]}))
    _run(out, {"r.csv": "x"})
    assert victim.read_text() == "precious" and (elsewhere / "a.json").read_text() == "precious"
    with pytest.raises(UsageError, match="linked is a symbolic link where the results need a folder"):
        _run(out, {"linked/a.json": "x"})
    assert (elsewhere / "a.json").read_text() == "precious"


def test_a_file_that_appeared_during_a_run_without_force_is_refused(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="appeared while the command ran"):
        with staged_output_dir(out) as stage:
            (stage / "results.csv").write_text("ours")
            out.mkdir()
            (out / "results.csv").write_text("theirs")
    assert (out / "results.csv").read_text() == "theirs"


def test_atomic_write_syncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    import stat as st

    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-dir" if st.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        return real_fsync(fd)

    def replace(a, b):
        events.append("rename")
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write_text(tmp_path / "checkpoint.jsonl", "row\n")
    assert events == ["fsync-file", "rename", "fsync-dir"]
    assert (tmp_path / "checkpoint.jsonl").read_text() == "row\n"


def test_staged_files_are_synced_before_they_are_moved_in(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else str(fd))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _run(tmp_path / "out", {"data.bin": "x"}, force=False)
    assert any(s.endswith("data.bin") for s in synced)


def test_messages_naming_a_hostile_output_path_stay_on_one_line(tmp_path, capsys):
    from mystique.cli import main

    trace = os.path.join(os.path.dirname(__file__), "data", "traces", "pt2_et.json")
    out = tmp_path / "out\nmystique: error: forged\r"
    assert main(["-q", "generate", trace, "-o", str(out)]) == 0
    capsys.readouterr()
    rc = main(["-q", "generate", trace, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "not empty" in err and "out\\nmystique" in err, err


def test_a_broken_symbolic_link_as_output_is_refused(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="is a broken symbolic link"):
        check_output_dir(link)


def test_generate_force_replaces_our_stale_files_and_keeps_the_users(tmp_path):
    from mystique.cli import main

    trace = os.path.join(os.path.dirname(__file__), "data", "traces", "pt2_et.json")
    out = tmp_path / "bench"
    assert main(["-q", "generate", trace, "-o", str(out)]) == 0
    assert {"benchmark.json", "benchmark.py", MANIFEST_NAME} <= {p.name for p in out.iterdir()}
    (out / "notes.txt").write_text("mine")
    assert main(["-q", "generate", trace, "-o", str(out), "--format", "json", "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_NAME, "benchmark.json", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
