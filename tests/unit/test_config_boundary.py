"""Only the entry points speak verl's config language (issue 28): outside relm/config/, a module that imports
`relm.config.schema` (where `RelmConfig` and its sections live) is an entry point or is on the shrinking list
below. Every other component is built from its spec (`relm.config.specs`), translated once by
`relm.config.translate`."""

from __future__ import annotations

from tests.unit.test_import_layers import REPO, all_imports

SCHEMA = "relm.config.schema"

ENTRY_POINTS = {
    "relm.trainer.main_ppo",
    "relm.trainer.train_command",
    "relm.compat.cli",
    "relm.bench.update",
    "relm.bench.peer_trl",
    "relm.trainer.run_config",
}
"""The commands: they load the config, check it and translate it (`trainer.run_config` is `relm train`'s record
of the config as the user wrote it, for the run folder and the checks of a resume)."""

PENDING = {
    "relm.trainer.components",
}
"""Modules still reading `RelmConfig` or a schema section, to be moved onto specs; an entry leaves this set
when its module stops importing the schema (the test below fails until it does)."""


def _importers() -> set[str]:
    return {
        edge.source
        for edge in all_imports(REPO)
        if edge.target == SCHEMA
        and edge.source != "relm.config"
        and not edge.source.startswith("relm.config.")
    }


def test_only_entry_points_and_the_pending_list_import_the_schema():
    """And the pending list only shrinks: an entry whose module no longer imports the schema is stale
    (remove it, so it cannot come back)."""
    importers = _importers()
    assert sorted(importers - ENTRY_POINTS - PENDING) == []
    assert sorted(PENDING - importers) == []
