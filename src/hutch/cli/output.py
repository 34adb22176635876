"""How the CLIs print listings, in rabbitmqctl's three formatters.

    table         (default) informational header lines, then a tab-separated header row and
                  one tab-separated row per item; values as rabbitmqctl prints them
                  (true/false, [{"x-max-length",10}] for argument tables, [a, b] for lists)
    json          a JSON array of objects with the requested columns, no header lines
    pretty_table  a boxed table (rich)

Header lines ("Listing queues for vhost / ...") go to stdout like rabbitmqctl's, and are
left out with --quiet or --silent (--silent also drops the column header row).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

FORMATTERS = ("table", "json", "pretty_table")


def _erl_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, dict):
        return "[" + ",".join(f'{{"{k}",{_erl_value(x)}}}' for k, x in v.items()) + "]"
    if isinstance(v, list):
        return "[" + ",".join(_erl_value(x) for x in v) + "]"
    if v is None:
        return "undefined"
    return str(v)


def table_cell(column: str, v: Any) -> str:
    """One value as rabbitmqctl's table formatter prints it."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if column == "definition" and isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"))
    if isinstance(v, dict):
        return _erl_value(v)
    if isinstance(v, list):
        return "[" + ", ".join(str(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def json_cell(column: str, v: Any) -> Any:
    if column == "definition" and isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"))
    return v


class Printer:
    def __init__(self, formatter: str = "table", quiet: bool = False, silent: bool = False):
        if formatter not in FORMATTERS:
            raise click.UsageError(f"--formatter must be one of {', '.join(FORMATTERS)}")
        self.formatter = formatter
        self.quiet = quiet or silent
        self.silent = silent

    def info(self, line: str) -> None:
        """An informational line ("Adding user ..."): shown unless --quiet, never in JSON output."""
        if not self.quiet and self.formatter != "json":
            click.echo(line)

    def rows(self, columns: Sequence[str], rows: list[dict[str, Any]], headers: Sequence[str] = ()) -> None:
        if self.formatter == "json":
            click.echo(json.dumps([{c: json_cell(c, r.get(c)) for c in columns} for r in rows], indent=1))
            return
        for h in headers:
            self.info(h)
        if self.formatter == "pretty_table":
            from rich.console import Console
            from rich.table import Table

            t = Table(*columns, show_lines=True)
            for r in rows:
                t.add_row(*(table_cell(c, r.get(c)) for c in columns))
            Console(file=sys.stdout, soft_wrap=True).print(t)
            return
        if not rows and self.formatter == "table":
            return  # rabbitmqctl prints no column header for an empty listing
        if not self.silent:
            click.echo("\t".join(columns))
        for r in rows:
            click.echo("\t".join(table_cell(c, r.get(c)) for c in columns))

    def document(self, doc: Any, text: str) -> None:
        """A single result: JSON with --formatter json, else the given text."""
        if self.formatter == "json":
            click.echo(json.dumps(doc, indent=1))
        else:
            click.echo(text)
