"""``attnzoo.interrupts``: a signal inside ``stop_on_signals`` raises ``Interrupted`` naming it, and the handlers
that were in force come back afterwards."""

import signal

import pytest

from attnzoo.interrupts import Interrupted, sigint_ignored, stop_on_signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_block_raises_interrupted_naming_it_and_the_handlers_come_back(signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as stopped, stop_on_signals():
        signal.raise_signal(signum)
    assert stopped.value.signum == signum and str(stopped.value) == signal.Signals(signum).name
    assert {s: signal.getsignal(s) for s in before} == before


def test_sigint_is_ignored_in_the_block_only():
    before = signal.getsignal(signal.SIGINT)
    with sigint_ignored():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)  # would raise KeyboardInterrupt under the default handler
    assert signal.getsignal(signal.SIGINT) is before
