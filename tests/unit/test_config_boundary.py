"""Only the entry points speak verl's config language (issue 28): outside relm/config/, a module that imports
`relm.config.schema` (where `RelmConfig` and its sections live) is an entry point. Every other component is built from its spec (`relm.config.specs`), translated once by
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


def _importers() -> set[str]:
    return {
        edge.source
        for edge in all_imports(REPO)
        if edge.target == SCHEMA
        and edge.source != "relm.config"
        and not edge.source.startswith("relm.config.")
    }


def test_only_entry_points_import_the_schema():
    """A component that needs a config value reads its spec; a new importer of the schema is either a new
    command (add it to ENTRY_POINTS) or a component that should take a spec."""
    assert sorted(_importers() - ENTRY_POINTS) == []
