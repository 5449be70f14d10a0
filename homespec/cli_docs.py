"""Render docs/CLI.md from the click commands' own --help (a test keeps the file in sync).

python -m homespec.cli_docs > docs/CLI.md
"""

from __future__ import annotations

import click

from homespec.cli import cli


def _walk(cmd: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            found += _walk(cmd.commands[name], [*path, name])
    return found


def render() -> str:
    parts = [
        "# homespec command reference",
        "",
        "Generated from `--help` by `python -m homespec.cli_docs > docs/CLI.md`; "
        "a test fails when it is out of date.",
    ]
    for path, cmd in _walk(cli, ["homespec"]):
        ctx = click.Context(
            cmd, info_name=" ".join(path), terminal_width=100, help_option_names=["-h", "--help"]
        )
        parts += ["", f"## {' '.join(path)}", "", "```", cmd.get_help(ctx), "```"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(render(), end="")
