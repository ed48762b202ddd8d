"""Write the generated parts of docs/configuration.md from the code that defines them.

The key reference comes from the schema's field docstrings and defaults, the allowed values from
`relm.config.validate`, the ignored verl keys from `relm.config.verl_keys`, the demo preset from
`demo.yaml`. Generating them keeps the page from drifting: a test fails when the page is stale.

Usage: `python -m relm.config.docs_gen` rewrites the page; `--check` exits 1 when it is stale.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from relm.config import schema, validate, verl_keys
from relm.config.loader import DEMO_PRESET

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

_BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z-]+) -->\n).*?(<!-- /generated:(?P=name) -->)", re.DOTALL)


def field_docs() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the docstring written under that field in schema.py."""
    docs: dict[tuple[str, str], str] = {}
    for node in ast.parse(inspect.getsource(schema)).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt, following in zip(node.body, node.body[1:], strict=False):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                docs[(node.name, stmt.target.id)] = str(following.value.value).strip()
    return docs


def render_keys() -> str:
    """One table per section: key, type, default, meaning."""
    docs = field_docs()
    out: list[str] = []
    top_rows: list[str] = []
    sections: list[tuple[str, Any]] = []
    for field in dataclasses.fields(schema.RelmConfig):
        value = getattr(schema.RelmConfig(), field.name)
        if dataclasses.is_dataclass(value):
            sections.append((field.name, value))
        else:
            top_rows.append(_row(field.name, field, value, docs[("RelmConfig", field.name)]))
    out += ["### Top level", "", *_table(top_rows), ""]
    while sections:
        prefix, instance = sections.pop(0)
        rows, nested = [], []
        for field in dataclasses.fields(instance):
            value = getattr(instance, field.name)
            dotted = f"{prefix}.{field.name}"
            if dataclasses.is_dataclass(value):
                nested.append((dotted, value))
            else:
                rows.append(_row(dotted, field, value, docs[(type(instance).__name__, field.name)]))
        sections[:0] = nested  # depth-first, so a subsection follows its parent
        if rows:
            summary = (type(instance).__doc__ or "").strip().splitlines()[0]
            out += [f"### `{prefix}`", "", summary, "", *_table(rows), ""]
    return "\n".join(out).rstrip() + "\n"


def render_choices() -> str:
    """The allowed values of every key checked against a fixed set."""
    rows = [
        ("`algorithm.adv_estimator`", validate.ADV_ESTIMATORS),
        ("`algorithm.kl_penalty`, `actor_rollout_ref.actor.kl_loss_type`", validate.KL_ESTIMATORS),
        ("`algorithm.kl_ctrl.type`", validate.KL_CTRL_TYPES),
        ("`actor_rollout_ref.actor.loss_agg_mode`, `critic.loss_agg_mode`", validate.LOSS_AGG_MODES),
        ("`actor_rollout_ref.actor.policy_loss.loss_mode`", validate.POLICY_LOSS_MODES),
        ("`actor_rollout_ref.actor.strategy`, `critic.strategy`", validate.STRATEGIES),
        ("`*.optim.warmup_style`", validate.WARMUP_STYLES),
        ("`actor_rollout_ref.model.dtype`", validate.MODEL_DTYPES),
        ("`actor_rollout_ref.rollout.name`", validate.ROLLOUT_ENGINES),
        ("`actor_rollout_ref.rollout.dtype`", validate.ROLLOUT_DTYPES),
        ("`data.truncation`", validate.TRUNCATION_MODES),
        ("`reward_model.reward_manager`", validate.REWARD_MANAGERS),
        ("`trainer.device`", validate.DEVICES),
        ("`trainer.logger` (each entry)", validate.LOGGERS),
        ("`trainer.resume_mode`", validate.RESUME_MODES),
    ]
    lines = ["| Key | Allowed values |", "| --- | --- |"]
    lines += [f"| {key} | {', '.join(f'`{v}`' for v in values)} |" for key, values in rows]
    not_yet = ", ".join(f"`{name}`" for name in validate.LOGGERS_NOT_YET)
    lines += [
        "",
        f"Logger names verl knows that relm does not provide yet (dropped with a warning line): {not_yet}.",
    ]
    return "\n".join(lines) + "\n"


def render_accepted() -> str:
    """The verl keys relm ignores, with the reason, and those that are an error when switched on."""
    lines = ["| verl key | Why relm ignores it |", "| --- | --- |"]
    lines += [f"| `{key}` | {reason} |" for key, reason in verl_keys.ACCEPTED_UNUSED.items()]
    lines += ["", "Accepted only at their off value (`false`, `0` or `null`); anything else is an error:", ""]
    lines += [f"- `{key}`: {reason}" for key, reason in verl_keys.UNSUPPORTED_WHEN_ENABLED.items()]
    return "\n".join(lines) + "\n"


def render_demo() -> str:
    """The demo preset file, verbatim."""
    return f"```yaml\n{DEMO_PRESET.read_text().rstrip()}\n```\n"


def update_document(text: str) -> str:
    """Replace every generated block in `text` with its current rendering."""
    renderers = {
        "keys": render_keys,
        "choices": render_choices,
        "accepted": render_accepted,
        "demo": render_demo,
    }

    def replace(match: re.Match[str]) -> str:
        return match.group(1) + renderers[match.group("name")]() + match.group(3)

    return _BLOCK.sub(replace, text)


def _row(dotted: str, field: dataclasses.Field[Any], default: Any, doc: str) -> str:
    type_text = str(field.type).replace("|", "\\|")
    return f"| `{dotted}` | `{type_text}` | `{_yaml(default)}` | {doc} |"


def _table(rows: list[str]) -> list[str]:
    return ["| Key | Type | Default | Meaning |", "| --- | --- | --- | --- |", *rows]


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_yaml(item)}" for key, item in value.items()) + "}"
    return str(value)


def main(argv: list[str]) -> int:
    """Rewrite docs/configuration.md, or with `--check` report whether it is stale."""
    current = DOC_PATH.read_text()
    updated = update_document(current)
    if "--check" in argv:
        if updated != current:
            print(f"{DOC_PATH} is stale; run `python -m relm.config.docs_gen`")
            return 1
        return 0
    DOC_PATH.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
