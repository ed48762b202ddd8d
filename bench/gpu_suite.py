"""Budgeted `relm compat` runs side by side on one machine, for the models-on-the-cards-users-have tables.

Each job is one model under a GPU and a host budget (`--max-gpu-memory-gb`, `--max-host-memory-gb`): the
budgets are what make several compat processes safe on one H200, so the scheduler starts a job only while
the budgets of the jobs running with it add up to at most the card's memory and the host's. A job whose own
budgets exceed the machine can never run: the whole suite is refused in one line before anything starts.
Jobs start in the order given (first fit), so a long job at the head of one budget class does not hold up
the small ones behind it.

The device call has a fixed length, so `--deadline-s` bounds the whole suite: no job starts in its last
`--min-start-s` seconds, and whatever still runs at the deadline is killed and recorded as such (the next
call passes the models that did not finish).

Usage (repository root; relm importable):
    python bench/gpu_suite.py --out DIR --deadline-s 500 80:100=zoo:Qwen/Qwen2.5-7B-Instruct,... 24:32=...
Each SET is GPU_GB:HOST_GB=MODEL[,MODEL...]. A CPU dry run: add `--device cpu --gpu-gb 48 --host-gb 20`
with zoo:tiny models. Writes DIR/suite.jsonl (one row per job), DIR/suite.md (the table) and
DIR/logs.tar.gz (each job's log and compat JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Leaves the card's allocator and the host a margin the budgets do not count: CUDA contexts of each
# process (about 0.5 GB), the page cache of the weights being read.
GPU_RESERVE_GB = 4.0
HOST_RESERVE_GB = 4.0


@dataclass
class Job:
    model: str
    gpu_gb: float
    host_gb: float
    name: str = ""
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    row: dict[str, Any] = field(default_factory=dict)


def parse_sets(sets: list[str]) -> list[Job]:
    jobs: list[Job] = []
    for item in sets:
        budgets, _, models = item.partition("=")
        gpu, _, host = budgets.partition(":")
        if not models or not host:
            raise SystemExit(f"error: set {item!r} is not GPU_GB:HOST_GB=MODEL[,MODEL...]")
        for model in filter(None, models.split(",")):
            safe = model.removeprefix("zoo:").replace("/", "_")
            jobs.append(Job(model, float(gpu), float(host), name=f"{safe}-{gpu}gb"))
    return jobs


def machine_gpu_gb() -> float:
    """The card's memory from nvidia-smi (MiB): importing torch here would put a CUDA context on it."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.split()[0]) * 2**20 / 1e9


def machine_host_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return float(line.split()[1]) * 1024 / 1e9
    raise SystemExit("error: /proc/meminfo has no MemTotal")


def compat_command(job: Job, args: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "relm.cli",
        "compat",
        "--device",
        args.device,
        "--max-gpu-memory-gb",
        f"{job.gpu_gb:g}",
        "--max-host-memory-gb",
        f"{job.host_gb:g}",
        "--timeout",
        str(args.stage_timeout),
        "--out",
        str(out / "runs" / job.name),
        "--json",
        str(out / "jobs" / f"{job.name}.json"),
        job.model,
    ]


def summarize(job: Job, out: Path, rc: int | None, note: str) -> dict[str, Any]:
    """One row of the table: verdict and conditions from compat's JSON, budgets, peaks, wall time."""
    row: dict[str, Any] = {
        "model": job.model,
        "gpu_budget_gb": job.gpu_gb,
        "host_budget_gb": job.host_gb,
        "rc": rc,
        "wall_s": round(time.monotonic() - job.started, 1),
        "note": note,
    }
    report_file = out / "jobs" / f"{job.name}.json"
    if not report_file.is_file():
        row["status"] = "no report"
        log = out / "logs" / f"{job.name}.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
        row["reason"] = note or (tail[0][:300] if tail else "")
        return row
    report = json.loads(report_file.read_text())["models"][0]
    stages = {stage["name"]: stage for stage in report["stages"]}
    update = stages.get("update", {}).get("metrics", {})
    rollout = stages.get("rollout", {}).get("metrics", {})
    failed = report.get("failed_stage")
    row.update(
        status=report["status"],
        # Why it failed or is unsupported; for a pass, what relm decided by itself (pad token, attention...).
        reason=(stages[failed]["error"] if failed else report.get("reason", "")) or ""
        if report["status"] in ("fail", "unsupported")
        else "; ".join(report.get("decisions", [])),
        # What relm changed to fit the budget: a condition of the row as much as a retry with LoRA is.
        conditions=report.get("conditions", [])
        + [
            w.removeprefix("memory plan: ")
            for w in report.get("warnings", [])
            if w.startswith("memory plan:")
        ],
        decisions=report.get("decisions", []),
        gpu_peak_gb=update.get("perf/max_memory_allocated_gb"),
        gpu_plan_gb=update.get("perf/plan_gpu_gb"),
        host_peak_gb=update.get("perf/max_host_memory_gb"),
        host_plan_gb=update.get("perf/plan_host_gb"),
        tokens_per_s=rollout.get("tokens_per_s"),
        logprob_diff_max=rollout.get("logprob_max_abs_diff"),
        update_logprob_diff_max=update.get("rollout/logprob_diff_max"),
        stage_peaks_mb={name: stage.get("peak_memory_mb") for name, stage in stages.items()},
        stage_seconds={name: stage.get("seconds") for name, stage in stages.items()},
    )
    return row


def _ratio(measured: Any, planned: Any) -> str:
    if not isinstance(measured, (int, float)) or not isinstance(planned, (int, float)) or not planned:
        return "-"
    return f"{measured:.1f} / {planned:.1f} ({100 * (measured - planned) / planned:+.0f}%)"


def markdown(rows: list[dict[str, Any]]) -> str:
    header = "| model | budget GB (GPU / host) | verdict | conditions | GPU peak / plan GB | host peak / plan GB | tok/s | wall s | why |"
    lines = [header, "|" + "---|" * 9]
    for row in rows:
        tps = row.get("tokens_per_s")
        why = row.get("reason") or ""
        lines.append(
            f"| {row['model']} | {row['gpu_budget_gb']:g} / {row['host_budget_gb']:g} | {row.get('status')} "
            f"| {'; '.join(row.get('conditions') or []) or '-'} "
            f"| {_ratio(row.get('gpu_peak_gb'), row.get('gpu_plan_gb'))} "
            f"| {_ratio(row.get('host_peak_gb'), row.get('host_plan_gb'))} "
            f"| {f'{tps:.0f}' if isinstance(tps, (int, float)) else '-'} | {row['wall_s']:.0f} "
            f"| {why.replace('|', '/')[:200]} |"
        )
    return "\n".join(lines) + "\n"


def kill(job: Job) -> None:
    assert job.process is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.process.pid, signal.SIGKILL)
    job.process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sets", nargs="+", metavar="GPU_GB:HOST_GB=MODEL[,MODEL...]")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=540.0)
    parser.add_argument("--min-start-s", type=float, default=45.0, help="no job starts with less time left")
    parser.add_argument("--stage-timeout", type=int, default=300)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--gpu-gb", type=float, help="the card's memory (default: nvidia-smi's)")
    parser.add_argument("--host-gb", type=float, help="the host's memory (default: /proc/meminfo's)")
    args = parser.parse_args()

    jobs = parse_sets(args.sets)
    gpu_total = args.gpu_gb if args.gpu_gb is not None else machine_gpu_gb()
    host_total = args.host_gb if args.host_gb is not None else machine_host_gb()
    gpu_free, host_free = gpu_total - GPU_RESERVE_GB, host_total - HOST_RESERVE_GB
    too_big = [job for job in jobs if job.gpu_gb > gpu_free or job.host_gb > host_free]
    if too_big:
        job = too_big[0]
        print(
            f"error: {job.model} asks for {job.gpu_gb:g} GB GPU / {job.host_gb:g} GB host, but this machine has "
            f"{gpu_free:.0f} / {host_free:.0f} GB to give (less a {GPU_RESERVE_GB:g} GB reserve each); "
            "lower that set's budgets",
            file=sys.stderr,
        )
        return 2
    print(f"machine: {gpu_total:.1f} GB GPU, {host_total:.1f} GB host; {len(jobs)} jobs", flush=True)
    for folder in ("jobs", "logs", "runs"):
        (args.out / folder).mkdir(parents=True, exist_ok=True)

    start = time.monotonic()
    pending, running, rows = list(jobs), [], []
    while pending or running:
        now = time.monotonic() - start
        for job in list(running):
            assert job.process is not None
            rc = job.process.poll()
            if rc is None and now < args.deadline_s:
                continue
            note = ""
            if rc is None:
                kill(job)
                note = f"killed at the call's deadline ({args.deadline_s:.0f} s) after {time.monotonic() - job.started:.0f} s"
            running.remove(job)
            gpu_free += job.gpu_gb
            host_free += job.host_gb
            row = summarize(job, args.out, rc, note)
            rows.append(row)
            print(
                f"[{now:5.0f}s] done {job.model} ({job.gpu_gb:g}/{job.host_gb:g}): {row.get('status')} rc={rc} "
                f"in {row['wall_s']:.0f}s {row.get('reason') or ''}"[:400],
                flush=True,
            )
        if now < args.deadline_s - args.min_start_s:
            for job in list(pending):
                if job.gpu_gb <= gpu_free and job.host_gb <= host_free:
                    pending.remove(job)
                    gpu_free -= job.gpu_gb
                    host_free -= job.host_gb
                    log = (args.out / "logs" / f"{job.name}.log").open("wb")
                    job.started = time.monotonic()
                    job.process = subprocess.Popen(
                        compat_command(job, args, args.out),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                    running.append(job)
                    print(
                        f"[{now:5.0f}s] start {job.model} ({job.gpu_gb:g}/{job.host_gb:g}); "
                        f"left {gpu_free:.0f} GB GPU, {host_free:.0f} GB host",
                        flush=True,
                    )
        elif pending and not running:
            break
        time.sleep(1.0)
    for job in pending:
        rows.append(
            {
                "model": job.model,
                "gpu_budget_gb": job.gpu_gb,
                "host_budget_gb": job.host_gb,
                "status": "not run",
                "reason": "out of the call's time",
                "wall_s": 0.0,
                "rc": None,
            }
        )

    with (args.out / "suite.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    table = markdown(rows)
    (args.out / "suite.md").write_text(table)
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as tar:
        tar.add(args.out / "logs", arcname="logs")
        tar.add(args.out / "jobs", arcname="jobs")
    for folder in ("logs", "jobs", "runs"):
        shutil.rmtree(args.out / folder, ignore_errors=True)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
