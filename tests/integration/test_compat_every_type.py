"""`relm compat` on a tiny model of every type in the installed transformers' causal-LM mapping, on the
native and HF engines (`make test-compat-types`, which `.ci/run` calls; `make test` deselects it: about
6 minutes on the 2-core CI machine, 20-25 minutes on a shared one).

Every type ends in a verdict: pass, conditional, a failure or a refusal with one line that says why,
never a crashed worker, a traceback or an internal error; the newest architectures users ask for pass;
and docs/models.md's table says what this run found."""

from __future__ import annotations

from pathlib import Path

import pytest

from relm.compat.sweep import ENGINES, counts, docs_table_rows, markdown_table, run_sweep
from relm.models.tiny_types import causal_lm_types

pytestmark = pytest.mark.every_type

DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"
MUST_PASS = (
    "qwen3_next",
    "qwen3_5_text",
    "qwen3_5",
    "deepseek_v32",
    "gemma3_text",
    "gemma4_text",
    "llama",
    "mamba",
    "jamba",
    "rwkv",  # its forward does not read the attention mask: rows run left-aligned
)


def test_every_causal_lm_type_passes_or_is_refused_in_one_line(tmp_path):
    types = causal_lm_types()
    results = {r.model_type: r for r in run_sweep(types, ENGINES, num_workers=2, stage_timeout_s=120.0)}
    assert sorted(results) == types
    for result in results.values():
        if result.built != "yes":
            assert "\n" not in result.built and result.built, result.model_type
            continue
        for engine, verdict in result.verdicts.items():
            note = result.notes.get(engine, "")
            assert verdict in ("pass", "conditional", "fail", "unsupported"), (
                result.model_type,
                engine,
                note,
            )
            assert "internal error" not in note and "Traceback" not in note and "\n" not in note
            if verdict in ("fail", "unsupported"):
                assert note, (result.model_type, engine)
    for model_type in MUST_PASS:
        assert results[model_type].verdicts["default"] in ("pass", "conditional"), results[model_type]
        assert results[model_type].verdicts["native"] in ("pass", "conditional"), results[model_type]
    tally = counts(list(results.values()))
    failed = {t: r.notes.get("default") for t, r in results.items() if r.verdicts.get("default") == "fail"}
    # 141 of 141 run, 2026-12-06
    assert tally.get("pass", 0) + tally.get("conditional", 0) >= 141, (tally, failed)
    (tmp_path / "table.md").write_text(markdown_table(list(results.values()), ENGINES))
    documented = docs_table_rows(DOCS)
    found = {t: cells for t, cells in docs_table_rows_from(tmp_path / "table.md").items()}
    assert documented == found, "docs/models.md's table is out of date: run `make compat-types-docs`"


def docs_table_rows_from(path: Path) -> dict[str, list[str]]:
    from relm.compat.sweep import DOCS_BEGIN, DOCS_END

    wrapped = path.parent / "wrapped.md"
    wrapped.write_text(f"{DOCS_BEGIN}\n{path.read_text()}\n{DOCS_END}\n")
    return docs_table_rows(wrapped)
