"""Options shared by several commands, defined once.

Command modules import this module as ``import mystique.cli.options as options`` (not ``from .
import options``, which would import the package ``__init__`` that imports them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

import click

from ..emulation import PROFILES_HELP

DTYPES = ("float32", "bfloat16", "float16", "float64")

output_dir = click.option(
    "-o", "--output", "output", required=True,
    type=click.Path(file_okay=False, dir_okay=True, writable=False),
    help="Output folder (created; must be empty unless --force).",
)
force = click.option("--force", is_flag=True, help="Replace our files in an existing non-empty output folder.")
device = click.option(
    "--device", default="cpu", show_default=True, metavar="DEV",
    help="Torch device of the device under test: cpu, cuda, cuda:1, xpu, mps, ...",
)
inject = click.option(
    "--inject", default=None, metavar="SPEC",
    help="Dispatch mode active only on the device under test: a built-in fault simulation "
    "NAME[:k=v,...] (see `mystique faults`) or package.module:factory.",
)
emulate = click.option(
    "--emulate", default=None, metavar="PROFILE", type=click.Choice(sorted(PROFILES_HELP)),
    help="Run the device under test as an emulated foreign device: its legal numerics differences "
    "(summation orders, missing kernels, backend-specific outputs, autocast policy, TF32) "
    "reproduced on this one. A healthy run must still pass; for testing the suite without the hardware.",
)
dtype = click.option(
    "--dtype", default="float32", show_default=True, type=click.Choice(DTYPES), help="Floating dtype."
)
seed = click.option("--seed", default=0, show_default=True, type=int, help="Seed of every random choice.")
level = click.option(
    "--level", default="quick", show_default=True, type=click.Choice(("quick", "full")),
    help="quick: every boot; full: acceptance.",
)


def device_under_test(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``-o OUT``, ``--device``, ``--inject``, ``--emulate``, ``--level`` and ``--seed``, in this order:
    the options every command that judges the device under test opens with."""
    for opt in (seed, level, emulate, inject, device, output_dir):  # innermost first, as stacked decorators
        fn = opt(fn)
    return fn


iters = click.option("--iters", default=10, show_default=True, type=click.IntRange(1), help="Measured iterations.")
warmup = click.option("--warmup", default=3, show_default=True, type=click.IntRange(0), help="Warm-up iterations.")
half_width = click.option(
    "--half-width", "half_width", default=0.025, show_default=True, type=click.FloatRange(0, 1, min_open=True),
    metavar="F", help="Paired timing: add rounds until the 95% interval of the median replay/original ratio "
    "is within F of it (relative), or --time-cap is spent.",
)


def time_cap(default: float = 60.0):
    """``--time-cap S``: seconds of paired rounds (after the warm-up) per replay; ``default`` per command."""
    return click.option(
        "--time-cap", "time_cap", default=default, show_default=True, type=click.FloatRange(min=0, min_open=True),
        metavar="S", help="Paired timing: stop adding rounds after S seconds (the warm-up until stable takes "
        "at most a quarter of it, at least 5 s); the verdict then comes from the interval reached.",
    )


timing = click.option(
    "--timing", default="auto", show_default=True, type=click.Choice(("auto", "paired", "recorded")),
    help="How the replay's step time is compared with the original's. paired: the captured step is rebuilt "
    "and alternates with the replay in this process (a verdict from the 95% interval); recorded: against "
    "the time the capture recorded (a measurement, no verdict); auto: paired where the step can be rebuilt.",
)
pacing = click.option(
    "--pacing", default="none", show_default=True, type=click.Choice(("none", "recorded")),
    help="none: ops back to back; recorded: reproduce the host gaps between ops that Kineto recorded.",
)
threads = click.option(
    "--threads", default=None, type=click.IntRange(0), metavar="N",
    help="CPU intra-op threads of the replay (and of the original step beside it). Default: the captured "
    "step's, capped at the cores available; paired timing uses fewer when other processes keep cores busy. "
    "0: torch's own setting.",
)
cpu_affinity = click.option(
    "--cpu-affinity", "cpu_affinity", default="none", show_default=True, metavar="none|auto|LIST",
    help="Where this process's threads run while the step is timed. none: as launched (the scheduler places "
    "them); auto: the timing (main) thread on one core chosen the same way in every process (near the device, "
    "not CPU 0), every other thread on the other cores; LIST (e.g. 3 or 2,4-7): the main thread on the first "
    "CPU, the others on the rest. Recorded in summary.json (timing.cpu_placement) or capture.json "
    "(cpu_placement), and in results.csv (cpu_placement).",
)
allow_ops = click.option(
    "--allow-ops", "allow_ops", multiple=True, metavar="PATTERN",
    help="Also replay the operators matching PATTERN (fnmatch on ns::name, e.g. 'mylib::*'; repeatable). Operators "
    "outside the namespaces torch and the known workload libraries register (aten, prims, c10d, fbgemm, "
    "torchvision, ...) are skipped otherwise: a trace names the operators the replay calls.",
)
routing = click.option(
    "--routing", default="recorded", show_default=True, metavar="recorded|uniform|skewed:ALPHA",
    help="Tokens per expert of the grouped expert GEMMs (a mixture of experts): as the capture recorded them, "
    "spread evenly, or Zipf-skewed (expert e's share proportional to (e+1)^-ALPHA); each layer keeps its total.",
)
against = click.option(
    "--against", default=None, metavar="BASE_BENCH",
    help="Time the benchmark against BASE_BENCH, another routing of the same capture (generate --routing), in "
    "rounds rotating two executors of each and a null (two more of BASE_BENCH), after predicting the change from "
    "its grouped GEMMs timed with each routing's loads in paired rounds: routing_skew_prediction_error fails when "
    "the predicted ratio's 95% interval and the measured one widened by the null's floor are disjoint, and passes "
    "when the widened interval confirms the predicted direction and the measured one lies inside the predicted "
    "interval widened by the floor.",
)
doc_lengths = click.option(
    "--doc-lengths", default="recorded", show_default=True, metavar="recorded|uniform:MIN-MAX|longtail:MIN:ALPHA",
    help="Lengths of the packed documents of document-masked attention: as recorded, uniform in MIN..MAX, or "
    "long-tailed (Pareto from MIN with exponent ALPHA, as WLB-LLM describes corpora); each sequence stays full.",
)


class LazyChoice(click.Choice):
    """A :class:`click.Choice` whose choices come from ``load()`` on first use (parsing, completion,
    ``COMMAND --help``), so that defining the commands imports no validator or torch (``mystique --help``
    stays fast) while the choices stay those of the tables that define them."""

    def __init__(self, load: Callable[[], Iterable[str]], case_sensitive: bool = True) -> None:
        self._load = load
        self._loaded: tuple[str, ...] | None = None
        super().__init__((), case_sensitive)

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        if self._loaded is None:
            self._loaded = tuple(self._load())
        return self._loaded

    @choices.setter
    def choices(self, _value: Any) -> None:  # click.Choice.__init__ assigns; ``load`` decides
        pass


class ListedOption(click.Option):
    """An option whose help ends with names read only when the help is shown (``listing()``): the
    check groups of a validator, the registry's workloads."""

    def __init__(self, *args: Any, listing: Callable[[], Iterable[str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listing = listing

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        saved = self.help
        self.help = f"{saved}: {', '.join(self.listing())}."
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = saved


def validator_groups(validator: str) -> tuple[str, ...]:
    """The check groups of ``mystique.validators.<validator>``: the keys of its ``RUNNERS`` table."""
    return tuple(importlib.import_module(f"mystique.validators.{validator}").RUNNERS)


def group(validator: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--group NAME`` (repeatable, parameter ``groups``): a check group of the validator, the choices
    its ``RUNNERS`` table's keys. Not given: the level's default groups."""
    names = lambda: validator_groups(validator)  # noqa: E731
    return click.option(
        "--group", "groups", multiple=True, type=LazyChoice(names), metavar="NAME", cls=ListedOption,
        listing=names, help="Run only this check group (repeatable; default: the level's groups)",
    )


def workload_names() -> tuple[str, ...]:
    """The reference workloads, in registry order (``mystique.workloads.WORKLOADS``; imports torch)."""
    from .. import workloads

    return workloads.WORKLOADS


def workloads(help_text: str,
              default: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--workloads LIST``: comma-separated reference workloads, checked against the registry by the
    command's validator; ``help_text`` says what they are for, the help lists the registry's names."""
    return click.option(
        "--workloads", "workloads", default=default, show_default=default is not None, metavar="LIST",
        cls=ListedOption, listing=workload_names, help=help_text,
    )


# `mystique predict` (mystique.predict): what it predicts and how the prediction is checked
predict_ops = click.option(
    "--ops", "ops_csv", default=None, metavar="OPS_CSV",
    help="A benchmark's replay ops.csv: the op times of the graph (default: the times the capture recorded).")
predict_scale = click.option(
    "--scale", default=None, metavar="CLASS=F,...",
    help="Scale operator classes by factors: gemm, attention, memory, communication, host (e.g. gemm=0.5).")
predict_profile = click.option(
    "--profile", default=None, metavar="RESULTS_CSV",
    help="The throughput of the machine the step was captured on: a `mystique validate performance` "
    "results.csv (needed by --dtype and --target-profile).")
predict_target_profile = click.option(
    "--target-profile", default=None, metavar="RESULTS_CSV",
    help="Predict the step on another device: its `mystique validate performance` results.csv.")
predict_dtype = click.option(
    "--dtype", default=None, type=click.Choice(DTYPES),
    help="Predict the benchmark `generate --dtype` makes (floating tensors retargeted).")
predict_batch_scale = click.option(
    "--batch-scale", default=None, type=float, metavar="F",
    help="Predict the benchmark `generate --batch-scale F` makes.")
predict_verify = click.option(
    "--verify", is_flag=True,
    help="Check the prediction by running it here: the captured step, or the transformed benchmark against "
    "the untransformed one in paired rounds; writes prediction_error = predicted / measured - 1.")
predict_original = click.option(
    "--original", default=None, metavar="MODULE:FUNCTION",
    help="--verify of a user step's capture: the step factory to rebuild (a capture folder is data: what it "
    "names is imported only when given here).")
