"""Options shared by several commands, defined once."""

from __future__ import annotations

import click

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
    "--emulate", default=None, metavar="PROFILE", type=click.Choice(("cuda",)),
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
iters = click.option("--iters", default=10, show_default=True, type=click.IntRange(1), help="Measured iterations.")
warmup = click.option("--warmup", default=3, show_default=True, type=click.IntRange(0), help="Warm-up iterations.")
