"""Configuration: one dataclass per section, verl's key names, YAML + dotted overrides."""

from relm.config.schema import RelmConfig

__all__ = ["RelmConfig"]
