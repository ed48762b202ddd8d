"""Every config key the docs name exists: in the schema, or among verl's accepted keys.

docs/configuration.md is the reference; the other pages and the README name keys in their prose, and a
renamed or removed key must not live on there either.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from pathlib import Path

from relm.config import verl_keys, verl_renames
from relm.config.lookup import section_keys
from relm.config.schema import RelmConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
SECTIONS = tuple(f.name for f in dataclasses.fields(RelmConfig))
# `section.key`, `section.key=value`, `*.optim.lr`: a dotted name inside backticks.
DATA_COLUMNS = {"reward_model.ground_truth"}
"""Dotted names of data columns (verl's data format) that read like keys."""
KEY = re.compile(r"`(\*|[a-z_]+)((?:\.[A-Za-z0-9_*]+)+)(?:=[^`]*)?`")


def named_keys(text: str) -> set[str]:
    """Dotted keys in backticks, except on lines that show the unknown-key error (a misspelt example)."""
    keys = set()
    shown = "\n".join(line for line in text.splitlines() if "unknown key" not in line)
    for match in KEY.finditer(shown):
        head, rest = match.group(1), match.group(2)
        if head in SECTIONS or head == "*":
            keys.add(head + rest)
    return keys


def exists(key: str, schema_keys: list[str]) -> bool:
    sections = {k.rsplit(".", i)[0] for k in schema_keys for i in range(1, k.count(".") + 1)}
    if key in verl_keys.ACCEPTED_UNUSED or key in verl_keys.UNSUPPORTED_WHEN_ENABLED:
        return True
    if any(key == section or key.startswith(section + ".") for section in verl_renames.RENAMED_SECTIONS):
        return True  # verl's spelling, folded into relm's keys when the config loads
    if any(key.startswith(k + ".") for k in schema_keys):
        return True  # an entry of a dict-valued key (`data.apply_chat_template_kwargs.date_string`)
    if "*" in key:
        pattern = key.replace(".*", ".?*") if not key.startswith("*") else key
        return any(fnmatch.fnmatchcase(k, pattern) for k in [*schema_keys, *sections])
    return key in schema_keys or key in sections or verl_keys.match_accepted(key) is not None


def test_every_key_configuration_md_names_exists():
    schema_keys = section_keys(RelmConfig(), "")
    keys = named_keys((DOCS / "configuration.md").read_text()) - DATA_COLUMNS
    assert len(keys) > 100  # the generated tables name every schema key
    missing = sorted(k for k in keys if not exists(k, schema_keys))
    assert not missing, f"docs/configuration.md names keys relm does not have: {missing}"


def test_every_key_the_other_docs_and_the_readme_name_exists():
    schema_keys = section_keys(RelmConfig(), "")
    for page in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        missing = sorted(k for k in named_keys(page.read_text()) - DATA_COLUMNS if not exists(k, schema_keys))
        assert not missing, f"{page.name} names keys relm does not have: {missing}"


def test_the_check_catches_a_misspelt_key():
    schema_keys = section_keys(RelmConfig(), "")
    assert named_keys("set `data.max_prompt_lenght=5` or `trainer.nope`") == {
        "data.max_prompt_lenght",
        "trainer.nope",
    }
    assert not exists("data.max_prompt_lenght", schema_keys)
    assert exists("*.optim.lr", schema_keys) and exists("actor_rollout_ref.rollout", schema_keys)
