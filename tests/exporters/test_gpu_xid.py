"""XidWatcher on a fake NVML: XIDs counted by GPU and code with last-seen times, re-registration, its thread."""

from __future__ import annotations

import time

import pynvml
from gpu_rig import UUIDS, Rig, gpu_key, key

U0, U1, U2 = UUIDS


def _poll_until_idle(rig: Rig) -> int:
    """Poll until the event set times out; return the number of events taken."""
    num_events = 0
    while True:
        before = sum(r.count for r in rig.watcher.records())
        assert rig.watcher.poll_once() is True
        after = sum(r.count for r in rig.watcher.records())
        if after == before:
            return num_events
        num_events += after - before


def test_xids_counted_by_gpu_and_code_with_last_seen_timestamp(rig: Rig) -> None:
    rig.scrape()  # NVML up
    assert rig.watcher.poll_once() is True  # registers all three GPUs, then times out
    assert rig.watcher.num_registered == 3
    assert rig.nvml.emit_xid(rig.gpus[0], 79) == 1
    rig.nvml.emit_xid(rig.gpus[2], 48)
    assert _poll_until_idle(rig) == 2
    rig.wall.advance(42.5)
    rig.nvml.emit_xid(rig.gpus[0], 79)
    assert _poll_until_idle(rig) == 1
    s = rig.scrape()
    assert s[gpu_key("llm_gpu_xid_errors_total", 0, U0, xid="79")] == 2.0
    assert s[gpu_key("llm_gpu_xid_last_seen_timestamp_seconds", 0, U0, xid="79")] == 1_790_000_042.5
    assert s[gpu_key("llm_gpu_xid_errors_total", 2, U2, xid="48")] == 1.0
    assert s[gpu_key("llm_gpu_xid_last_seen_timestamp_seconds", 2, U2, xid="48")] == 1_790_000_000.0
    assert not any(name == "llm_gpu_xid_errors_total" and ("uuid", U1) in labels for name, labels in s)
    assert s[key("llm_gpu_collector_success", collector="xid")] == 1.0


def test_gpu_without_xid_events_is_not_registered(rig: Rig) -> None:
    rig.gpus[1].supported_events = 0
    rig.gpus[2].errors["nvmlDeviceRegisterEvents"] = pynvml.NVMLError_NotSupported
    rig.watcher.poll_once()
    assert rig.watcher.num_registered == 1
    assert rig.nvml.emit_xid(rig.gpus[1], 13) == 0


def test_counts_survive_nvml_reinit_and_the_set_is_rebuilt(rig: Rig) -> None:
    rig.watcher.poll_once()
    rig.nvml.emit_xid(rig.gpus[1], 94)
    _poll_until_idle(rig)
    first_set = rig.nvml.event_sets[0]
    rig.clock.advance(31)
    rig.gpus[0].errors["nvmlDeviceGetMemoryInfo"] = pynvml.NVMLError_GpuIsLost
    rig.scrape()  # loss seen
    rig.scrape()  # NVML shut down and initialised again: generation 2
    assert rig.session.generation == 2
    assert rig.watcher.healthy is False  # its set belongs to generation 1
    rig.watcher.poll_once()
    assert first_set.freed and len(rig.nvml.event_sets) == 2
    assert rig.watcher.healthy is True
    rig.nvml.emit_xid(rig.gpus[1], 94)
    _poll_until_idle(rig)
    s = rig.scrape()
    assert s[gpu_key("llm_gpu_xid_errors_total", 1, U1, xid="94")] == 2.0


def test_driver_gone_during_wait_marks_nvml_down(rig: Rig) -> None:
    rig.watcher.poll_once()
    rig.nvml.driver_loaded = False
    assert rig.watcher.poll_once() is False
    assert rig.session.up is False
    assert rig.watcher.healthy is False
    s = rig.scrape()
    assert s[key("llm_gpu_collector_success", collector="xid")] == 0.0
    assert s[key("llm_gpu_nvml_up")] == 0.0


def test_no_library_watcher_waits_without_registering() -> None:
    rig = Rig(library_present=False)
    assert rig.watcher.poll_once() is False
    assert rig.nvml.event_sets == []
    assert rig.watcher.records() == []


def test_watcher_thread_catches_xids_between_scrapes(rig: Rig) -> None:
    rig.watcher.start()
    try:
        deadline = time.monotonic() + 10.0  # a bound on waiting, not a measured threshold
        while rig.watcher.num_registered < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        rig.nvml.emit_xid(rig.gpus[2], 119)
        while not rig.watcher.records() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        rig.watcher.stop()
    [record] = rig.watcher.records()
    assert (record.gpu_labels, record.xid, record.count) == (("2", U2, "NVIDIA H100 80GB HBM3"), 119, 1)
    assert rig.nvml.event_sets[-1].freed  # stop() frees the event set
