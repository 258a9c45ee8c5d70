"""`mystique demo`: the main job, end to end, on the embedded default.

capture llama, dlrm and bert (``small``, train and infer) -> generate their benchmarks -> replay
them -> the quick validators on ``cpu`` (and ``cuda`` when present) -> ``OUT_DIR/report.html``.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

import mystique.cli.options as options

from .group import cli

VALIDATORS = ("numerics", "soft_errors", "correctness")
DEMO_TIME_CAP_S = 20.0  # seconds of paired rounds per replay: six replays stay a few minutes on a 2-core CPU


@cli.command("demo")
@options.output_dir
@click.option("-c", "--config", default="small", show_default=True, help="Workload size to capture.")
@options.workloads("Comma list of workloads (default all)")
@click.option("--modes", default="train,infer", show_default=True, metavar="LIST", help="Comma list of modes.")
@click.option("--validators", "validator_list", default=",".join(VALIDATORS), show_default=True, metavar="LIST",
              help="Comma list of quick validators to run (empty for none).")
@click.option("--iters", default=10, show_default=True, type=click.IntRange(1),
              help="Replay: the least number of paired rounds (iterations with --timing recorded).")
@options.timing
@options.half_width
@options.time_cap(DEMO_TIME_CAP_S)
@options.seed
@options.force
def demo_cmd(output, config, workloads, modes, validator_list, iters, timing, half_width, time_cap, seed, force) -> int:
    """Run the main job on the embedded default and write OUT_DIR/report.html.

    Each replay alternates with its captured step rebuilt in the same process (paired rounds, at
    most --time-cap seconds each after a warm-up until stable) and passes when the 95% interval of
    the median ratio replay/original lies within 0.90-1.10.
    """
    import importlib

    import torch

    from .. import results
    from ..capture import capture
    from ..io import staged_output_dir
    from ..progress import Progress
    from ..replay.generate import generate
    from ..replay.run import replay
    from ..targets import Target
    from ..workloads import MODES, REGISTERED
    from .cmd_replay import ratio_words

    # every registered workload, Llama 4 (MoE) included: its routing is pinned in the replay
    wl = list(REGISTERED) if workloads is None else _choices(workloads, REGISTERED, "workload", "known:")
    md = _choices(modes, MODES, "mode")
    vals = _choices(validator_list.replace("-", "_"), VALIDATORS, "validator")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    jobs = [(w, m) for w in wl for m in md]
    total = len(jobs) * 3 * len(devices) + len(vals) * len(devices) + 1
    progress = Progress("demo", total=total)
    frames = []
    with staged_output_dir(output, force) as stage:
        for device in devices:
            for w, m in jobs:
                name = f"{w}-{m}" + ("" if device == "cpu" else f"-{device}")
                progress.step(f"capture {w} ({config}, {m}) on {device}")
                capture(w, stage / "traces" / name, config=config, mode=m, device=device, seed=seed)
                progress.step(f"generate benchmark {name}")
                generate(str(stage / "traces" / name), str(stage / "benchmarks" / name), device=device)
                progress.step(f"replay benchmark {name}")
                summary, df = replay(str(stage / "benchmarks" / name), str(stage / "replay" / name), device=device,
                                     iters=iters, warmup=3, seed=seed, timing=timing, half_width=half_width,
                                     time_cap=time_cap)
                progress.note(f"replay {name}: step {summary['replay_step_ms']:.3f} ms{ratio_words(summary)}")
                frames.append(df)
            for v in vals:
                progress.step(f"validate {v} (quick) on {device}")
                mod = importlib.import_module(f"mystique.validators.{v}")
                out = stage / "validate" / f"{v}-{device}"
                out.mkdir(parents=True)
                df = mod.run(Target(device), level="quick", seed=seed, out_dir=out)
                results.write_csv(df, out / "results.csv")
                frames.append(df)
        progress.step("report")
        from ..reports import render_report

        all_results = sorted(stage.rglob("results.csv"))
        merged = results.concat([results.read_csv(p) for p in all_results])
        render_report([str(p) for p in all_results], str(stage / "report.html"), title="Mystique Suite demo")
    from .cmd_validate import verdict

    return verdict(merged, f"report: {output}/report.html")


def _choices(text: str, known: Sequence[str], what: str, label: str = "expected") -> list[str]:
    """The comma list ``text`` (items stripped, empty ones left out); UsageError naming an unknown item."""
    from ..errors import UsageError

    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in known:
            raise UsageError(f"unknown {what} {x!r}; {label} {', '.join(known)}")
    return items
