"""What the `astraflow` command line prints through: `console` (stderr: progress, warnings and
errors) and `out` (stdout: the result a script reads, e.g. a bootstrap address), and `fail`, the
error exit. Shared by cli.py and broker_cli.py.
"""

from __future__ import annotations

import typer
from rich.console import Console

console = Console(stderr=True)
out = Console()


def fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)
