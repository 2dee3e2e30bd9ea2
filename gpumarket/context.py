"""What every command runs with: its arguments, the API client, where it writes, and the shared help format."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TextIO

from . import config
from .client import Client
from .errors import CliError, UsageError
from .table import Column, render, terminal_width


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=min(110, (terminal_width() or 100)))


class Context:
    """What a command runs with: its arguments, the client (made on first use from the settings), its output."""

    def __init__(self, args: argparse.Namespace, *, out: TextIO, err: TextIO, env: dict,
                 client: Client | None = None) -> None:
        self.args, self.out, self.err, self.env = args, out, err, env
        self._client = client

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def settings(self) -> config.Settings:
        return config.settings(self.env)

    @property
    def client(self) -> Client:
        if self._client is None:
            s = self.settings
            self._client = Client(s.url, s.key, warn=self.note)
        return self._client

    def print(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def note(self, text: str) -> None:
        """A word for the person at the terminal (stderr: never mixed into what a script reads)."""
        self.err.write(text + "\n")
        self.err.flush()

    def emit(self, body) -> None:
        """The API's JSON, as it came."""
        self.print(json.dumps(body, indent=2, ensure_ascii=False))

    def table(self, columns: list[Column], rows: list[list[str]], *, empty: str = "") -> None:
        if not rows and empty:
            self.note(empty)
            return
        self.print(render(columns, rows, terminal_width(self.out)))

    def result(self, body, text: str) -> int:
        """What a command did: the API's JSON with --json, else `text`."""
        if self.json:
            self.emit(body)
        else:
            self.print(text)
        return 0

    def listing(self, items: list[dict], columns: list[Column], row: Callable[[dict], list], *,
                empty: str = "") -> int:
        """A list: the API's objects as a JSON array with --json, else a table of `row(item)` ("empty" said on
        stderr when there are none)."""
        if self.json:
            self.emit(items)
        else:
            self.table(columns, [row(x) for x in items], empty=empty)
        return 0


def common() -> argparse.ArgumentParser:
    """The options every command takes (after its name too): --json."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print the API's JSON (lists as a JSON array of its objects) instead of a table")
    return p


def command(sub, name: str, parent: argparse.ArgumentParser, help: str, description: str = "", **kw):
    """A subcommand with the common options and the shared help format; its description defaults to its help."""
    return sub.add_parser(name, parents=[parent], help=help, description=description or help[:1].upper() + help[1:],
                          formatter_class=Formatter, **kw)


def confirm(ctx: Context, question: str) -> None:
    """Ask before doing something that cannot be undone, unless --yes; refuse (usage, exit 2) where nobody can
    answer (stdin is not a terminal)."""
    if getattr(ctx.args, "yes", False):
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question} needs a confirmation: pass --yes (stdin is not a terminal)")
    ctx.err.write(f"{question} [y/N] ")
    ctx.err.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CliError("not confirmed: nothing was done")
