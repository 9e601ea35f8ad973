"""The client's own measure of falling behind: how late its gevent loop runs a timer.

A greenlet asks to wake every `interval_s`; how much later than asked it wakes is the time every
stream's next read would also have waited. It catches what Locust's CPU warning cannot: a client
starved of CPU by other processes (its own CPU share then stays low) as well as one busy itself.
"""

import time

import gevent
import numpy as np

INTERVAL_S = 0.05
OVERLOADED_P99_S = 0.010  # p99 lateness above this: reads waited for the client, latencies include it


class LoopLag:
    def __init__(self, interval_s: float = INTERVAL_S, clock=time.perf_counter):
        self.interval_s = interval_s
        self.clock = clock
        self.lags_s: list[float] = []
        self.greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        if self.greenlet is None:
            self.greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
            self.greenlet = None

    def _run(self) -> None:
        while True:
            asked = self.clock()
            gevent.sleep(self.interval_s)
            self.lags_s.append(max(0.0, self.clock() - asked - self.interval_s))

    def p99_s(self) -> float | None:
        return float(np.percentile(self.lags_s, 99)) if self.lags_s else None
