"""The ``mystique`` click group, its exit codes and its error handling: the leaf every command
module registers on (``from .group import cli``)."""

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
  3  the environment cannot do it (device absent, package missing, too little memory)
  4  undecided: no check failed but some were inconclusive (the report says which)"""


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line: line breaks (a hostile file name may carry them) escaped."""
    text = str(exc)
    for brk, esc in (("\r\n", "\\n"), ("\n", "\\n"), ("\r", "\\r"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(brk, esc)
    return text


class MystiqueGroup(click.Group):
    """A group whose commands may return an exit code and raise our errors.

    A :class:`MystiqueError` becomes one line on stderr (``mystique: error: ...``) and its exit
    code; any other exception becomes one line and exit 1; ``--debug`` shows the traceback. The
    console script and ``CliRunner().invoke(cli, ...)`` behave the same.
    """

    def invoke(self, ctx: click.Context):
        debug = "--debug" in sys.argv[1:] or bool(ctx.params.get("debug"))
        try:
            rv = super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except MystiqueError as exc:
            if debug:
                traceback.print_exc()
            click.echo(f"mystique: error: {one_line(exc)}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("mystique: error: interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:  # an internal fault: one line, the traceback with --debug
            if debug:
                traceback.print_exc()
            click.echo(
                f"mystique: error: internal error: {type(exc).__name__}: {one_line(exc)} "
                "(run with --debug for the traceback)",
                err=True,
            )
            ctx.exit(1)
        if isinstance(rv, int) and rv:
            ctx.exit(rv)
        return rv


@click.group(cls=MystiqueGroup, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
