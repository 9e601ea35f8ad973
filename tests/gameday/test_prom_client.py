"""PromClient.wait_scraped on a Prometheus that a starved CPU makes slow to answer."""

import urllib.error

import pytest

from gameday.errors import GamedayError
from gameday.prom import PromClient


class SlowThenScraped(PromClient):
    """Answers nothing (a timed-out query) a few times, then every target is seen."""

    def __init__(self, timeouts: list[BaseException], seen: int = 1):
        super().__init__("http://127.0.0.1:9")
        self.timeouts = timeouts
        self.seen = seen
        self.calls = 0

    def targets_seen(self, job: str) -> int:
        self.calls += 1
        if self.timeouts:
            raise self.timeouts.pop(0)
        return self.seen


def test_timed_out_queries_are_not_yet_scraped_and_asked_again():
    prom = SlowThenScraped([TimeoutError("timed out"), urllib.error.URLError(TimeoutError("timed out"))])
    prom.wait_scraped("llm-engine", 1, timeout_s=10)
    assert prom.calls == 3


def test_a_prometheus_that_never_answers_is_one_clear_error():
    prom = SlowThenScraped([TimeoutError("timed out")] * 100)
    with pytest.raises(GamedayError, match=r"^Prometheus: job llm-engine not scraped \(1 targets\) in 1s; "
                                           r"\d+ queries unanswered within 10 s$"):
        prom.wait_scraped("llm-engine", 1, timeout_s=1)


def test_a_refused_connection_is_not_waited_out():
    prom = SlowThenScraped([ConnectionRefusedError(111, "Connection refused")])
    with pytest.raises(ConnectionRefusedError):
        prom.wait_scraped("llm-engine", 1, timeout_s=10)
