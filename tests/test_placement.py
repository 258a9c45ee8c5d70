"""CPU placement of the timing process (``--cpu-affinity``, mystique/placement.py): the policy's choice on
given CPU sets, the threads it moves, what replay and capture record, and bad values."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mystique import placement
from mystique.errors import EnvironmentUnsupported, UsageError
from mystique.placement import choose, format_cpu_list, parse_cpu_list, parse_policy

AFFINITY = hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")
MULTI = AFFINITY and len(os.sched_getaffinity(0)) >= 2


# ----------------------------------------------------------------------------------------------
# the choice (pure)


def test_auto_on_two_cpus_keeps_the_main_thread_off_cpu_0_and_the_pool_on_the_other():
    c = choose({0, 1}, threads=2)
    assert (c.main, c.others, c.applied) == (1, (0,), True)
    assert "CPU 0" in c.why


def test_auto_prefers_the_devices_numa_node():
    c = choose(range(16), threads=4, near=range(8, 16))
    assert c.main == 8 and 8 not in c.others and set(c.others) == set(range(16)) - {8}
    assert "NUMA-local CPUs 8-15" in c.why


def test_auto_keeps_the_other_threads_off_the_main_cores_smt_sibling_while_enough_cpus_remain():
    sib = {0: (0, 2), 2: (0, 2), 1: (1, 3), 3: (1, 3)}
    two = choose({0, 1, 2, 3}, threads=2, siblings=sib)
    assert two.main == 1 and two.others == (0, 2) and "off its SMT sibling(s) 3" in two.why
    four = choose({0, 1, 2, 3}, threads=4, siblings=sib)  # 3 pool threads need the sibling too
    assert four.main == 1 and four.others == (0, 2, 3) and "sibling(s) 3 included" in four.why


def test_one_cpu_places_nothing_and_says_so():
    c = choose({5}, threads=1)
    assert not c.applied and c.main is None and "one CPU allowed (5)" in c.why


def test_a_list_puts_the_main_thread_on_its_first_cpu():
    assert choose({0, 1, 2, 3}, asked=(3, 1, 2)).main == 3
    assert choose({0, 1, 2, 3}, asked=(3, 1, 2)).others == (1, 2)
    assert choose({0, 1, 2, 3}, asked=(2,)).others == (2,)  # one CPU: every thread on it
    with pytest.raises(ValueError, match="CPU 7 is not among the CPUs this process may use"):
        choose({0, 1, 2, 3}, asked=(1, 7))


cpu_sets = st.sets(st.integers(0, 63), min_size=1, max_size=16)


@given(cpu_sets, st.integers(1, 8), st.one_of(st.none(), cpu_sets), st.randoms(use_true_random=False))
def test_auto_is_deterministic_and_stays_inside_the_allowed_cpus(allowed, threads, near, rnd):
    """Law: the same CPUs in any order give the same choice; the main CPU and the others are allowed CPUs,
    the main one never among the others, CPU 0 the main one only when nothing else could be."""
    shuffled = list(allowed)
    rnd.shuffle(shuffled)
    a = choose(allowed, threads=threads, near=near)
    b = choose(shuffled, threads=threads, near=None if near is None else sorted(near, reverse=True))
    assert a == b
    if len(allowed) == 1:
        assert not a.applied
        return
    assert a.main in allowed and set(a.others) <= allowed and a.main not in a.others and a.others
    local = allowed & (near or set())
    if a.main == 0:
        assert (local or allowed) == {0}
    if local:
        assert a.main in local


@given(st.sets(st.integers(0, 300), min_size=1, max_size=40))
def test_cpu_lists_round_trip(cpus):
    text = format_cpu_list(cpus)
    assert set(parse_cpu_list(text)) == cpus and format_cpu_list(parse_cpu_list(text)) == text


@pytest.mark.parametrize("bad", ["x", "3-1", "", "1,,2", "-2", "1-", "0-99999999", "auto2"])
def test_a_bad_value_is_one_usage_line(bad):
    with pytest.raises(UsageError, match="--cpu-affinity") as err:
        parse_policy(bad)
    assert "\n" not in str(err.value)


def test_policies_parse():
    assert parse_policy("none") == "none" and parse_policy("AUTO") == "auto" and parse_policy(None) == "none"
    assert parse_policy("0-2,5") == (0, 1, 2, 5)


def test_the_device_numa_node_is_read_from_its_pci_address_only_on_cuda():
    assert placement.device_local_cpus("cpu") is None
    sib = placement.smt_siblings([0, 1], read=lambda p: {"/sys/devices/system/cpu/cpu0/topology/thread_siblings_list":
                                                          "0,2"}.get(p))
    assert sib == {0: (0, 2)}


# ----------------------------------------------------------------------------------------------
# applied to this process


@pytest.mark.skipif(not MULTI, reason="needs per-thread affinity and two CPUs")
def test_auto_pins_the_main_thread_moves_the_others_and_restores_them():
    before = os.sched_getaffinity(0)
    started = threading.Event()
    done = threading.Event()
    seen: dict[str, set[int]] = {}

    def worker():
        started.set()
        done.wait(10)
        seen["worker"] = os.sched_getaffinity(threading.get_native_id())

    with placement.placed("auto") as pl:
        rec = pl.record
        assert rec["applied"] and os.sched_getaffinity(threading.get_native_id()) == {rec["main_cpu"]}
        t = threading.Thread(target=worker)  # started after the pinning: inherits the main core
        t.start()
        started.wait(10)
        assert pl.sweep() >= 1  # ... and the sweep moves it
        done.set()
        t.join()
        assert seen["worker"] == set(parse_cpu_list(rec["other_cpus"]))
        assert rec["main_cpu"] not in seen["worker"]
    assert os.sched_getaffinity(threading.get_native_id()) == before


def test_none_places_nothing():
    before = os.sched_getaffinity(0) if AFFINITY else None
    with placement.placed("none") as pl:
        assert pl.record["policy"] == "none" and not pl.record["applied"] and pl.record["main_cpu"] is None
    assert (os.sched_getaffinity(0) if AFFINITY else None) == before


def test_without_per_thread_affinity_auto_degrades_and_a_list_is_refused(monkeypatch):
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    with placement.placed("auto") as pl:
        assert not pl.record["applied"] and "no per-thread CPU affinity" in pl.record["why"]
    with pytest.raises(EnvironmentUnsupported, match="no per-thread"):
        placement.placed((0,))


def test_on_a_one_cpu_process_auto_says_there_is_nothing_to_place(monkeypatch):
    monkeypatch.setattr(placement, "allowed_cpus", lambda: (0,))
    with placement.placed("auto") as pl:
        assert not pl.record["applied"] and "one CPU allowed (0)" in pl.record["why"]


# ----------------------------------------------------------------------------------------------
# replay and capture record it


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    from mystique.capture import capture

    out = tmp_path_factory.mktemp("cap") / "tiny"
    capture("user_steps:tiny_mlp", out, steps=3, warmup=1, cpu_affinity="auto")
    return out


def test_capture_records_where_its_timed_steps_ran(trace_dir):
    rec = json.loads((trace_dir / "capture.json").read_text())["cpu_placement"]
    assert rec["policy"] == "auto" and rec["applied"] == MULTI
    rows = (trace_dir / "results.csv").read_text()
    assert "cpu_placement" in rows and "--cpu-affinity auto" in rows


@pytest.mark.parametrize("policy", ["auto", "none"])
def test_replay_records_the_placement_in_summary_results_and_report(trace_dir, tmp_path, cli_run, monkeypatch,
                                                                    policy):
    from mystique.replay import fidelity
    from mystique.timing import Paired

    pinned: list[set[int]] = []

    def fake_rounds(a, b, between=None, **kw):  # one round of each side, where the rounds would run
        a()
        b()
        if between is not None:
            between()
        pinned.append(os.sched_getaffinity(threading.get_native_id()) if AFFINITY else set())
        jit = [0.99 + 0.02 * i / 16 for i in range(16)]
        return Paired(a_ms=jit, b_ms=[1.0] * 16, a_wall_ms=jit, b_wall_ms=[1.0] * 16, stop="half-width")

    monkeypatch.setattr(fidelity, "paired_rounds", fake_rounds)
    before = os.sched_getaffinity(0) if AFFINITY else None
    out = tmp_path / "r"
    code, _, _ = cli_run("-q", "replay", str(trace_dir), "-o", str(out), "--iters", "2", "--warmup", "0",
                         "--original", "user_steps:tiny_mlp", "--cpu-affinity", policy)
    assert code == 0
    rec = json.loads((out / "summary.json").read_text())["timing"]["cpu_placement"]
    assert rec["policy"] == policy and rec["applied"] == (MULTI and policy == "auto")
    if rec["applied"]:
        assert pinned == [{rec["main_cpu"]}]  # the rounds ran on the chosen core
    assert (os.sched_getaffinity(0) if AFFINITY else None) == before  # and the process got its CPUs back
    row = [ln for ln in (out / "results.csv").read_text().splitlines() if ",cpu_placement," in ln]
    assert len(row) == 1 and f"--cpu-affinity {policy}" in row[0]
    html = tmp_path / "report.html"
    cli_run("report", str(out / "results.csv"), "-o", str(html))
    text = html.read_text()
    assert "CPU placement" in text
    assert ("main thread on CPU" in text) == rec["applied"]


@pytest.mark.parametrize("cmd", ["replay", "capture"])
@pytest.mark.parametrize("bad", ["x", "2-1", "1,,2", "4096"])
def test_bad_cpu_lists_exit_2_with_one_line(cmd, bad, tmp_path, capsys):
    from mystique.cli import main

    src = ["user_steps:tiny_mlp"] if cmd == "capture" else [str(tmp_path)]
    code = main(["-q", cmd, *src, "-o", str(tmp_path / "o"), "--cpu-affinity", bad])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("mystique: error: --cpu-affinity") and err.count("\n") == 1
    assert "Traceback" not in err and not (tmp_path / "o").exists()
