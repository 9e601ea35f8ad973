"""loadgen/chat.py against servers written on other HTTP stacks, on a known schedule: what it reports
is what they sent.

Only what a busy machine cannot break is asserted: every request and token counted, and each token,
timed by the client, arrived no sooner than the server wrote it (the servers note each token's
write by request id, on the same wall clock) and not seconds later (the stalls a client bottleneck
makes). A gap between two tokens can then be shorter than the server's only by as much as the first
of them was read late: a client that was descheduled reads two tokens at once, and says so.
"""

import csv

import pytest
from fidelity_harness import run_loadgen, start_behind_nginx, start_schedule_server

from loadgen.report import REQUESTS_CSV

TTFT_MS, ITL_MS, NUM_TOKENS = 150.0, 50.0, 8
CLOCK_S = 0.005  # both sides map perf_counter to the wall clock once per process (NTP may slew between)
STALL_S = 2.0
USERS, RUN_TIME_S = 6, 3


@pytest.fixture(params=["stdlib", "aiohttp", "starlette", "nginx"])
def server(request, tmp_path):
    if request.param == "nginx":  # Debian's nginx (make system-deps), proxy_buffering off
        upstream = start_schedule_server("stdlib", TTFT_MS, ITL_MS, NUM_TOKENS)
        try:
            srv = start_behind_nginx(upstream, tmp_path)
        except BaseException:
            upstream.stop()
            raise
    else:
        srv = start_schedule_server(request.param, TTFT_MS, ITL_MS, NUM_TOKENS)
    yield srv
    srv.stop()


def test_every_token_on_schedule(server, tmp_path):
    report, _ = run_loadgen(server.url, USERS, RUN_TIME_S, tmp_path, NUM_TOKENS)
    rows = list(csv.DictReader(open(report / REQUESTS_CSV)))
    stats = server.stats()
    assert len(rows) == stats["num_requests"] - 1  # the one non-streamed probe before the load
    assert {r["outcome"] for r in rows} == {"ok"}, [r["error"] for r in rows if r["outcome"] != "ok"]
    assert len(rows) >= USERS
    for r in rows:
        gaps = [float(g) for g in r["itl_s"].split()]
        assert (int(r["num_chunks"]), int(r["output_tokens"]), r["output_tokens_source"]) == (
            NUM_TOKENS, NUM_TOKENS, "usage")
        assert len(gaps) == NUM_TOKENS - 1
        assert float(r["ttft_s"]) >= TTFT_MS / 1000  # the server wrote nothing sooner
        arrivals = [float(r["scheduled_unix"]) + float(r["ttft_s"])]
        for gap in gaps:
            arrivals.append(arrivals[-1] + gap)
        sends = stats["sends_unix"][r["request_id"]]
        assert len(sends) == NUM_TOKENS
        for k, (sent, arrived) in enumerate(zip(sends, arrivals, strict=True)):
            assert sent - CLOCK_S <= arrived <= sent + STALL_S, (server.kind, k, arrived - sent)
        # The gaps as the client saw them, against the server's: shorter only by the earlier token's lateness.
        for k in range(NUM_TOKENS - 1):
            late = arrivals[k] - sends[k]
            assert gaps[k] >= sends[k + 1] - sends[k] - late - 2 * CLOCK_S
        assert min(sends[k + 1] - sends[k] for k in range(NUM_TOKENS - 1)) >= ITL_MS / 1000 - CLOCK_S
