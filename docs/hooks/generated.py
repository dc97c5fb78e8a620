"""MkDocs hook: parts of pages generated from the code, so they cannot drift from it.

Two markers, each on a line of its own, are replaced when a page is built:

- ``<!-- compat-differences:NAME -->``: a table of the ``Difference`` entries of the tuple
  ``tpuslice._tpu.compat.NAME`` (``SUBSLICE_DIFFERENCES``, ``QUEUE_DIFFERENCES``).
- ``<!-- cli-reference -->``: every ``tpuslice`` subcommand, from the click commands
  themselves (usage, help, arguments, options with their defaults).

Registered in mkdocs.yml under ``hooks:``; tests/test_docs.py calls these functions too.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import click

DIFFERENCES_MARKER = re.compile(r"^<!-- compat-differences:(\w+) -->$", re.MULTILINE)
CLI_MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace the markers of one page (MkDocs calls this for every page).

    Args:
        markdown: The page's Markdown source.
        **kwargs: ``page``, ``config`` and ``files`` (unused).

    Returns:
        The Markdown with every marker replaced.
    """
    markdown = DIFFERENCES_MARKER.sub(lambda m: differences_table(m.group(1)), markdown)
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


def cell(text: str) -> str:
    """Text made safe for one cell of a Markdown table.

    Args:
        text: Any text.

    Returns:
        It on one line, with ``|`` escaped.
    """
    return " ".join(text.split()).replace("|", "\\|")


def differences_table(name: str) -> str:
    """The table of ``tpuslice._tpu.compat.<name>``.

    Args:
        name: A tuple of ``Difference`` in :mod:`tpuslice._tpu.compat`.

    Returns:
        A Markdown table: situation, Ray 2.60, tpuslice, the test that shows it.

    Raises:
        ValueError: ``tpuslice._tpu.compat`` has no such tuple of differences.
    """
    from tpuslice._tpu import compat

    entries = getattr(compat, name, None)
    if not isinstance(entries, tuple) or not all(isinstance(e, compat.Difference) for e in entries):
        raise ValueError(f"tpuslice._tpu.compat.{name} is not a tuple of Difference")
    rows = [
        "| Situation | Ray 2.60 `ray.util.tpu` | tpuslice | Shown by |",
        "|---|---|---|---|",
    ]
    for d in entries:
        rows.append(f"| {cell(d.what)} | {cell(d.ray)} | {cell(d.ours)} | `{cell(d.shown_by)}` |")
    return "\n".join(rows)


def cli_reference() -> str:
    """Every subcommand of ``tpuslice``, as Markdown sections.

    Returns:
        One ``###`` section for ``tpuslice`` itself, then one per command, in name order.
    """
    from tpuslice.cli.commands import main

    root = click.Context(main, info_name="tpuslice")
    sections = [command_section(main, root)]
    for name in main.list_commands(root):
        command = main.get_command(root, name)
        if command is None or command.hidden:
            continue
        sections.append(
            command_section(command, click.Context(command, parent=root, info_name=name))
        )
    return "\n\n".join(sections)


def command_section(command: click.Command, ctx: click.Context) -> str:
    """One command: usage line, help text, arguments and options.

    Args:
        command: The click command.
        ctx: Its context (its ``info_name`` is the command's name).

    Returns:
        A Markdown section.
    """
    path = ctx.command_path
    usage = f"{path} {' '.join(command.collect_usage_pieces(ctx))}".rstrip()
    lines = [f"### `{path}`", "", "```text", usage, "```", ""]
    if command.help:
        lines += [inspect.cleandoc(command.help), ""]
    arguments = [p for p in command.get_params(ctx) if isinstance(p, click.Argument)]
    if arguments:
        lines.append("Arguments:")
        lines.append("")
        for argument in arguments:
            required = "required" if argument.required else "optional"
            many = ", any number" if argument.nargs == -1 else ""
            lines.append(f"- `{metavar(argument, ctx)}` ({required}{many})")
        lines.append("")
    records = [
        p.get_help_record(ctx)
        for p in command.get_params(ctx)
        if isinstance(p, click.Option) and p.name != "help" and not p.hidden
    ]
    options = [r for r in records if r is not None]
    if options:
        lines += ["Options:", ""]
    for flags, help_text in options:
        lines.append(f"- `{flags}`: {' '.join(help_text.split())}")
    return "\n".join(lines).rstrip()


def metavar(argument: click.Argument, ctx: click.Context) -> str:
    """An argument's metavar (``COMMAND...``), whatever the click version.

    Args:
        argument: The argument.
        ctx: Its command's context.

    Returns:
        The metavar as ``--help`` shows it.
    """
    try:
        return argument.make_metavar(ctx)  # click >= 8.2
    except TypeError:
        return argument.make_metavar()  # type: ignore[call-arg]  # click 8.1
