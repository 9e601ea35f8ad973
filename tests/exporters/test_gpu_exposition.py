"""The fake-NVML collector's full metric set, in Prometheus text format, passes promtool check metrics."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from gpu_rig import Rig
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.families import SPECS


def _full_scrape() -> str:
    rig = Rig()
    rig.gpus[0].processes = [(4242, 2**30)]
    rig.nvml.process_names = {4242: "/usr/bin/python3"}
    rig.scrape()
    rig.watcher.poll_once()
    rig.nvml.emit_xid(rig.gpus[0], 79)
    assert rig.watcher.poll_once() is True
    registry = CollectorRegistry()
    registry.register(rig.collector)
    return generate_latest(registry).decode()


def test_full_scrape_has_every_metric_of_the_contract() -> None:
    text = _full_scrape()
    names = {family.name for family in text_string_to_metric_families(text)}
    # the parser strips _total from counters and _info from info metrics
    expected = {spec.name.removesuffix("_total") for spec in SPECS} - {
        "llm_gpu_nvml_error_info"
    }  # only while down
    assert names == expected


def _no_library_scrape() -> str:
    registry = CollectorRegistry()
    registry.register(Rig(library_present=False).collector)
    text = generate_latest(registry).decode()
    assert "llm_gpu_nvml_error_info{" in text
    return text


@pytest.mark.parametrize("make_scrape", [_full_scrape, _no_library_scrape], ids=["full-set", "no-library"])
def test_promtool_check_metrics_is_clean(make_scrape) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not on PATH: run `make system-deps` (Debian package prometheus)"
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=make_scrape(), capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
