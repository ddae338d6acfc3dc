"""Liveness (ocrd/service/systemd.py) against a fake clock: what decides whether WATCHDOG=1 is sent.

The rules: the main loop must turn; pages in the engine must come back. Idle time never
counts, a long document whose pages keep coming back is alive however long it takes, and
a page stuck in the engine beyond its timeout (plus a grace) is a stall."""

from __future__ import annotations

from ocrd.service.systemd import LOOP_STALL_SECONDS, PAGE_GRACE_SECONDS, Liveness


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def test_long_document_with_pages_coming_back_stays_live() -> None:
    clock = Clock()
    live = Liveness(page_timeout_seconds=5, clock=clock)
    # 3,000 pages, 4 in the engine at a time, one back every 2 s: 6,000 s in all,
    # far beyond page_timeout + grace, and never a stall.
    for _ in range(4):
        live.page_sent()
    for _ in range(3000):
        clock.advance(2)
        live.loop_turned()
        live.page_back()
        live.page_sent()
        assert live.problem() is None
    assert live.in_engine == 4


def test_idle_time_does_not_count_against_the_next_document() -> None:
    clock = Clock()
    live = Liveness(page_timeout_seconds=5, clock=clock)
    live.page_sent()
    live.page_back()
    # A quiet night: nothing in the engine for 16 hours.
    for _ in range(16 * 60):
        clock.advance(60)
        live.loop_turned()
        assert live.problem() is None
    # The first page of the next file: its clock starts now, not at the last page.
    live.page_sent()
    clock.advance(1)
    live.loop_turned()
    assert live.problem() is None
    clock.advance(5 + PAGE_GRACE_SECONDS - 1)
    live.loop_turned()
    assert live.problem() is None


def test_a_page_stuck_in_the_engine_is_a_stall() -> None:
    clock = Clock()
    live = Liveness(page_timeout_seconds=5, clock=clock)
    live.page_sent()
    clock.advance(5 + PAGE_GRACE_SECONDS - 0.5)
    live.loop_turned()
    assert live.problem() is None
    clock.advance(1)
    live.loop_turned()
    why = live.problem()
    assert why is not None and "1 page(s) in the engine" in why, why
    # When it finally comes back (its timeout fired), the daemon is live again.
    live.page_back()
    assert live.problem() is None


def test_a_page_back_while_others_stay_in_restarts_the_clock() -> None:
    clock = Clock()
    live = Liveness(page_timeout_seconds=10, clock=clock)
    live.page_sent()
    live.page_sent()
    clock.advance(20)
    live.page_back()  # one of two came back: progress
    clock.advance(10 + PAGE_GRACE_SECONDS - 1)
    live.loop_turned()
    assert live.problem() is None
    clock.advance(2)
    live.loop_turned()
    assert live.problem() is not None


def test_a_main_loop_that_stops_turning_is_a_stall_even_when_idle() -> None:
    clock = Clock()
    live = Liveness(page_timeout_seconds=900, clock=clock)
    clock.advance(LOOP_STALL_SECONDS - 1)
    assert live.problem() is None
    clock.advance(2)
    why = live.problem()
    assert why is not None and "main loop" in why, why
    live.loop_turned()
    assert live.problem() is None


def test_a_drain_longer_than_the_loop_threshold_stays_live_while_pages_come_back() -> None:
    """Draining stops the main loop on purpose; the nspawn stop step was killed by the
    watchdog (result 'watchdog', SIGABRT) 35 s into a drain of a tesseract document when
    the loop's silence still counted."""
    clock = Clock()
    live = Liveness(page_timeout_seconds=10, clock=clock)
    live.page_sent()
    live.loop_stopped()
    for _ in range(20):  # 100 s of draining, a page back every 5 s
        clock.advance(5)
        live.page_back()
        live.page_sent()
        assert live.problem() is None
    clock.advance(10 + PAGE_GRACE_SECONDS + 1)  # then one page stuck in the engine
    why = live.problem()
    assert why is not None and "came back" in why, why
