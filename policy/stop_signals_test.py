"""held_stop_signals: the first stop signal is held for the next safe point, a second acts at once,
the handlers before are put back, and an ignored signal stays ignored."""

import signal

import pytest

from tfplace.policy.stop_signals import held_stop_signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_is_held_and_the_second_acts_at_once(signum, capfd):
    before = signal.getsignal(signum)
    acted = []
    with held_stop_signals("stopping at the next safe point", lambda s, f: acted.append(s)) as held:
        signal.raise_signal(signum)
        assert held == [signum] and acted == []
        signal.raise_signal(signum)
        assert acted == [signum]
    assert signal.getsignal(signum) is before
    assert f"{signal.Signals(signum).name}: stopping at the next safe point" in capfd.readouterr().err


def test_an_ignored_signal_stays_ignored_inside_and_after():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's SIGINT
    try:
        with held_stop_signals("stopping", lambda s, f: pytest.fail("acted on an ignored signal")) as held:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
            assert held == []
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
