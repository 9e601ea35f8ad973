"""The real llm-gpu-exporter over the test suite's fake NVML: one healthy, busy GPU for the game days.

Without a GPU the exporter alone serves only `llm_gpu_nvml_up 0`: LLMGPUNVMLDown would fire and the
GPU board would stay empty. So on such a machine, and for the scenarios that prove the dashboards
everywhere, the harness runs the exporter's own
`run()` (HTTP server, collector, XID thread: all real) over `tests/exporters/fake_nvml.py`, the same
fake NVML its tests use. The GPU is healthy: no thermal throttling, no ECC or XID errors, memory
well below the alert threshold, so no GPU alert may fire.

Usage: python -m gameday.fake_gpu --host 127.0.0.1 --port PORT
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

FAKE_NVML_DIR = Path(__file__).resolve().parents[1] / "tests" / "exporters"
SW_POWER_CAP = 0x4  # a busy GPU at its power cap: active clock reason, not a thermal one


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gameday.fake_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if not (FAKE_NVML_DIR / "fake_nvml.py").exists():
        print(f"gameday.fake_gpu: error: {FAKE_NVML_DIR / 'fake_nvml.py'} not found", file=sys.stderr)
        return 2
    sys.path.insert(0, str(FAKE_NVML_DIR))
    from fake_nvml import FakeGpu, FakeNvml

    from exporters.cli import ExporterConfig, run

    total = 85_520_809_984
    gpu = FakeGpu(uuid="GPU-6a6d6564-0000-4000-8000-67616d656461", memory_total=total,
                  memory_free=total // 4, memory_used=total - total // 4 - 536_870_912,
                  throttle_mask=SW_POWER_CAP, ecc_corrected=0, ecc_uncorrected=0, pcie_replay=0,
                  retired_single_bit=[], remapped_rows=(0, 0, 0, 0))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    config = ExporterConfig(host=args.host, port=args.port, process_metrics=False)
    return run(config, FakeNvml([gpu]), stop)


if __name__ == "__main__":
    sys.exit(main())
