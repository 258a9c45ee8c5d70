"""Issue #35's self-prediction figure: capture the 8 reference steps and predict each from its own
capture, into one results.csv and meta.json that ``docs/figures.py keep`` stores.

    OMP_NUM_THREADS=1 PYTHONPATH=tests python docs/predict_self.py --steps 40 -o /tmp/ps
    python docs/figures.py keep predict_self_cpu_runN /tmp/ps --note "..." && python docs/figures.py

``--steps`` is each capture's timed steps and, where more than 8, its light/plain pairs, which set the
width of every ``prediction_error vs_capture`` interval (about +-2.5 s / sqrt(pairs) for a pair ratio
spread ``s``: see :func:`mystique.capture.pacing_pairs`). ``PYTHONPATH=tests`` makes the two
``transformers`` steps (``predict_steps:...``) importable.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

#: (name, capture target and its options); the 6 small reference captures and 2 transformers steps
TARGETS = [(f"{w}_{m}", [w, "-c", "small", "--mode", m]) for w in ("llama", "dlrm", "bert") for m in ("train", "infer")]
TARGETS += [("hf_gpt2_train", ["predict_steps:hf_gpt2_train"]), ("hf_bert_infer", ["predict_steps:hf_bert_infer"])]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _git_commit() -> str:
    run = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, check=False)
    return run.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ns = ap.parse_args(argv)
    ns.output.mkdir(parents=True, exist_ok=True)
    mystique = [sys.executable, "-m", "mystique", "-q"]
    header, rows, worst = None, [], 0
    load_start, t0 = _load(), time.monotonic()
    for name, target in TARGETS:
        cap, out = ns.output / f"CAP_{name}", ns.output / f"P_{name}"
        subprocess.run([*mystique, "capture", *target, "--warmup", str(ns.warmup), "--steps", str(ns.steps),
                        "-o", str(cap), "--force"], check=True)
        rc = subprocess.run([*mystique, "predict", str(cap), "-o", str(out), "--force"], check=False).returncode
        worst = max(worst, rc)
        lines = (out / "results.csv").read_text().splitlines()
        header = header or lines[0]
        rows += lines[1:]
    return write_run(ns.output, [header or "", *rows],
                     f"docs/predict_self.py {shlex.join(argv if argv is not None else sys.argv[1:])} (for each of "
                     f"the 8 targets: mystique capture TARGET --warmup {ns.warmup} --steps {ns.steps} -o CAP; "
                     "mystique predict CAP -o OUT)", worst, t0, load_start)


def write_run(output: Path, lines: list[str], command: str, worst: int, t0: float, load_start: list[float]) -> int:
    """Write ``output``'s results.csv (``lines``) and meta.json (``command`` run as ``OMP_NUM_THREADS=..
    PYTHONPATH=tests python COMMAND``) for ``docs/figures.py keep``; print the results' path."""
    (output / "results.csv").write_text("\n".join(lines) + "\n")
    meta = {"command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} PYTHONPATH=tests python {command}",
            "commit": _git_commit(), "exit_code": worst, "wall_s": round(time.monotonic() - t0, 1),
            "cpus": os.cpu_count(), "load_start": load_start, "load_end": _load()}
    (output / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(output / "results.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
