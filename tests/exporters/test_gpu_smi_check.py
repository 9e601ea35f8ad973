"""The nvidia-smi cross-check script, against an exporter on a fake NVML and saved nvidia-smi CSV output."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml

from exporters import check_vs_nvidia_smi
from exporters.cli import ExporterConfig, run
from exporters.smi_compare import CHECKS, SmiParseError, parse_apps_csv, parse_smi_csv, smi_number

UUID = "GPU-11111111-2222-3333-4444-555555555555"
# `nvidia-smi --query-gpu=... --format=csv,nounits` as the driver prints it (units stay in the header).
SMI_CSV = (
    "index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], "
    "utilization.memory [%], temperature.gpu, power.draw [W], enforced.power.limit [W], clocks.sm [MHz], "
    "clocks.mem [MHz], memory.reserved [MiB], ecc.errors.corrected.volatile.total, "
    "ecc.errors.uncorrected.volatile.total, clocks_event_reasons.active\n"
    f"0, {UUID}, NVIDIA H100 80GB HBM3, 81559, 76951, 4096, 87, 45, 64, 512.34, 700.00, 1980, 2619, 512, 7, 0, "
    "0x0000000000000044\n"
)
APPS_CSV = f"gpu_uuid, pid, used_gpu_memory [MiB]\n{UUID}, 4242, 1024\n"


def test_parse_smi_csv_reads_header_fields_and_raw_values() -> None:
    gpus = parse_smi_csv(SMI_CSV)
    assert list(gpus) == [UUID]
    assert gpus[UUID]["memory.used"] == "76951"
    assert gpus[UUID]["name"] == "NVIDIA H100 80GB HBM3"
    by_field = {c.smi_field: c for c in CHECKS}
    assert smi_number("76951", by_field["memory.used"]) == 76951 * 1024 * 1024
    assert smi_number("0x0000000000000244", by_field["clocks_event_reasons.active"]) == 0x44  # 0x200 not ours
    assert smi_number("[N/A]", by_field["power.draw"]) is None
    assert smi_number("[Not Supported]", by_field["ecc.errors.corrected.volatile.total"]) is None
    assert parse_apps_csv(APPS_CSV) == [(UUID, "4242", 1024.0 * 1024 * 1024)]
    assert parse_apps_csv("gpu_uuid, pid, used_gpu_memory [MiB]\n") == []


@pytest.mark.parametrize("text", ["", "No devices were found\n", "uuid, memory.used [MiB]\nGPU-1, 5, 6\n"])
def test_parse_smi_csv_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(SmiParseError):
        parse_smi_csv(text)


@pytest.fixture
def exporter_url():
    gpu = FakeGpu(uuid=UUID, processes=[(4242, 2**30)])
    nvml = FakeNvml([gpu])
    nvml.process_names = {4242: "/usr/bin/python3"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = threading.Event()
    config = ExporterConfig(port=port, xid_wait_ms=20, nvml_timeout_s=60.0)
    thread = threading.Thread(target=run, args=(config, nvml, stop), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "exporter did not start"
            time.sleep(0.05)
    yield url, gpu
    stop.set()
    thread.join(30)


def test_agreeing_figures_exit_0(exporter_url, tmp_path: Path, capsys) -> None:
    url, _ = exporter_url
    (tmp_path / "smi.csv").write_text(SMI_CSV)
    (tmp_path / "apps.csv").write_text(APPS_CSV)
    code = check_vs_nvidia_smi.main(
        [
            "--url",
            url,
            "--smi-csv",
            str(tmp_path / "smi.csv"),
            "--apps-csv",
            str(tmp_path / "apps.csv"),
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "r.json").read_text())
    assert {v["field"] for v in report} == {
        "llm_gpu_up",
        "memory.total",
        "memory.used",
        "memory.free",
        "memory.reserved",
        "utilization.gpu",
        "utilization.memory",
        "temperature.gpu",
        "power.draw",
        "enforced.power.limit",
        "clocks.sm",
        "clocks.mem",
        "ecc.errors.corrected.volatile.total",
        "ecc.errors.uncorrected.volatile.total",
        "clocks_event_reasons.active",
        "process 4242 used_memory",
    }
    assert out.rstrip().endswith("16 compared, 0 not ok")


def test_disagreeing_and_extra_figures_exit_1(exporter_url, tmp_path: Path, capsys) -> None:
    url, gpu = exporter_url
    smi = SMI_CSV.replace("512.34, 700.00", "300.00, 700.00")  # power draw off by 212 W
    smi = smi.replace(", 7, 0, 0x", ", [Not Supported], 0, 0x")  # the exporter must then omit the field
    (tmp_path / "smi.csv").write_text(smi)
    assert check_vs_nvidia_smi.main(["--url", url, "--smi-csv", str(tmp_path / "smi.csv")]) == 1
    lines = {ln.split()[1]: ln.split()[-1] for ln in capsys.readouterr().out.splitlines()[1:-1]}
    assert lines["power.draw"] == "differs"
    assert lines["ecc.errors.corrected.volatile.total"] == "extra"
    assert lines["memory.used"] == "ok"


def test_usage_and_environment_errors_are_one_line_exit_2(tmp_path: Path, capsys) -> None:
    assert check_vs_nvidia_smi.main(["--rounds", "0"]) == 2
    assert capsys.readouterr().err == "check_vs_nvidia_smi: error: --rounds must be at least 1, got 0\n"
    missing = tmp_path / "nope.csv"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    assert (
        check_vs_nvidia_smi.main(["--url", f"http://127.0.0.1:{port}/metrics", "--smi-csv", str(missing)])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"check_vs_nvidia_smi: error: cannot scrape http://127.0.0.1:{port}/metrics")
    assert err.count("\n") == 1
