#!/usr/bin/env python
"""Steps per hour of asynchronous training against synchronous, on a task whose response lengths have a long
tail (issue 32's CPU measurement).

The task: the demo with GRPO and room for 224 response tokens. Its freshly initialised policy stops where it
samples the end token, so lengths spread from 1 token to the 224 cap (mean about 90, about 10% cut at the
cap): a synchronous step waits for its longest response and then for the update, while the rollout process
of an asynchronous run generates the next step during this step's update. Each run gets one torch thread
per process (`OMP_NUM_THREADS=1`), so on a 2-core machine the asynchronous run's two processes have a core
each, and the synchronous run one core. Runs one after the other; steps 2..N count (step 1 carries start-up).

Usage (repository root): .venv/bin/python bench/async_long_tail.py [--steps 20] [--bounds 1,2] [--out DIR] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TASK = [
    "algorithm.adv_estimator=grpo",
    "data.max_response_length=224",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.logger=[console]",
]


def run(name: str, extra: list[str], steps: int, out: Path) -> dict[str, float | str]:
    folder = out / name
    command = [sys.executable, "-c", "import sys; from relm.cli import main; sys.exit(main())", "train",
               *TASK, f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={folder}", *extra]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if r.get("step", 0) >= 2 and "timing_s/step" in r]
    seconds = sum(r["timing_s/step"] for r in timed)
    lengths = [r["response_length/mean"] for r in timed]
    row: dict[str, float | str] = {
        "run": name,
        "steps": len(timed),
        "seconds": round(seconds, 1),
        "steps_per_hour": round(3600 * len(timed) / seconds),
        "wall_s": round(wall, 1),
        "response_length_mean": round(statistics.mean(lengths), 1),
        "response_length_max": max(r["response_length/max"] for r in timed),
        "clip_ratio_mean": round(statistics.mean(r["response_length/clip_ratio"] for r in timed), 3),
        "gen_s": round(sum(r.get("timing_s/gen", 0.0) for r in timed), 1),
        "update_actor_s": round(sum(r.get("timing_s/update_actor", 0.0) for r in timed), 1),
    }
    for key in ("fully_async/trainer_wait_s", "fully_async/rollouter_wait_s", "fully_async/staleness/max"):
        if any(key in r for r in timed):
            row[key] = (
                round(sum(r.get(key, 0.0) for r in timed), 2)
                if key.endswith("_s")
                else max(r.get(key, 0.0) for r in timed)
            )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--bounds", default="1", help="staleness thresholds of the asynchronous runs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="outputs/async-long-tail")
    parser.add_argument(
        "--device", default="cpu", help="trainer.device of every run (cpu: the issue's measurement)"
    )
    args = parser.parse_args()
    out = Path(args.out)
    seed = [f"seed={args.seed}", f"trainer.device={args.device}"]
    rows = [run("sync", seed, args.steps, out)]
    for bound in args.bounds.split(","):
        async_keys = ["async_training.enable=true", f"async_training.staleness_threshold={bound}"]
        rows.append(run(f"async-{bound}", seed + async_keys, args.steps, out))
    base = float(rows[0]["steps_per_hour"])
    for row in rows:
        row["speed_up"] = round(float(row["steps_per_hour"]) / base, 2)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
