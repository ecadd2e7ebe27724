"""Progress to the end (issue 26.7): the held-out evaluation prints progress lines like training, and the
``done:`` line's s/step is the loop of steps alone, the evaluation's time reported beside it."""

from __future__ import annotations

import io
import re

import pytest

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_batch_lines_are_rate_limited_with_an_eta():
    """Not a TTY: a line after item 1, then one per interval, and at the last item; mean and ETA from the clock."""
    from dplora.run.progress import BatchReporter

    stream, clock = io.StringIO(), _Clock()
    with BatchReporter("held-out eval", stream=stream, interval_s=30, clock=clock, public=True) as reporter:
        assert reporter.mode == "lines"
        reporter.start(10)
        for done in range(1, 11):
            clock.now = 4.0 * done  # 4 s per batch
            reporter.advance()
    lines = stream.getvalue().splitlines()
    assert [int(re.search(r"batch (\d+)/10", ln).group(1)) for ln in lines] == [1, 9, 10]
    assert lines[0] == "held-out eval: batch 1/10, 4.00 s/batch, ETA 36 s"
    assert lines[-1] == "held-out eval: batch 10/10, 4.00 s/batch, ETA 0 s"


def test_private_batch_count_prints_no_lines():
    """A private held-out set's batch count and times are private: off a terminal, nothing at all (issue 40)."""
    from dplora.run.progress import BatchReporter

    stream = io.StringIO()
    with BatchReporter("held-out eval", stream=stream) as reporter:
        assert reporter.mode == "off"
        reporter.start(7)
        reporter.advance(7)
    assert stream.getvalue() == ""


def test_disabled_reporter_prints_nothing():
    from dplora.run.progress import BatchReporter

    stream = io.StringIO()
    with BatchReporter("held-out eval", enabled=False, stream=stream) as reporter:
        reporter.start(3)
        reporter.advance(3)
    assert stream.getvalue() == ""
