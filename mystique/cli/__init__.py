"""The ``mystique`` command: one click group; heavy imports happen inside the commands.

Exit codes: 0 every check passed; 1 checks failed; 2 bad usage or bad input; 3 the environment
cannot do it (device absent, optional package missing, too little memory).
"""

from __future__ import annotations

import sys
import traceback

import click

from ..errors import MystiqueError

EXIT_CODES = """\b
Exit codes:
  0  all ran and every check passed
  1  checks failed (the report says which)
  2  bad usage or bad input
  3  the environment cannot do it (device absent, package missing, too little memory)"""


@click.group(epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mystique-suite", prog_name="mystique")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """Mystique Suite: portable benchmarks from real PyTorch workloads, and accelerator qualification."""
    from .. import progress

    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if quiet:
        progress.set_enabled(False)


def _register() -> None:
    from . import commands  # noqa: F401  (registers the commands on `cli`)


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the group, turn our errors into one line and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        rv = cli.main(args=args, prog_name="mystique", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("mystique: error: aborted", err=True)
        return 2
    except MystiqueError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"mystique: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("mystique: error: interrupted", err=True)
        return 130
    except Exception as exc:  # an internal fault: one line, the traceback with --debug
        if debug:
            traceback.print_exc()
        click.echo(f"mystique: error: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
        return 1
    return rv if isinstance(rv, int) else 0


def run() -> None:
    sys.exit(main())
