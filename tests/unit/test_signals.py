"""SIGTERM/SIGINT: the first one is recorded and announced, the second aborts; old handlers come back."""

from __future__ import annotations

import os
import signal

import pytest

from relm.trainer.signals import stop_on_signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_is_recorded_second_aborts(sig: signal.Signals, capfd: pytest.CaptureFixture[str]):
    with stop_on_signals() as stop:
        assert not stop.requested
        os.kill(os.getpid(), sig)  # the handler runs before os.kill returns to Python code
        assert stop.requested and stop.signal_name == sig.name
        assert f"received {sig.name}" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)


def test_previous_handlers_are_restored():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with stop_on_signals():
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before
