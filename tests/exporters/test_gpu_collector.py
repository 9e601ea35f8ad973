"""GpuCollector on a fake NVML: unit conversions, omitted fields, lost GPUs, driver and library gone."""

from __future__ import annotations

import logging
import threading

import pynvml
from gpu_rig import UUIDS, Rig, gpu_key, key, names_for_gpu

from exporters.fields import THROTTLE_REASON_BITS

U0, U1, U2 = UUIDS


def test_normal_values_are_converted_to_base_units(rig: Rig) -> None:
    s = rig.scrape()
    expected = {
        "llm_gpu_up": 1.0,
        "llm_gpu_memory_used_bytes": 80_688_971_776.0,
        "llm_gpu_memory_reserved_bytes": 536_870_912.0,
        "llm_gpu_memory_free_bytes": 4_294_967_296.0,
        "llm_gpu_memory_total_bytes": 85_520_809_984.0,
        "llm_gpu_utilization_ratio": 0.87,
        "llm_gpu_memory_utilization_ratio": 0.45,
        "llm_gpu_temperature_celsius": 64.0,
        "llm_gpu_power_watts": 512.345,  # 512345 mW
        "llm_gpu_power_limit_watts": 700.0,
        "llm_gpu_sm_clock_hz": 1_980_000_000.0,  # 1980 MHz
        "llm_gpu_memory_clock_hz": 2_619_000_000.0,
        "llm_gpu_energy_joules_total": 123_456.789,  # 123456789 mJ
        "llm_gpu_pcie_replay_total": 3.0,
        "llm_gpu_ecc_corrected_errors_total": 7.0,
        "llm_gpu_ecc_uncorrected_errors_total": 0.0,
        "llm_gpu_row_remap_pending": 0.0,
        "llm_gpu_row_remap_failure": 0.0,
    }
    for index, uuid in enumerate(UUIDS):
        for name, value in expected.items():
            assert s[gpu_key(name, index, uuid)] == value, name
        assert s[gpu_key("llm_gpu_retired_pages_total", index, uuid, cause="single_bit")] == 2.0
        assert s[gpu_key("llm_gpu_retired_pages_total", index, uuid, cause="double_bit")] == 0.0
        assert s[gpu_key("llm_gpu_remapped_rows_total", index, uuid, type="correctable")] == 2.0
        assert s[gpu_key("llm_gpu_remapped_rows_total", index, uuid, type="uncorrectable")] == 1.0
        active = {
            reason
            for reason, _ in THROTTLE_REASON_BITS
            if s[gpu_key("llm_gpu_throttle_reason", index, uuid, reason=reason)] == 1.0
        }
        assert active == {"sw_power_cap", "hw_thermal"}
    assert s[key("llm_gpu_nvml_up")] == 1.0
    assert (
        s[
            key(
                "llm_gpu_nvml_info",
                driver_version="550.54.15",
                nvml_version="12.550.54.15",
                cuda_driver_version="12.4",
            )
        ]
        == 1.0
    )
    for collector in (
        "nvml",
        "memory",
        "utilization",
        "temperature",
        "power",
        "clocks",
        "energy",
        "throttle",
        "pcie",
        "ecc",
        "retired_pages",
        "remapped_rows",
        "processes",
    ):
        assert s[key("llm_gpu_collector_success", collector=collector)] == 1.0, collector
        assert s[key("llm_gpu_collector_duration_seconds", collector=collector)] >= 0.0
    assert s[key("llm_gpu_nvml_init_attempts_total", result="success")] == 1.0
    assert s[key("llm_gpu_nvml_init_attempts_total", result="failure")] == 0.0


def test_not_supported_fields_are_omitted_not_zero(rig: Rig) -> None:
    g1 = rig.gpus[1]
    for fn in (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetTotalEnergyConsumption",
    ):
        g1.errors[fn] = pynvml.NVMLError_NotSupported
    s = rig.scrape()
    missing = {
        "llm_gpu_power_watts",
        "llm_gpu_ecc_corrected_errors_total",
        "llm_gpu_ecc_uncorrected_errors_total",
        "llm_gpu_remapped_rows_total",
        "llm_gpu_row_remap_pending",
        "llm_gpu_row_remap_failure",
        "llm_gpu_retired_pages_total",
        "llm_gpu_energy_joules_total",
    }
    assert names_for_gpu(s, U1) == names_for_gpu(s, U0) - missing
    assert s[gpu_key("llm_gpu_power_limit_watts", 1, U1)] == 700.0
    assert s[gpu_key("llm_gpu_up", 1, U1)] == 1.0
    assert s[key("llm_gpu_collector_success", collector="power")] == 1.0  # absent by design is no failure
    assert s[key("llm_gpu_collector_success", collector="ecc")] == 1.0
    # NotSupported is remembered for this NVML generation: the field is not asked again.
    g1.errors.clear()
    s = rig.scrape()
    assert "llm_gpu_power_watts" not in names_for_gpu(s, U1)
    assert s[key("llm_gpu_collector_success", collector="ecc")] == 1.0


def test_other_field_errors_omit_the_field_and_fail_its_collector(rig: Rig, caplog) -> None:
    rig.gpus[0].errors["nvmlDeviceGetPcieReplayCounter"] = pynvml.NVMLError_NoPermission
    rig.gpus[2].util_gpu = 4_294_967_295  # go-dcgm#75: garbage utilization
    with caplog.at_level(logging.WARNING, logger="llm-gpu-exporter"):
        s = rig.scrape()
        rig.scrape()
    assert gpu_key("llm_gpu_pcie_replay_total", 0, U0) not in s
    assert s[gpu_key("llm_gpu_pcie_replay_total", 1, U1)] == 3.0
    assert gpu_key("llm_gpu_utilization_ratio", 2, U2) not in s
    assert s[gpu_key("llm_gpu_utilization_ratio", 1, U1)] == 0.87
    assert s[key("llm_gpu_collector_success", collector="pcie")] == 0.0
    assert s[key("llm_gpu_collector_success", collector="utilization")] == 0.0
    assert s[key("llm_gpu_collector_success", collector="memory")] == 1.0
    assert all(s[gpu_key("llm_gpu_up", i, u)] == 1.0 for i, u in enumerate(UUIDS))
    unreadable = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(unreadable) == 2  # logged once each, not once per scrape


def test_memory_falls_back_to_v1_on_older_drivers(rig: Rig) -> None:
    rig.nvml.has_memory_v2 = False
    s = rig.scrape()
    assert s[gpu_key("llm_gpu_memory_used_bytes", 0, U0)] == 81_225_842_688.0  # reserved counted as used
    assert s[gpu_key("llm_gpu_memory_total_bytes", 0, U0)] == 85_520_809_984.0
    assert "llm_gpu_memory_reserved_bytes" not in names_for_gpu(s, U0)
    assert s[key("llm_gpu_collector_success", collector="memory")] == 1.0


def test_throttle_reasons_fall_back_to_the_older_call(rig: Rig) -> None:
    rig.nvml.has_event_reasons = False
    rig.gpus[0].throttle_mask = 0x1 | 0x100
    s = rig.scrape()
    active = {
        r for r, _ in THROTTLE_REASON_BITS if s[gpu_key("llm_gpu_throttle_reason", 0, U0, reason=r)] == 1.0
    }
    assert active == {"gpu_idle", "display_clocks"}
    assert s[key("llm_gpu_collector_success", collector="throttle")] == 1.0


def test_lost_gpu_is_marked_down_others_keep_reporting_and_nvml_reinits(rig: Rig, caplog) -> None:
    rig.scrape()
    rig.gpus[1].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_GpuIsLost  # mid-way through its fields
    rig.clock.advance(31)
    with caplog.at_level(logging.ERROR, logger="llm-gpu-exporter"):
        s = rig.scrape()
    assert s[gpu_key("llm_gpu_up", 1, U1)] == 0.0
    assert names_for_gpu(s, U1) == {"llm_gpu_up"}  # its partial readings are dropped
    for index, uuid in ((0, U0), (2, U2)):
        assert s[gpu_key("llm_gpu_up", index, uuid)] == 1.0
        assert s[gpu_key("llm_gpu_power_watts", index, uuid)] == 512.345
    assert s[key("llm_gpu_nvml_up")] == 1.0
    assert any("GPU lost" in r.getMessage() and U1 in r.getMessage() for r in caplog.records)
    assert (rig.nvml.num_init, rig.nvml.num_shutdown) == (1, 0)
    # Next scrape: NVML is shut down and initialised again; the GPU, now off the bus, stays visible as down.
    rig.gpus.pop(1)
    s = rig.scrape()
    assert (rig.nvml.num_init, rig.nvml.num_shutdown) == (2, 1)
    assert rig.session.generation == 2
    assert s[gpu_key("llm_gpu_up", 1, U1)] == 0.0
    assert s[gpu_key("llm_gpu_up", 0, U0)] == 1.0
    assert s[gpu_key("llm_gpu_up", 1, U2)] == 1.0  # re-enumerated at its new index


def test_gpu_lost_before_it_was_ever_seen_is_down_without_uuid() -> None:
    rig = Rig()
    rig.gpus[2].lost = True  # every call, the handle included, raises GpuIsLost
    s = rig.scrape()
    assert s[gpu_key("llm_gpu_up", 2, "", gpu_name="")] == 0.0  # no UUID to report
    assert s[gpu_key("llm_gpu_up", 1, U1)] == 1.0


def test_gpu_staying_lost_reinits_at_most_once_per_retry_interval(rig: Rig) -> None:
    rig.scrape()  # first init at t=1000
    rig.clock.advance(31)
    rig.gpus[2].lost = True
    rig.scrape()  # loss seen: re-init requested
    rig.scrape()  # re-init; the GPU is still lost, but the last init was just now
    for _ in range(3):
        s = rig.scrape()
    assert (rig.nvml.num_init, rig.nvml.num_shutdown) == (2, 1)
    assert s[gpu_key("llm_gpu_up", 2, U2)] == 0.0
    assert s[gpu_key("llm_gpu_up", 0, U0)] == 1.0
    rig.clock.advance(30)
    rig.scrape()
    rig.scrape()
    assert (rig.nvml.num_init, rig.nvml.num_shutdown) == (3, 2)


def test_scrape_straddling_a_reinit_by_the_xid_thread_is_read_again(rig: Rig) -> None:
    rig.scrape()
    rig.clock.advance(31)

    def reinit_then_stale_handle() -> None:  # what the XID thread does when it sees a lost GPU
        del rig.gpus[1].hooks["nvmlDeviceGetPowerUsage"]
        rig.session.request_reinit("nvmlEventSetWait: GPU is lost (code 15)", rig.session.generation)
        rig.session.ensure_up()
        raise pynvml.NVMLError_Uninitialized()  # the handle this scrape holds is from before the re-init

    rig.gpus[1].hooks["nvmlDeviceGetPowerUsage"] = reinit_then_stale_handle
    s = rig.scrape()
    assert (rig.session.generation, rig.nvml.num_init, rig.nvml.num_shutdown) == (2, 2, 1)
    assert s[key("llm_gpu_nvml_up")] == 1.0
    assert [s[gpu_key("llm_gpu_up", i, u)] for i, u in enumerate(UUIDS)] == [1.0, 1.0, 1.0]
    assert s[gpu_key("llm_gpu_power_watts", 1, U1)] == 512.345


def test_unknown_error_marks_only_that_gpu_down(rig: Rig) -> None:
    rig.scrape()
    rig.gpus[0].errors["nvmlDeviceGetTemperature"] = pynvml.NVMLError_Unknown
    rig.clock.advance(31)
    s = rig.scrape()
    assert [s[gpu_key("llm_gpu_up", i, u)] for i, u in enumerate(UUIDS)] == [0.0, 1.0, 1.0]
    assert s[key("llm_gpu_collector_success", collector="temperature")] == 0.0


def test_driver_gone_takes_every_gpu_down_then_recovers(rig: Rig) -> None:
    rig.scrape()
    rig.nvml.driver_loaded = False
    s = rig.scrape()
    assert s[key("llm_gpu_nvml_up")] == 0.0
    assert [s[gpu_key("llm_gpu_up", i, u)] for i, u in enumerate(UUIDS)] == [0.0, 0.0, 0.0]
    assert all(n in ("llm_gpu_up",) for n in names_for_gpu(s, U0))
    assert s[key("llm_gpu_collector_success", collector="nvml")] == 0.0
    assert not any(name == "llm_gpu_nvml_info" for name, _ in s)
    assert s[key("llm_gpu_nvml_error_info", error="nvmlDeviceGetCount: Driver Not Loaded (code 9)")] == 1.0
    rig.nvml.driver_loaded = True
    s = rig.scrape()  # first retry comes at once after a loss
    assert s[key("llm_gpu_nvml_up")] == 1.0
    assert not any(name == "llm_gpu_nvml_error_info" for name, _ in s)
    assert s[gpu_key("llm_gpu_memory_used_bytes", 2, U2)] == 80_688_971_776.0


def test_library_missing_serves_nvml_down_and_retries_on_interval(caplog) -> None:
    rig = Rig(library_present=False)
    with caplog.at_level(logging.INFO, logger="llm-gpu-exporter"):
        s = rig.scrape()
        rig.clock.advance(29)
        rig.scrape()
        assert rig.nvml.num_init == 1  # not yet due
        rig.clock.advance(1)
        s = rig.scrape()
        assert rig.nvml.num_init == 2
    assert s[key("llm_gpu_nvml_up")] == 0.0
    assert s[key("llm_gpu_collector_success", collector="nvml")] == 0.0
    assert s[key("llm_gpu_nvml_init_attempts_total", result="failure")] == 2.0
    assert s[key("llm_gpu_nvml_error_info", error="NVML Shared Library Not Found (code 12)")] == 1.0
    assert not any(name.startswith("llm_gpu_memory") or name == "llm_gpu_up" for name, _ in s)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "NVML unavailable: NVML Shared Library Not Found (code 12); "
        "serving llm_gpu_nvml_up 0, retrying every 30s"
    ]
    rig.nvml.library_present = True  # the driver gets installed
    rig.clock.advance(30)
    s = rig.scrape()
    assert s[key("llm_gpu_nvml_up")] == 1.0
    assert s[gpu_key("llm_gpu_up", 0, U0)] == 1.0


def test_process_memory_by_pid_and_name() -> None:
    rig = Rig(num_gpus=2)
    rig.gpus[0].processes = [(4242, 3 * 2**30), (4242, 2**30), (5151, None), (6161, 512 * 2**20)]
    rig.nvml.process_names = {4242: "/usr/bin/python3.11"}
    s = rig.scrape()
    procs = {k: v for k, v in s.items() if k[0] == "llm_gpu_process_memory_used_bytes"}
    assert procs == {
        gpu_key("llm_gpu_process_memory_used_bytes", 0, U0, pid="4242", process="python3.11"): 4.0 * 2**30,
        gpu_key("llm_gpu_process_memory_used_bytes", 0, U0, pid="6161", process="unknown"): 512.0 * 2**20,
    }


def test_no_process_metrics_never_asks_nvml_for_processes() -> None:
    rig = Rig(num_gpus=1, process_metrics=False)
    rig.gpus[0].processes = [(4242, 2**30)]
    rig.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"] = (
        pynvml.NVMLError_Unknown
    )  # would mark it down
    s = rig.scrape()
    assert not any(name == "llm_gpu_process_memory_used_bytes" for name, _ in s)
    assert key("llm_gpu_collector_success", collector="processes") not in s
    assert s[gpu_key("llm_gpu_up", 0, U0)] == 1.0


def test_hung_nvml_call_serves_nvml_down_without_piling_up_reads(caplog) -> None:
    rig = Rig(read_timeout_s=60.0)  # generous while NVML answers: a loaded CI machine must not look hung
    assert rig.scrape()[key("llm_gpu_nvml_up")] == 1.0  # read in the worker thread
    release = threading.Event()
    rig.gpus[1].hangs["nvmlDeviceGetPowerUsage"] = release
    rig.collector.read_timeout_s = 0.2  # the read below really is blocked, so this wait always runs out
    with caplog.at_level(logging.WARNING, logger="llm-gpu-exporter"):
        for _ in range(2):
            s = rig.scrape()
            assert s[key("llm_gpu_nvml_up")] == 0.0
            assert s[key("llm_gpu_collector_success", collector="nvml")] == 0.0
            assert [s[gpu_key("llm_gpu_up", i, u)] for i, u in enumerate(UUIDS)] == [0.0, 0.0, 0.0]
            assert names_for_gpu(s, U0) == {"llm_gpu_up"}
        assert (
            sum(t.name == "nvml-read" for t in threading.enumerate()) == 1
        )  # one stuck read, not one per scrape
        del rig.gpus[1].hangs["nvmlDeviceGetPowerUsage"]
        release.set()
        assert rig.collector._inflight.done.wait(30)
    rig.collector.read_timeout_s = 60.0
    hung = [r.getMessage() for r in caplog.records if "has not answered" in r.getMessage()]
    assert len(hung) == 1
    assert any(r.getMessage().startswith("NVML answered again after") for r in caplog.records)
    s = rig.scrape()
    assert s[key("llm_gpu_nvml_up")] == 1.0
    assert s[gpu_key("llm_gpu_power_watts", 1, U1)] == 512.345
