"""Tests for plmodels.progress: plain lines off a terminal, tqdm's bar on one, the clock-capped ETA."""
import io
import math

from plmodels.progress import progress, write


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_have_count_rate_and_a_final_line():
    buf = io.StringIO()
    with progress(10, "extract", "tok", stream=buf) as bar:
        bar.update(4)
        bar.update(6)
        bar.set_postfix_str("loss 3.21", refresh=False)
    text = buf.getvalue()
    assert "\r" not in text and "\x1b" not in text  # no redraws in a log file
    lines = text.splitlines()
    assert len(lines) == 2  # one when it opens, one when it closes: the 30 s interval never came
    assert lines[0].startswith("extract:   0% 0/10 tok")
    assert lines[1].startswith("extract: 100% 10/10 tok [") and "tok/s" in lines[1]
    assert lines[1].endswith(", loss 3.21]")


def test_log_lines_every_interval_and_from_the_initial_count():
    buf = io.StringIO()
    with progress(8, "pretrain", "step", stream=buf, log_interval=0, initial=4) as bar:
        bar.update(1)
        bar.update(1)
    counts = [line.split(" step ")[0].split()[-1] for line in buf.getvalue().splitlines()]
    assert counts == ["4/8", "5/8", "6/8", "6/8"]


def test_unknown_total_shows_a_rate_and_no_eta():
    buf = io.StringIO()
    with progress(None, "tokenize", "char", stream=buf) as bar:
        bar.update(1234)
    last = buf.getvalue().splitlines()[-1]
    assert last.startswith("tokenize: 1234 char [") and "char/s" in last and "<" not in last


def test_scaled_counts_are_short_and_small_ones_whole():
    buf = io.StringIO()
    with progress(48_200, "extract", "tok", stream=buf, scale=True) as bar:
        bar.update(48_200)
    first, last = buf.getvalue().splitlines()
    assert first.startswith("extract:   0% 0/48.2k tok") and last.startswith("extract: 100% 48.2k/48.2k tok")


def test_disabled_writes_nothing():
    buf = io.StringIO()
    with progress(10, "x", stream=buf, disable=True) as bar:
        bar.update(10)
        bar.end_within(5)
    assert buf.getvalue() == ""


def test_terminal_gets_a_redrawn_bar():
    buf = _Terminal()
    with progress(10, "x", "tok", stream=buf) as bar:
        bar.update(10)
    assert "\r" in buf.getvalue() and "10/10" in buf.getvalue() and "|#" in buf.getvalue()


def test_eta_is_the_nearer_of_the_count_and_the_clock():
    buf = io.StringIO()
    bar = progress(1000, "pretrain", "step", stream=buf, log_interval=math.inf)
    clock = [bar.start_t]
    bar._time = lambda: clock[0]  # tqdm's clock, made ours: 10 steps in 10 s
    clock[0] += 10
    bar.update(10)
    assert "10/1000 step [00:10<16:30," in str(bar)  # 990 steps at 1 step/s
    bar.end_within(60)
    assert "10/1000 step [00:10<01:00," in str(bar)  # a budget with a minute left
    bar.end_within(10**6)
    assert "<16:30," in str(bar)
    bar.close()


def test_write_keeps_a_log_line_whole_beside_a_bar():
    buf = io.StringIO()
    with progress(10, "x", "tok", stream=buf) as bar:
        bar.update(5)
        write("eval @ 5: loss 3.1", stream=buf)
    assert buf.getvalue().splitlines()[1] == "eval @ 5: loss 3.1"
