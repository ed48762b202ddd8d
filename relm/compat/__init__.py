"""`relm compat`: does a model load, generate and train under relm, and under which conditions."""

from relm.compat.checks import CompatOptions, check_model
from relm.compat.report import ModelReport, StageResult

__all__ = ["CompatOptions", "ModelReport", "StageResult", "check_model"]
