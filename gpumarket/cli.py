"""`gpum`: the parser (every command's help), the context commands run in, and how errors become messages on
stderr and exit statuses (errors.py)."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TextIO

from . import __version__, account, leases, market, money
from .client import Client
from .context import Context, Formatter, common
from .errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, ApiError, CliError
from .parse import field_flag, flat_fields

DESCRIPTION = """\
GPU Market from the command line: find offers, order GPU slices on demand, as spot or reserved, watch and end
leases, ssh into their containers, follow logs and metrics, buy resold time, read your balance and statements.

Log in once with an API key from the console's Account page:  gpum login --url https://market.example.org
Every command prints a table for people; --json prints the API's JSON for scripts."""

EPILOG = """\
examples:
  gpum offers --model h100-80gb --min-memory 40
  gpum order on-demand --offer h100-80gb:3g.40gb:eu-west --template ubuntu-ssh --port 22 --wait
  gpum ssh 1a2b
  gpum logs 1a2b -f
  gpum lease end 1a2b

exit status: 0 ok, 1 the server refused or failed it (its message is printed), 2 usage, 3 not logged in or key
refused, 4 not found, 5 server unreachable, 130 interrupted. Environment: GPUM_URL, GPUM_API_KEY (over the file
`gpum login` writes). Manual: docs/cli.md."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpum", description=DESCRIPTION, epilog=EPILOG, formatter_class=Formatter)
    parser.add_argument("--json", action="store_true", default=False,
                        help="print the API's JSON (lists as a JSON array of its objects) instead of tables")
    parser.add_argument("--version", action="version", version=f"gpum {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    parent = common()
    for module in (account, market, leases, money):
        module.register(sub, parent)
    return parser


def _print_error(exc: CliError, err: TextIO) -> None:
    err.write(f"gpum: {exc.message}\n")
    if isinstance(exc, ApiError):
        shown = set()
        for path, _ in flat_fields(exc.fields):  # the API names its fields; the user typed flags
            flag = field_flag(path)
            if flag and path not in shown:
                shown.add(path)
                err.write(f"  ({path} is {flag})\n")
        details = exc.details if isinstance(exc.details, dict) else {}
        # The engine's reason keys ("GPU busy") only from a market that sends no sentence of its own: where it does,
        # the message is that sentence, in the buyer's words, and the keys would repeat it in the engine's.
        if not details.get("explain"):
            for reason in details.get("reasons") or []:
                err.write(f"  - {reason}\n")
    if exc.hint:
        err.write(f"  {exc.hint}\n")
    err.flush()


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments; what follows the first `--` is `extra`, for a command that passes it on (ssh)."""
    parser = build_parser()
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    args = parser.parse_args(argv)
    if extra and not getattr(args, "takes_passthrough", False):
        parser.error(f"unexpected arguments after --: {' '.join(extra)}")
    args.extra = extra
    return args


def main(argv: list[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None,
         env: dict | None = None, client: Client | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = parse(sys.argv[1:] if argv is None else list(argv))
    ctx = Context(args, out=out, err=err, env=dict(os.environ) if env is None else env, client=client)
    run: Callable[[Context], int | None] = args.run
    try:
        return run(ctx) or EXIT_OK
    except argparse.ArgumentTypeError as exc:  # a value checked after parsing (the order body's rules)
        err.write(f"gpum: {exc}\n")
        return EXIT_USAGE
    except CliError as exc:
        _print_error(exc, err)
        return exc.exit_code
    except KeyboardInterrupt:
        err.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gpum leases | head`: the reader had enough; nothing more to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
