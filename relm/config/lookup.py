"""`relm config KEY`: a key's type, default and meaning, read from the schema; and `relm train --help`.

The answers come from the same places as docs/configuration.md (the schema's dataclasses and the
docstring under each field, verl_keys' table of accepted-but-unused keys), so the command line and the
page never disagree and a new key is documented everywhere by writing its docstring once.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from typing import Any

from relm.config import verl_keys
from relm.config.docs_gen import field_docs
from relm.config.schema import RelmConfig
from relm.errors import UserError, run_guarded


def _node_at(dotted: str) -> tuple[Any, str] | None:
    """The schema's value at `dotted` (a section instance or a leaf default) and its owner class name."""
    node: Any = RelmConfig()
    owner = "RelmConfig"
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(node) or part not in {f.name for f in dataclasses.fields(node)}:
            return None
        owner = type(node).__name__
        node = getattr(node, part)
    return node, owner


def _type_text(owner_cls: type, name: str) -> str:
    hint = typing.get_type_hints(owner_cls)[name]
    return (
        str(hint).replace("typing.", "") if typing.get_origin(hint) else getattr(hint, "__name__", str(hint))
    )


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) and value == "" else str(value)


def section_keys(section: Any, prefix: str) -> list[str]:
    """The dotted names of every leaf under a section instance, in schema order."""
    keys: list[str] = []
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        if dataclasses.is_dataclass(value):
            keys += section_keys(value, f"{prefix}{field.name}.")
        else:
            keys.append(prefix + field.name)
    return keys


def describe_key(dotted: str) -> str:
    """What `relm config KEY` prints: type, default and meaning of a key, or the keys of a section.

    Raises:
        UserError: the key is neither in the schema nor one of verl's accepted keys.
    """
    dotted = dotted.strip().lstrip("+")
    if not dotted:
        return "\n".join(_section_lines())
    found = _node_at(dotted)
    if found is not None:
        value, owner = found
        if dataclasses.is_dataclass(value):
            summary = (type(value).__doc__ or "").strip().splitlines()[0]
            keys = section_keys(value, f"{dotted}.")
            return "\n".join([f"{dotted}: {summary}", *(f"  {key}" for key in keys)])
        owner_cls = getattr(sys.modules[RelmConfig.__module__], owner)
        doc = field_docs().get((owner, dotted.rsplit(".", 1)[-1]), "")
        return "\n".join(
            [
                dotted,
                f"  type:    {_type_text(owner_cls, dotted.rsplit('.', 1)[-1])}",
                f"  default: {_show(value)}",
                *(f"  {line.strip()}" for line in doc.splitlines()),
            ]
        )
    pattern = verl_keys.match_accepted(dotted)
    if pattern is not None:
        reason = verl_keys.ACCEPTED_UNUSED[pattern]
        return f"{dotted}\n  a verl key relm accepts and does not use: {reason}"
    known = section_keys(RelmConfig(), "")
    close = difflib.get_close_matches(dotted, known, n=1, cutoff=0.6)
    hint = f"did you mean `{close[0]}`?" if close else "`relm config` lists the sections"
    raise UserError(f"unknown key `{dotted}`; {hint}")


def _section_lines() -> list[str]:
    cfg, docs = RelmConfig(), field_docs()
    lines = ["config sections:"]
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        label = field.name if dataclasses.is_dataclass(value) else f"{field.name} (key)"
        lines.append(f"  {label:<24} {docs.get(('RelmConfig', field.name), '')}")
    return lines


def train_help() -> str:
    """`relm train --help`: the command line, the config sections and how to look a key up."""
    lines = [
        "usage: relm train [--config FILE.yaml] [section.key=value ...]",
        "       python -m relm.trainer.main_ppo [--config FILE.yaml] [section.key=value ...]",
        "",
        "Run PPO-family training. Keys follow verl's config; later overrides win over the file.",
        "With no data.train_files the built-in demo task runs.",
        "",
        *_section_lines(),
        "",
        "look up a key:  relm config KEY       e.g. relm config data.max_prompt_length",
        "list a section: relm config SECTION   e.g. relm config actor_rollout_ref.rollout",
        "every key with its default and meaning: docs/configuration.md",
    ]
    return "\n".join(lines)


def config_command(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(
            "usage: relm config [KEY ...]\n\nPrint each key's type, default and meaning "
            "(a section lists its keys; no KEY lists the sections)."
        )
        return 0
    for index, key in enumerate(argv or [""]):
        print(("\n" if index else "") + describe_key(key))
    return 0


def main(argv: list[str]) -> int:
    """`relm config [KEY ...]`: exit 0 with the answers printed, 2 on an unknown key."""
    return run_guarded(lambda: config_command(argv))
