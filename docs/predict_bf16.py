"""Issue #35's cross-configuration figure, bf16 from fp32: this host's device profile measured at the steps'
thread count and at the steps' own GEMM shapes (``--shapes-from`` each capture predicted: ``gemm_shape``
rows), then each fp32 reference step's bf16 prediction checked against the generated bf16 benchmark
(``predict CAP --verify --dtype bfloat16 --profile P``), into one results.csv and meta.json that
``docs/figures.py keep`` stores.

    OMP_NUM_THREADS=1 PYTHONPATH=tests python docs/predict_bf16.py -o /tmp/pb16 [--captures /tmp/ps]
    python docs/figures.py keep predict_bf16_from_fp32_cpu_runN /tmp/pb16 --note "..." && python docs/figures.py

The profile (``validate performance --group micro``, about 35-50 s, and about 3-4 min more for the 61
distinct GEMM shapes of the 8 captures in fp32, bf16 and fp16) runs pinned to one CPU when
``OMP_NUM_THREADS=1``, so that it measures at the one thread the steps run at (its thread count is the
CPUs it may use): on a CPU without native bf16 the fp32/bf16 throughput ratio depends on the threads.
``--captures DIR`` reuses the ``CAP_<name>`` folders of ``docs/predict_self.py`` (fp32 captures); without
it, each target is captured first. ``--targets`` picks some of the 8 (default all).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from predict_self import TARGETS, _load, write_run  # noqa: E402


def _one_cpu() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--captures", type=Path, default=None, help="a docs/predict_self.py output folder (CAP_<name>)")
    ap.add_argument("--targets", default=",".join(n for n, _ in TARGETS))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--time-cap", type=float, default=20.0)
    ns = ap.parse_args(argv)
    chosen = [t for t in TARGETS if t[0] in ns.targets.split(",")]
    if not chosen:
        ap.error(f"--targets: none of {ns.targets!r} is one of {', '.join(n for n, _ in TARGETS)}")
    ns.output.mkdir(parents=True, exist_ok=True)
    mystique = [sys.executable, "-m", "mystique", "-q"]
    load_start, t0 = _load(), time.monotonic()
    profile = ns.output / "profile"
    one = os.environ.get("OMP_NUM_THREADS") == "1"
    caps = {}
    for name, target in chosen:
        cap = caps[name] = (ns.captures or ns.output) / f"CAP_{name}"
        if not (cap / "capture.json").is_file():
            subprocess.run([*mystique, "capture", *target, "--warmup", str(ns.warmup), "--steps", str(ns.steps),
                            "-o", str(cap), "--force"], check=True)
    shapes = [a for cap in caps.values() for a in ("--shapes-from", str(cap))]
    subprocess.run([*mystique, "validate", "performance", "--device", "cpu", "--level", "quick", "--group", "micro",
                    *shapes, "-o", str(profile), "--force"], check=False, preexec_fn=_one_cpu if one else None)
    header, rows, worst, runs = None, [], 0, []
    for name, target in chosen:
        cap = caps[name]
        out = ns.output / f"P_{name}"
        original = ["--original", target[0]] if ":" in target[0] else []
        args = ["predict", str(cap), "--verify", "--time-cap", f"{ns.time_cap:g}", "--dtype", "bfloat16",
                "--profile", str(profile), *original, "-o", str(out), "--force"]
        t1 = time.monotonic()
        rc = subprocess.run([*mystique, *args], check=False).returncode
        runs.append(f"mystique {shlex.join(args)} (exit {rc}, {time.monotonic() - t1:.0f} s)")
        worst = max(worst, rc)
        if (out / "results.csv").is_file():
            lines = (out / "results.csv").read_text().splitlines()
            header = header or lines[0]
            rows += lines[1:]
    lines = (profile / "results.csv").read_text().splitlines() if (profile / "results.csv").is_file() else []
    return write_run(ns.output, [header or (lines[0] if lines else ""), *rows, *lines[1:]],
                     f"docs/predict_bf16.py {shlex.join(argv if argv is not None else sys.argv[1:])}: "
                     f"{'taskset one CPU: ' if one else ''}mystique validate performance --device cpu --level quick "
                     f"--group micro {shlex.join(shapes)} -o P; " + "; ".join(runs), worst, t0, load_start)


if __name__ == "__main__":
    raise SystemExit(main())
