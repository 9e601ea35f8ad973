"""GPU exporter test rig: a manual clock, a collector on a fake NVML, a scrape as a dict."""

from __future__ import annotations

from fake_nvml import FakeGpu, FakeNvml

from exporters.collector import GpuCollector
from exporters.nvml import NvmlSession
from exporters.xid import XidWatcher

UUIDS = (
    "GPU-11111111-2222-3333-4444-555555555555",
    "GPU-66666666-7777-8888-9999-000000000000",
    "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
)


class ManualClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def scrape(collector: GpuCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One collect(): every sample keyed by (name, sorted labels)."""
    out = {}
    for family in collector.collect():
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def gpu_key(
    name: str, index: int, uuid: str, gpu_name: str = "NVIDIA H100 80GB HBM3", **extra: str
) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"gpu": str(index), "uuid": uuid, "name": gpu_name, **extra}
    return (name, tuple(sorted(labels.items())))


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


def names_for_gpu(samples: dict, uuid: str) -> set[str]:
    return {name for (name, labels) in samples if ("uuid", uuid) in labels}


class Rig:
    """A fake NVML with three GPUs, a session on a manual clock, a watcher and a collector."""

    def __init__(
        self,
        num_gpus: int = 3,
        library_present: bool = True,
        process_metrics: bool = True,
        read_timeout_s: float | None = None,
    ):
        self.gpus = [FakeGpu(uuid=UUIDS[i]) for i in range(num_gpus)]
        self.nvml = FakeNvml(self.gpus, library_present=library_present)
        self.clock = ManualClock()
        self.wall = ManualClock(1_790_000_000.0)
        self.session = NvmlSession(self.nvml, retry_interval_s=30.0, clock=self.clock)
        self.watcher = XidWatcher(self.session, wait_ms=10, wall_clock=self.wall)
        self.collector = GpuCollector(
            self.session, self.watcher, process_metrics=process_metrics, read_timeout_s=read_timeout_s
        )

    def scrape(self) -> dict:
        return scrape(self.collector)
