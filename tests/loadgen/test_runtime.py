"""The per-process state: Locust's CPU warning from a worker reaches the master's report."""

import json
from types import SimpleNamespace

from test_prompts_profiles import options

from loadgen.options import config_from_options
from loadgen.records import RequestRecord
from loadgen.report import SUMMARY_JSON, SUMMARY_MD
from loadgen.runtime import LoadgenState


def state(tmp_path) -> LoadgenState:
    return LoadgenState(config_from_options(options(report_dir=str(tmp_path))), SimpleNamespace(runner=None))


def test_a_workers_cpu_warning_reaches_the_masters_report(tmp_path):
    worker, master = state(tmp_path / "w"), state(tmp_path / "m")
    worker.note_cpu(93.5)
    worker.note_cpu(97.0)
    worker.unsent.append(RequestRecord(request_id="r", worker="worker-0", profile="steady", scheduled_unix=1.0,
                                       ttft_s=0.1, e2e_s=0.2, end_s=0.2, num_chunks=2, itl_s=[0.1]))
    master.merge(json.loads(json.dumps(worker.take_unsent(final=True))))  # as it travels
    assert (master.cpu_warning, master.max_cpu_percent) == (True, 97.0)
    master.write("http://h")
    summary = json.loads((tmp_path / "m" / SUMMARY_JSON).read_text())
    assert (summary["client_cpu_warning"], summary["max_client_cpu_percent"], summary["num_requests"]) == (True, 97.0, 1)
    assert "**The client was CPU-bound**" in (tmp_path / "m" / SUMMARY_MD).read_text()


def test_no_warning_no_note(tmp_path):
    master = state(tmp_path)
    master.merge(state(tmp_path).take_unsent())
    assert (master.cpu_warning, master.max_cpu_percent) == (False, None)


def test_loop_lag_sees_a_blocked_loop_and_the_report_says_the_client_fell_behind(tmp_path):
    import time

    import gevent

    worker, master = state(tmp_path / "w"), state(tmp_path / "m")
    worker.loop_lag.start()
    gevent.sleep(0.12)
    time.sleep(0.3)  # not gevent's: the whole loop stops, as under a CPU-bound or starved client
    gevent.sleep(0.12)
    worker.loop_lag.stop()
    assert max(worker.loop_lag.lags_s) >= 0.25
    master.merge(json.loads(json.dumps(worker.take_unsent(final=True))))
    assert master.loop_lag_p99_s() == worker.loop_lag.p99_s() > 0.010
    master.add(RequestRecord(request_id="r", worker="w", profile="steady", scheduled_unix=1.0, end_s=0.1))
    master.write("http://h")
    summary = json.loads((tmp_path / "m" / SUMMARY_JSON).read_text())
    assert summary["client_overloaded"] is True and summary["client_cpu_warning"] is False
    assert "**The client fell behind**: its event loop ran timers" in (tmp_path / "m" / SUMMARY_MD).read_text()
