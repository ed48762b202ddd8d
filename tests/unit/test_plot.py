"""curves.png from metrics.jsonl, directly and through `relm plot`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from relm.cli import main as relm_main
from relm.trainer.plot import draw_figure, plot_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, num_steps: int = 6) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [{"step": 0, "val-core/relm/letters/reward/mean@1": 0.1}]
    for step in range(1, num_steps + 1):
        records.append(
            {
                "step": step,
                "critic/score/mean": step / num_steps,
                "actor/ppo_kl": 0.01 * step,
                "actor/entropy": "nan" if step == 3 else 4.0 - step / 10,  # NaN is stored as a string
                "response_length/mean": 8.0,
                "perf/throughput": 1000.0 + step,
            }
        )
    lines = [json.dumps(r) for r in records]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 7, "crit')  # a cut last line


def test_png_is_written_and_readable(tmp_path: Path):
    write_run(tmp_path)
    out = plot_curves(tmp_path)
    assert out == tmp_path / "curves.png"
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(out) as image:
        image.verify()
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 800 and image.size[1] > 400
    assert not list(tmp_path.glob("*.tmp"))


def test_relm_plot_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    write_run(tmp_path / "run")
    target = tmp_path / "elsewhere.png"
    assert relm_main(["plot", str(tmp_path / "run"), "--out", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert target.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("content", [None, ""])
def test_a_folder_without_steps_is_one_error_line(tmp_path: Path, capsys, content: str | None):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    assert relm_main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "metrics.jsonl" in err[0]


def test_short_runs_get_whole_step_ticks_no_offset_and_named_kls():
    records = [
        {
            "step": s,
            "actor/kl_loss": 0.001,
            "actor/ppo_kl": 0.0002,
            "response_length/mean": 1000.001 + s * 1e-6,
        }
        for s in (1, 2, 3)
    ]
    fig = draw_figure(records, "t")
    FigureCanvasAgg(fig).draw()  # tick positions and offsets are settled by drawing
    axes = {ax.get_title(): ax for ax in fig.axes}
    for ax in axes.values():
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
    length_axis = axes["response length (tokens)"].yaxis
    assert length_axis.get_major_formatter().get_offset() == ""
    legend = [t.get_text() for t in axes["KL"].get_legend().get_texts()]
    assert legend == [
        "actor/kl_loss: KL to the reference (loss term)",
        "actor/ppo_kl: old vs new policy (one update)",
    ]
