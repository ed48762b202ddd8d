"""`relm compat`: does a model load, generate and train under relm, and under which conditions.

The package imports nothing itself, so `relm compat --help` prints without torch: the check is in
`relm.compat.checks` (`CompatOptions`, `check_model`), the report in `relm.compat.report`.
"""
