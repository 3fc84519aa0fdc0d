"""`docs/reference/cli.md`: every `impalajob` command and flag, walked from the parser `impalajob`
builds (`impala_cli.main.build_parser`) rather than from argparse's formatted help, which wraps
to the terminal's width: a synopsis, then one row per argument (value, default, help). Flags an
argument hides (`help=SUPPRESS`) stay hidden here too.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from impala_cli.reference.markdown import REGENERATE, anchor, cell, code, literal, table

_TYPES: dict[Any, str] = {int: "integer", float: "number", str: "string", Path: "path"}


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order `impalajob --help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
    ]


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return " ".join(action.metavar) if isinstance(action.metavar, tuple) else action.metavar
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _values(action: argparse.Action) -> str:
    """What follows the flag in a synopsis: `FILE`, `[NAME]`, `X [X ...]`, or nothing."""
    if action.nargs == 0:
        return ""
    name = _metavar(action)
    return {"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]"}.get(
        str(action.nargs), name
    )


def _usage_part(action: argparse.Action) -> str:
    if not action.option_strings:
        return _values(action)
    flag = (
        " | ".join(action.option_strings)
        if isinstance(action, argparse.BooleanOptionalAction)
        else action.option_strings[0]
    )
    return " ".join(p for p in (flag, _values(action)) if p)


def _synopsis(parser: argparse.ArgumentParser) -> str:
    groups = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    parts, seen = [parser.prog], set()
    for action in _visible(parser):
        group = groups.get(id(action))
        if group is not None:
            if id(group) in seen:
                continue
            seen.add(id(group))
            inner = " | ".join(
                _usage_part(a) for a in group._group_actions if a.help != argparse.SUPPRESS
            )
            parts.append(f"({inner})" if group.required else f"[{inner}]")
        elif action.required:
            parts.append(_usage_part(action))
        elif action.option_strings:
            parts.append(f"[{_usage_part(action)}]")
        else:
            parts.append(_values(action))  # `[NAME]` already
    return " ".join(parts)


def _type_name(convert: Any) -> str:
    """`integer` for int; for a converter of our own, its name and what it returns
    (`_positive(text) -> int`: `positive integer`)."""
    if convert is None or convert in _TYPES:
        return _TYPES.get(convert, "")
    try:
        returns = typing.get_type_hints(convert).get("return")
    except (NameError, TypeError):
        returns = None
    name = getattr(convert, "__name__", "").strip("_").replace("_", "-")
    return " ".join(p for p in (name, _TYPES.get(returns, "")) if p)


def _value_cell(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices is not None and action.metavar is None:
        text = "one of " + ", ".join(literal(str(c)) for c in action.choices)
    else:
        text = code(_metavar(action))
        kind = _type_name(action.type)
        if kind:
            text += f" ({kind})"
    if isinstance(action, argparse._AppendAction | argparse._CountAction):
        text += ", repeatable"
    return text


def _default_cell(action: argparse.Action) -> str:
    value = action.default
    if action.required:
        return "required"
    if value is None or value == argparse.SUPPRESS or value == []:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    return literal(value if isinstance(value, int | float | str) else str(value))


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        text = text % {**vars(action), "prog": prog}
    return cell(text)


def _command_section(name: str, help_text: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [
        f"## {code(parser.prog)}",
        "",
        cell(parser.description or help_text),
        "",
        "```",
        _synopsis(parser),
        "```",
        "",
    ]
    rows = [
        (
            ", ".join(code(o) for o in a.option_strings) or code(_metavar(a)),
            "" if not a.option_strings and a.choices is None else _value_cell(a),
            _default_cell(a),
            _help(a, parser.prog),
        )
        for a in _visible(parser)
    ]
    if rows:
        lines += [*table(("Argument", "Value", "Default", "Description"), rows), ""]
    for group in parser._mutually_exclusive_groups:
        flags = [code(a.option_strings[0]) for a in group._group_actions if a.option_strings]
        lines += [f"{' and '.join(flags)} exclude each other.", ""]
    return lines


def render_cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The command reference page for `parser` (`impalajob`'s, every subcommand registered,
    unless given)."""
    if parser is None:
        from impala_cli.main import COMMANDS, build_parser

        parser = build_parser(COMMANDS)
    commands = list(_subcommands(parser))
    lines = [
        f"# {code(parser.prog)} command reference",
        "",
        f"Generated by `{REGENERATE}` from the argument parsers `{parser.prog}` builds; do not "
        "edit.",
        "",
        cell(parser.description or ""),
        "",
        *table(
            ("Command", "What it does"),
            [
                (f"[{code(name)}](#{anchor(code(sub.prog))})", cell(help_text))
                for name, help_text, sub in commands
            ],
        ),
        "",
        "Every command also takes `-h`/`--help`. Synopses: `[...]` optional, `A | B` one of them.",
        "",
    ]
    for name, help_text, sub in commands:
        lines += _command_section(name, help_text, sub)
    return "\n".join(lines).rstrip("\n") + "\n"
