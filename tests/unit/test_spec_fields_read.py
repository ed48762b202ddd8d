"""Every spec field is read by the code that runs: a field of `relm/config/specs.py` that nothing outside
`relm/config/` reads would make the keys that set it (`relm.config.key_table`) act in the table only.

With tests/unit/test_key_table.py (every schema key sets a spec field, warns or is refused, and each key
that sets one changes it) this replaces the walk over the schema's fields that once caught keys read
nowhere (`ref.log_prob_micro_batch_size_per_gpu`, `critic.forward_micro_batch_size_per_gpu`): the schema is
read by the translation now, the specs by the components. The walk is by attribute name (`x.field` anywhere
in `relm/` outside `relm/config/`): it cannot tell two specs' fields of the same name apart, but it catches a
field read nowhere.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import relm
from relm.config import specs

RELM = Path(relm.__file__).parent


def attributes_read_outside_config() -> set[str]:
    names: set[str] = set()
    for path in RELM.rglob("*.py"):
        if path.relative_to(RELM).parts[0] == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
    return names


def spec_fields() -> list[str]:
    return [
        f"{cls.__name__}.{field.name}"
        for cls in vars(specs).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == specs.__name__
        for field in dataclasses.fields(cls)
    ]


def test_every_spec_field_is_read_outside_config():
    read = attributes_read_outside_config()
    fields = spec_fields()
    assert len(fields) > 100  # the walk found the specs
    unread = sorted(f for f in fields if f.split(".")[1] not in read)
    assert not unread, f"spec fields read nowhere outside relm/config/ (wire them): {unread}"
