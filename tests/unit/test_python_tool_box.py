"""The Python tool's box holds against what a hostile snippet tries (issue 27's probes): each test runs
the attack as tool code and checks, from outside, that the trainer's files, environment, processes,
loopback and resources were out of reach and that the call left nothing behind (docs/security.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from relm.errors import UserError
from relm.rollout.multi_turn.python_tool import PythonTool
from relm.rollout.multi_turn.sandbox import BoxSpec, bwrap_command, site_package_dirs
from relm.rollout.multi_turn.tools import ToolContext, load_tools, run_tool
from tests.needs_box import skip_module_without_box

skip_module_without_box()

LIMITS = {"timeout_s": 3, "memory_mb": 256, "max_processes": 32, "disk_mb": 64, "max_output_chars": 4000}
BOX = PythonTool(LIMITS)


def call(code: str, tool: PythonTool = BOX):
    return asyncio.run(run_tool(tool, {"code": code}, ToolContext(row=0)))


def processes_with(marker: str) -> list[int]:
    """The pids whose command line holds `marker` (the test's own leftovers, killed by the caller)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


PROBE = """
import json
def attempt(action):
    try:
        action()
        return "done"
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({name: attempt(action) for name, action in PROBES.items()}))
"""


def test_tool_code_cannot_read_or_write_the_trainers_folders_or_the_venv(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    latest = run / "latest_checkpointed_iteration.txt"
    latest.write_text("7")
    data = tmp_path / "train.parquet"
    data.write_text("answers: 42")
    monkeypatch.chdir(tmp_path)
    site = Path(sysconfig.get_paths()["purelib"])
    planted_pth = site / f"relm_box_probe_{os.getpid()}.pth"
    planted_prefix = Path(sys.prefix) / f"relm_box_probe_{os.getpid()}"
    probes = {
        "read data (cwd)": "lambda: open('train.parquet').read()",
        "read data (path)": f"lambda: open({str(data)!r}).read()",
        "read run folder": f"lambda: open({str(latest)!r}).read()",
        "write run folder": f"lambda: open({str(latest)!r}, 'w').write('999')",
        "write site-packages .pth": f"lambda: open({str(planted_pth)!r}, 'w').write('import os')",
        "write sys.prefix": f"lambda: open({str(planted_prefix)!r}, 'w').write('x')",
        "read /etc/passwd": "lambda: open('/etc/passwd').read()",
    }
    code = "PROBES = {" + ", ".join(f"{k!r}: {v}" for k, v in probes.items()) + "}" + PROBE
    try:
        result = call(code)
        outcome = json.loads(result.text)
        assert sorted(outcome) == sorted(probes) and "done" not in outcome.values(), outcome
        assert latest.read_text() == "7"
        assert not planted_pth.exists() and not planted_prefix.exists()
    finally:
        planted_pth.unlink(missing_ok=True)
        planted_prefix.unlink(missing_ok=True)


def test_ordinary_imports_work_in_the_box():
    code = "import ssl, urllib.request, json, math, numpy, pyarrow.parquet; print(math.isqrt(49), numpy.arange(3).sum())"
    result = call(code)
    assert result.error is None and result.text == "7 3\n", result.text


def test_tool_code_cannot_see_the_trainers_environment(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-7f3a")
    monkeypatch.setenv("HF_TOKEN", "hf-secret-9c1d")
    # A sibling (a reward worker, say) started with the secrets in its environment.
    sibling = subprocess.Popen(["sleep", "30"], env={**os.environ})
    code = """
import json, os
seen = {"os.environ": repr(dict(os.environ))}
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            seen[f"/proc/{entry}/environ"] = open(f"/proc/{entry}/environ", "rb").read().decode(errors="replace")
        except OSError:
            pass
print(json.dumps({"PATH seen": "PATH" in seen["os.environ"], "secrets in": [k for k, v in seen.items() if "-secret-" in v]}))
"""
    try:
        assert json.loads(call(code).text) == {"PATH seen": True, "secrets in": []}
    finally:
        sibling.kill()
        sibling.wait()


def test_tool_code_cannot_signal_the_trainer_or_its_siblings():
    sibling = subprocess.Popen(["sleep", "30"])  # a reward worker, say
    # Signal 0 asks "may I signal it?" without harm; the sibling gets a real SIGKILL.
    code = f"""
import json, os
def attempt(pid, sig):
    try:
        os.kill(pid, sig)
        return "sent"
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({{"trainer": attempt({os.getpid()}, 0), "everyone": attempt(-1, 0),
                  "sibling": attempt({sibling.pid}, 9), "parent_is_trainer": os.getppid() == {os.getpid()}}}))
"""
    try:
        outcome = json.loads(call(code).text)
        assert outcome == {
            "trainer": "ProcessLookupError",
            "everyone": "ProcessLookupError",
            "sibling": "ProcessLookupError",
            "parent_is_trainer": False,
        }
        assert sibling.poll() is None, "the sibling survived"
    finally:
        sibling.kill()
        sibling.wait()


@pytest.mark.parametrize("detach", [False, True], ids=["background", "setsid"])
def test_a_background_child_cannot_hold_a_call_past_its_timeout_or_outlive_it(detach):
    marker = f"0.00{os.getpid()}{int(detach)}7"  # a unique extra second count for `sleep`
    argv = (["setsid"] if detach else []) + ["sleep", "inf", marker]
    tool = PythonTool({**LIMITS, "timeout_s": 1})
    started = time.monotonic()
    try:
        result = call(f"import subprocess, time; subprocess.Popen({argv!r}); time.sleep(100)", tool)
        # held by the child, the call would last the snippet's 100 s; 30 leaves a loaded machine room
        assert time.monotonic() - started < 30
        assert result.error == "timeout"
        assert processes_with(marker) == []
    finally:
        kill_all(processes_with(marker))


def test_a_call_ends_when_its_code_does_and_kills_what_it_left_running():
    marker = f"0.00{os.getpid()}9"
    try:
        result = call(f"import subprocess; subprocess.Popen(['sleep', 'inf', {marker!r}]); print('done')")
        # had the call waited for `sleep inf`, it would have ended at its 3 s timeout, an error
        assert result.error is None and result.text == "done\n"
        assert processes_with(marker) == []
    finally:
        kill_all(processes_with(marker))


def test_a_call_leaves_no_file_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = f"relm-box-probe-{os.getpid()}"
    try:
        first = call(f"open('/tmp/{name}', 'w').write('x'); open('{name}', 'w').write('x'); print('wrote')")
        assert first.text == "wrote\n"
        second = call(f"import os; print(os.path.exists('/tmp/{name}'), os.path.exists('{name}'))")
        assert second.text == "False False\n"
        assert not Path("/tmp", name).exists() and not (tmp_path / name).exists()
    finally:
        Path("/tmp", name).unlink(missing_ok=True)


def test_a_fork_bomb_gets_max_processes_in_all():
    code = """
import os, time
started = 0
try:
    for _ in range(256):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        started += 1
except OSError:
    pass
print(started)
"""
    result = call(code)  # waiting for the 5 s children would end in the 3 s timeout, an error
    assert result.error is None and 0 < int(result.text) < LIMITS["max_processes"], result.text


@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroup", "watchdog"])
def test_the_memory_limit_holds_for_all_children_together(use_cgroups):
    code = """
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (150 * 2**20)
        time.sleep(0.5)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("all four held 150 MiB")
"""
    tool = PythonTool({**LIMITS, "use_cgroups": use_cgroups})
    started = time.monotonic()
    result = call(code, tool)
    assert result.error == "memory" and "memory limit of 256 MiB" in result.text, result.text
    assert time.monotonic() - started < LIMITS["timeout_s"]


def test_the_disk_limit_holds_across_files_and_nothing_is_left():
    code = """
written = 0
try:
    for k in range(4):  # 2 GiB in four files
        with open(f"big{k}", "wb") as f:
            for _ in range(128):
                f.write(b"\\0" * 2**22)
                written += 4
except OSError as exc:
    print(type(exc).__name__, written)
"""
    result = call(code)  # a limit that never bit would leave 2 GiB to write within the 3 s timeout
    kind, mib = result.text.split()
    assert kind == "OSError" and int(mib) <= LIMITS["disk_mb"], result.text


def test_tool_code_cannot_reach_the_trainers_loopback():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1); print('connected')"
    code = f"""
import _socket, subprocess, sys
try:
    raw = _socket.socket()
    raw.settimeout(1)
    raw.connect(("127.0.0.1", {port}))
    print("connected")
except OSError as exc:
    print("raw:", type(exc).__name__)
child = subprocess.run([sys.executable, "-c", {connect!r}], capture_output=True, text=True)
print("subprocess:", child.stdout.strip() or child.stderr.strip().splitlines()[-1])
"""
    try:
        result = call(code)
        assert "connected" not in result.text and "subprocess:" in result.text, result.text
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_without_a_box_the_tool_refuses_to_start_unless_weak_mode_is_asked_for(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    with pytest.raises(UserError, match=r"install bubblewrap .*allow_weak_sandbox: true"):
        PythonTool({})
    config = tmp_path / "tools.yaml"
    config.write_text("tools:\n  - class_name: relm.rollout.multi_turn.python_tool.PythonTool\n")
    with pytest.raises(UserError, match=r"tools\.yaml: tools\[0\]: python tool: no box .*bubblewrap"):
        load_tools(str(config))
    caplog.set_level("WARNING", logger="relm")
    weak = PythonTool({"allow_weak_sandbox": True})
    assert "WITHOUT a box" in caplog.text
    caplog.clear()
    assert call("import ssl, urllib.request; print(6 * 7)", weak).text == "42\n"
    weak.end_step()
    assert "1 calls this step ran model code WITHOUT a box" in caplog.text
    caplog.clear()
    weak.end_step()
    assert caplog.text == "", "a step without calls says nothing"


def test_a_venv_under_tmp_stays_visible_over_the_scratch_tmp():
    """A clone in /tmp (its .venv there) lost its site-packages: the scratch tmpfs at /tmp was mounted over
    the read-only binds. The binds of the interpreter and the packages now come after it."""
    command = bwrap_command("bwrap", BoxSpec(disk_bytes=2**20, site_packages=True), ["python"])
    scratch = next(i for i in range(len(command) - 1) if command[i : i + 2] == ["--tmpfs", "/tmp"])
    packages = set(site_package_dirs())
    binds = [i for i, arg in enumerate(command) if arg == "--ro-bind" and command[i + 1] in packages]
    assert binds and all(i > scratch for i in binds)
