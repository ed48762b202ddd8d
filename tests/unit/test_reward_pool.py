"""Reward code that misbehaves: the worker pool's time limit, dead and leaking workers, failure counting.

One pool of real spawned workers serves the tests that share its reward file (a start costs about a
second); time limits are short so the whole file runs in seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from relm.errors import UserError
from relm.models.char_tokenizer import build_char_tokenizer
from relm.rewards.calls import Outcome, Row, judge, score_rows
from relm.rewards.custom import load_custom_reward
from relm.rewards.manager import FailurePolicy, RewardManager
from relm.rewards.pool import RewardPool, RewardSource

# Each behaviour is chosen by the row's data_source, so one file (one pool) serves every test.
MISBEHAVING = """
import os
import time

LEAK = []

def compute_score(data_source, solution_str, ground_truth, extra_info):
    i = extra_info["i"]
    if data_source == "sleeps" and i == 1:
        time.sleep(10_000)
    if data_source == "spins" and i == 1:
        while True:
            pass
    if data_source == "raises" and i % 10 == 3:
        raise ValueError(f"odd response {i}")
    if data_source == "nan" and i == 2:
        return float("nan")
    if data_source == "leaks":
        LEAK.append(bytearray(40 * 2**20))
        LEAK[-1][:: 4096] = b"x" * len(LEAK[-1][:: 4096])  # touch every page: resident, not just reserved
    if data_source == "pid":
        return float(os.getpid())
    return float(i) + len(solution_str)
"""

BATCHED = """
import time

def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
    if "sleeps" in data_sources:
        time.sleep(10_000)
    if "short" in data_sources:
        return [1.0]
    return [{"score": float(len(s)), "n": float(len(solution_strs))} for s in solution_strs]
"""

TIMEOUT_S = 0.5


def _rows(source: str, count: int, text: str = "ab") -> list[Row]:
    return [Row(i, source, text, None, {"i": i}) for i in range(count)]


def _kinds(outcomes: list[Outcome]) -> list[str]:
    return [o.kind for o in outcomes]


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "misbehaving.py"
    path.write_text(textwrap.dedent(MISBEHAVING))
    return str(path)


@pytest.fixture(scope="module")
def pool(reward_file):
    pool = RewardPool(RewardSource(path=reward_file), num_workers=2, timeout_s=TIMEOUT_S, memory_limit_mb=400)
    yield pool
    pool.close()


def test_good_rows_score_in_order(pool):
    outcomes = pool.score(_rows("fine", 25))
    assert [o.score for o in outcomes] == [i + 2.0 for i in range(25)]


@pytest.mark.parametrize("source", ["sleeps", "spins"])
def test_a_call_past_the_time_limit_is_a_timeout_and_the_rest_still_score(pool, source):
    replaced = pool.num_replaced
    start = time.monotonic()
    outcomes = pool.score(_rows(source, 8))
    assert _kinds(outcomes) == ["ok", "timeout"] + ["ok"] * 6
    assert "took more than 0.5 s" in outcomes[1].reason
    assert [o.score for i, o in enumerate(outcomes) if i != 1] == [i + 2.0 for i in range(8) if i != 1]
    assert pool.num_replaced == replaced + 1
    assert time.monotonic() - start < TIMEOUT_S + 5  # one time limit and a worker start, not more


def test_raising_and_non_finite_calls_are_counted_failures(pool):
    outcomes = pool.score(_rows("raises", 30))
    assert [i for i, o in enumerate(outcomes) if o.kind == "error"] == [3, 13, 23]
    assert outcomes[3].reason == "raised ValueError: odd response 3"
    outcomes = pool.score(_rows("nan", 5))
    assert _kinds(outcomes) == ["ok", "ok", "non_finite", "ok", "ok"]
    assert outcomes[2].reason == "returned float nan (not a finite number)"


def test_a_sigkilled_worker_is_replaced_and_its_call_counted_as_an_error(pool):
    before = set(pool.pids)
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    outcomes = pool.score(_rows("pid", 6))
    # A worker killed between calls costs no response; its replacement scores them.
    assert _kinds(outcomes) == ["ok"] * 6
    assert not before & {int(o.score) for o in outcomes}
    assert not before & set(pool.pids)


def test_a_worker_killed_mid_call_costs_that_response_only(reward_file):
    pool = RewardPool(RewardSource(path=reward_file), num_workers=1, timeout_s=30.0)
    try:
        pool.score(_rows("fine", 1))  # started and ready
        (pid,) = pool.pids
        rows = _rows("sleeps", 4)
        threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
        outcomes = pool.score(rows)
        assert _kinds(outcomes) == ["ok", "error", "ok", "ok"]
        assert outcomes[1].reason == "its reward worker died (killed by SIGKILL)"
        assert pool.pids != [pid]
    finally:
        pool.close()


def test_a_leaking_worker_is_replaced_past_the_memory_limit(pool):
    replaced = pool.num_replaced
    outcomes = pool.score(_rows("leaks", 24))
    errors = [o for o in outcomes if o.kind == "error"]
    # 40 MB a call against 400 MB: a worker lasts about 9 calls, then costs the call it is on.
    assert errors and all("over reward_model.memory_limit_mb=400" in o.reason for o in errors)
    # Every failed call cost its worker (on a loaded machine a call may also time out). A worker found over
    # the limit between calls is replaced too, costing no row: so at least one replacement per failure.
    failed = [o for o in outcomes if o.kind != "ok"]
    assert pool.num_replaced - replaced >= len(failed)
    assert all(o.kind in ("error", "timeout") for o in failed)


def test_close_ends_every_worker(reward_file):
    pool = RewardPool(RewardSource(path=reward_file), num_workers=2, timeout_s=TIMEOUT_S)
    pool.score(_rows("fine", 2))
    processes = [w.process for w in pool._workers]
    pool.close()
    assert all(not p.is_alive() for p in processes)


def test_a_file_that_does_not_load_in_the_worker_is_a_user_error(tmp_path):
    path = tmp_path / "missing_import.py"
    path.write_text("import no_such_module_anywhere\n")
    pool = RewardPool(RewardSource(path=str(path)), num_workers=1, timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(UserError, match=r"a reward worker could not load it .*no_such_module_anywhere"):
            pool.score(_rows("fine", 1))
    finally:
        pool.close()


# --- batched compute_score (verl's `batch` reward manager) ------------------------------------------


def test_batched_function_in_workers_and_its_failures(tmp_path):
    path = tmp_path / "batched.py"
    path.write_text(textwrap.dedent(BATCHED))
    pool = RewardPool(RewardSource(path=str(path), batched=True), num_workers=2, timeout_s=TIMEOUT_S)
    try:
        outcomes = pool.score(_rows("fine", 7, text="abc"))
        assert [o.score for o in outcomes] == [3.0] * 7
        # A batched call that hangs fails every row it held (here one a call), each counted as a timeout.
        rows = _rows("fine", 3) + [Row(3, "sleeps", "x", None, {"i": 3})]
        assert _kinds(pool.score(rows)) == ["ok", "ok", "ok", "timeout"]
        # Eight rows go out two a call; the call holding the "short" row gets one value for two rows.
        wrong = pool.score([Row(0, "short", "", None, {})] + _rows("fine", 8)[1:])
        assert _kinds(wrong) == ["error", "error"] + ["ok"] * 6
        assert wrong[0].reason == "returned list of 1 for 2 responses (one value each expected)"
    finally:
        pool.close()


def test_batched_signature_is_checked(tmp_path):
    path = tmp_path / "single.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 0\n")
    with pytest.raises(UserError, match=r"reward_model.reward_manager=batch"):
        load_custom_reward(str(path), batched=True)


# --- judging values and the manager's failure policy --------------------------------------------------


def test_judge_by_hand():
    assert judge(1) == Outcome("ok", score=1.0)
    assert judge({"score": torch.tensor(0.5), "acc": True, "pred": "x"}) == Outcome(
        "ok", score=0.5, extra={"acc": 1.0}
    )
    assert judge(float("-inf")).kind == "non_finite"
    assert judge(torch.tensor([1.0, 2.0])).kind == "error"
    assert judge("1.0").kind == "error" and judge(None).kind == "error"


def _letter_score(data_source, solution_str, ground_truth, extra_info):
    if extra_info["i"] % 10 == 0:
        raise RuntimeError("boom")
    return float("nan") if extra_info["i"] == 5 else 1.0


def test_manager_scores_failures_the_default_counts_them_and_logs_the_first(caplog):
    tokenizer = build_char_tokenizer()
    ids = torch.tensor([tokenizer.encode("ab")] * 20)
    mask = torch.ones_like(ids)
    manager = RewardManager(tokenizer, _letter_score, policy=FailurePolicy(failure_score=-1.0))
    with caplog.at_level(logging.WARNING, logger="relm"):
        result = manager(ids, mask, ["d"] * 20, [None] * 20, [{"i": i} for i in range(20)])
        manager(ids, mask, ["d"] * 20, [None] * 20, [{"i": i} for i in range(20)])
    expected = [-1.0 if i in (0, 5, 10) else 1.0 for i in range(20)]
    assert result.scores.tolist() == expected
    assert manager.take_failure_metrics() == {
        "reward/timeouts": 0.0,
        "reward/errors": 4.0,
        "reward/non_finite": 2.0,
    }
    assert manager.take_failure_metrics()["reward/errors"] == 0.0  # read and reset
    firsts = [r.getMessage() for r in caplog.records if "first" in r.getMessage()]
    assert len(firsts) == 2  # one per kind, however many steps
    assert "first error: it raised RuntimeError: boom on a response (data_source 'd')" in firsts[0]


def test_manager_ends_the_run_past_the_failure_share():
    tokenizer = build_char_tokenizer()
    ids = torch.tensor([tokenizer.encode("ab")] * 10)
    mask = torch.ones_like(ids)
    infos = [{"i": i} for i in range(10)]
    # Two failures in ten (rows 0 and 5) pass under a share of 0.2, not under 0.1.
    RewardManager(tokenizer, _letter_score, policy=FailurePolicy(max_failure_share=0.2))(
        ids, mask, ["d"] * 10, [None] * 10, infos
    )
    with pytest.raises(
        UserError,
        match=r"^reward function _letter_score failed on 2 of 10 responses, more than "
        r"reward_model.max_failure_share=0.1; e.g. it raised RuntimeError: boom on response 0",
    ):
        RewardManager(tokenizer, _letter_score, policy=FailurePolicy(max_failure_share=0.1))(
            ids, mask, ["d"] * 10, [None] * 10, infos
        )


def test_in_process_rows_match_the_pool(pool):
    function = load_custom_reward(pool.source.path)
    rows = _rows("raises", 12)
    in_process = [outcome for _, outcome in score_rows(function, rows, batched=False)]
    assert in_process == pool.score(rows)


def test_a_reward_worker_imports_no_torch():
    # A worker's resident memory is held to reward_model.memory_limit_mb (300 MB in the leak tests). With
    # torch imported a fresh worker starts near 270 MB and is replaced before its first call, over and
    # over: the lookup task's scorer once pulled the rollout code, and torch, into the registry.
    code = "import sys, relm.rewards.pool, relm.rewards.registry; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_limit_below_a_fresh_workers_memory_is_a_user_error(tmp_path):
    # Each replacement would be over the limit too: before, the pool replaced workers forever.
    path = tmp_path / "heavy.py"
    path.write_text(
        "BLOCK = bytearray(200 * 2**20)\nBLOCK[::4096] = b'x' * len(BLOCK[::4096])\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    pool = RewardPool(RewardSource(path=str(path)), num_workers=1, timeout_s=TIMEOUT_S, memory_limit_mb=100)
    try:
        with pytest.raises(
            UserError, match=r"^reward_model.memory_limit_mb=100: a reward worker holds \d+ MB before"
        ):
            pool.score(_rows("fine", 2))
    finally:
        pool.close()
