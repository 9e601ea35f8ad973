"""Memory failures told apart by phase: weights, KV allocation at start-up, run time; and driver mismatch."""

import re
from bisect import bisect_right

from triage.model import Confidence, Event, Finding
from triage.rules import Candidate, Facts, Need, Rule, needs_of, request_ids_of

WEIGHT_FRAMES = frozenset({
    "load_weights", "load_model", "_load_model", "from_pretrained", "load_state_dict", "safe_open",
    "load_checkpoint", "_load_weights", "get_model", "load_model_weights", "load_file", "_load_state_dict",
    "initialize_model", "_initialize_model", "download_and_load_weights",
    "_create_weight", "_create_weight_func", "create_shared_weights",  # (LMDeploy TurboMind, its empty weights made)
    "build_model", "create_weights",  # (LMDeploy PyTorch: executor build_model, a layer's create_weights)
})
KV_FRAMES = frozenset({
    "determine_available_memory", "profile_run", "_dummy_run", "_dummy_sampler_run", "capture_model",
    "initialize_kv_cache", "_initialize_kv_caches", "initialize_cache", "determine_num_available_blocks",
    "warmup", "warmup_model", "compile_or_warm_up_model", "_allocate_kv_cache", "allocate_kv_cache",
    "init_kv_cache", "_init_cache", "initialize_from_config", "_initialize_kv_cache",
})
PHASE_TO_ID = {"weights": "oom-weights", "kv": "oom-kv-capacity", "runtime": "oom-runtime"}
_PHASE_OF_MARKER = {"phase.weights_loading": "weights", "phase.weights_loaded": "kv", "phase.kv_setup": "kv",
                    "phase.serving": "runtime"}
_ENGINE_PHASE = {"load": "weights", "startup": "kv", "step": "runtime"}
MAX_UNPHASED = 1000  # OOMs held per file until a phase marker; more are guessed at once
MAX_TIMELINE = 10_000  # phase changes kept for placing host OOM kills
# A container killed for memory after running this long was serving: a start-up (weights loaded, the KV
# cache set up, kernels compiled) takes minutes, tens of minutes for the largest models from network storage.
SERVING_AFTER_S = 3600.0
_OLLAMA_GENERATION = ("/api/chat", "/api/generate", "/api/embed", "/v1/")  # (not /api/tags, /api/ps, HEAD /)
RAN_NEAR_LINES = 8  # a container's Started/Finished lines this near its OOMKilled line are of its run
MAX_RUNS = 100
_FUNC = re.compile(r"in (\w+)\n")
_OOM_WORDS = ("out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")

TITLES = {
    "oom-weights": "Out of memory while loading the model weights",
    "oom-kv-capacity": "Not enough memory for the KV cache at start-up",
    "oom-runtime": "Out of memory at run time, under load",
    "driver-mismatch": "CUDA driver and runtime do not match",
}
EXPLAIN = {
    "oom-weights": "The weights did not fit: the failure happened before the model finished loading, so no "
                   "setting of the KV cache or of the load can help; the model needs more memory, fewer bytes "
                   "per weight, or more GPUs.",
    "oom-kv-capacity": "The weights loaded, but the memory left for the KV cache cannot hold one sequence of "
                       "max_model_len tokens (or warm-up at the configured batch size), so the engine refused "
                       "to start.",
    "oom-runtime": "The engine was serving when an allocation failed: a large batch, long prompts or "
                   "fragmentation pushed memory past the device's capacity after start-up.",
    "driver-mismatch": "The CUDA runtime the engine was built against needs a newer driver than the one "
                       "installed (or the driver and its library disagree); errors that follow, including "
                       "out-of-memory-looking ones, are symptoms.",
}
HOST_NOTE = " Here host memory ran out (the kernel's OOM killer or a container limit, exit code 137), not the GPU"
_STAGING_PEAK = ": staging weights in CPU memory is the usual peak."
HOST_PEAK = {"oom-weights": _STAGING_PEAK, "oom-kv-capacity": _STAGING_PEAK,
             "oom-runtime": ": at run time the host side grows with the requests in flight (their inputs, images, "
                            "responses), CPU swap or offload space, and any leak over hours."}
HOST_RUNTIME_STEP = "graph the container's memory (container_memory_working_set_bytes) over the hours before the " \
                    "kill: a steady climb is a leak, a jump is a burst of large requests"
HOST_STEP = "raise the container or host memory limit (kubectl describe pod: Limits, Last State OOMKilled)"
NEXT_STEPS = {
    "oom-weights": ["llmtriage plan --model <model dir> --gpu-memory <GiB> (weights vs memory)",
                    "use a quantized checkpoint or --dtype bfloat16/float16 instead of float32",
                    "--tensor-parallel-size N to shard the weights across GPUs",
                    "nvidia-smi: make sure no other process holds the GPU"],
    "oom-kv-capacity": ["llmtriage plan --model <model dir> --gpu-memory <GiB> --max-model-len N",
                        "lower --max-model-len to the estimated maximum the error prints",
                        "raise --gpu-memory-utilization (or --kv-cache-memory / --num-kv-blocks)",
                        "lower --max-num-seqs if warm-up failed"],
    "oom-runtime": ["lower --max-num-seqs and --max-num-batched-tokens (smaller batches)",
                    "lower --gpu-memory-utilization to leave headroom for activations",
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when reserved-but-unallocated is large",
                    "look at the prompts in flight: very long prompts raise activation memory"],
    "driver-mismatch": ["nvidia-smi (the driver's highest supported CUDA version, top right)",
                        "python -c 'import torch; print(torch.version.cuda, torch.cuda.is_available())'",
                        "upgrade the NVIDIA driver, or install a torch/vLLM build for the installed CUDA",
                        "after a driver upgrade without reboot (library mismatch): reboot or reload the module"],
}


class MemoryRule(Rule):
    needs = needs_of(
        ("oom.cuda", "oom.host", "oom.kv_capacity", "oom.weights", "driver.mismatch", "engine.error",
         "engine.startup", "engine.stats", "phase.weights_loading", "phase.weights_loaded", "phase.kv_setup",
         "phase.serving", "phase.start_failed", "gpu.driver", "cuda.runtime", "gpu.memory", "request.finished",
         "metric", "engine.stats.totals", "request.finished.totals", "container.ran", "http.access",
         "http.access.totals"),
        http_access=Need("http.access", not_from=("engine-json",)))

    def __init__(self):
        self.cands = {fid: Candidate(fid) for fid in (*PHASE_TO_ID.values(), "driver-mismatch")}
        self.file_phase: dict[str, str] = {}
        self.start_failed: dict[str, str | None] = {}  # file -> its phase when the engine failed to start
        # bare CUDA OOMs with no phase marker before them in their file, until the next marker tells more
        self.unphased: dict[str, list[Event]] = {}
        # host OOM kills from a file with no marker (a kernel log): placed on every file's markers at the end
        self.host_unphased: list[Event] = []
        self.timeline: list[tuple] = []  # (time, phase) of the phase markers of all files, as seen
        self.num_guessed: dict[str, int] = {}
        self.num_known: dict[str, int] = {}
        self.driver_cuda: tuple[Event, str] | None = None
        self.runtime_cuda: tuple[Event, str] | None = None
        self.gpu_full: Event | None = None
        self.error_metrics: list[Event] = []  # finish_reason="error" increases: corroborate a runtime OOM
        self.runs: list[Event] = []  # a container's last run (kubectl describe, docker inspect): its uptime
        self.killed_after: float | None = None  # the longest run of a container killed while serving

    def handlers(self):
        table = {"request.finished": self._finished, "request.finished.totals": self._finished_totals, "phase.start_failed": self._start_failed,
                 "driver.mismatch": self._driver_mismatch, "oom.kv_capacity": self._kv_capacity,
                 "engine.error": self._engine_error, "gpu.driver": self._gpu_driver,
                 "cuda.runtime": self._cuda_runtime, "gpu.memory": self._gpu_memory, "metric": self._metric,
                 "container.ran": self._container_ran, "http.access": self._access,
                 "http.access.totals": self._access_totals}
        for kind in ("oom.cuda", "oom.host", "oom.weights"):
            table[kind] = self._oom_line
        for kind in ("phase.weights_loading", "phase.weights_loaded", "phase.kv_setup", "phase.serving",
                     "engine.startup", "engine.stats", "engine.stats.totals"):  # (a stats line: serving)
            table[kind] = self._phase
        return table

    def _finished(self, ev: Event) -> None:
        if ev.fields.get("finish_reason") == "error" and any(w in str(ev.fields.get("error", "")) for w in _OOM_WORDS):
            self.cands["oom-runtime"].add(ev, "request.finished.error", False, request_ids_of(ev))

    def _finished_totals(self, ev: Event) -> None:
        """Requests read in bulk finished without an error: nothing of an OOM in them."""

    def _start_failed(self, ev: Event) -> None:  # the engine did not start: an OOM just before was at start-up
        self._resolve(ev.file, "weights")
        # an OOM after it (vLLM V1 prints "EngineCore failed to start." above its traceback) is at
        # start-up too: in the phase the file was in, else guessed at weight loading
        self.start_failed[ev.file] = self.file_phase.pop(ev.file, None)

    def _phase(self, ev: Event) -> None:
        phase = _PHASE_OF_MARKER.get(ev.kind, "runtime")
        self._resolve(ev.file, "runtime")
        self.start_failed.pop(ev.file, None)
        if ev.ts is not None and self.file_phase.get(ev.file) != phase and len(self.timeline) < MAX_TIMELINE:
            self.timeline.append((ev.ts, phase))  # where a file's phase changes (not every stats line)
        self.file_phase[ev.file] = phase

    def _driver_mismatch(self, ev: Event) -> None:
        self.cands["driver-mismatch"].add(ev, "driver.mismatch", True)
        self.cands["driver-mismatch"].cause = self.cands["driver-mismatch"].cause or ev.fields.get("cause")

    def _kv_capacity(self, ev: Event) -> None:
        if ev.source != "engine-json":  # engine.error covers its own
            c = self.cands["oom-kv-capacity"]
            c.add(ev, ev.kind, True)
            c.cause = c.cause or ev.fields.get("cause")

    def _oom_line(self, ev: Event) -> None:
        if ev.source != "engine-json":
            self._oom(ev)

    def _gpu_driver(self, ev: Event) -> None:
        self.driver_cuda = (ev, ev.fields["cuda"])

    def _cuda_runtime(self, ev: Event) -> None:
        self.runtime_cuda = (ev, ev.fields["version"])

    def _gpu_memory(self, ev: Event) -> None:
        if ev.fields["ratio"] >= 0.95:
            self.gpu_full = ev

    def _access(self, ev: Event) -> None:
        """Ollama's access line of a generation it answered: a model was loaded and serving then (its log has
        no other line that says so while it serves). Other access lines tell nothing of the engine's phase:
        a gateway's may be another replica's, a health check answers while weights load."""
        f = ev.fields
        if (ev.source == "ollama" and 200 <= f["status"] < 300 and f.get("method") == "POST"
                and f.get("path", "").startswith(_OLLAMA_GENERATION) and self.file_phase.get(ev.file) != "runtime"):
            self._phase(Event(ev.ts, ev.source, "phase.serving", {}, ev.file, ev.line, ev.text))

    def _access_totals(self, ev: Event) -> None:
        """Access lines read in bulk: none is Ollama's (its lines are read one by one), so nothing to mark."""

    def _container_ran(self, ev: Event) -> None:
        if len(self.runs) < MAX_RUNS:
            self.runs.append(ev)

    def _metric(self, ev: Event) -> None:
        if ev.fields["metric"] == "finished_total" and ev.fields["increase"] > 0:
            labels = ev.fields["labels"]
            if (labels.get("finish_reason") or labels.get("finished_reason")) == "error":
                self.error_metrics.append(ev)

    def _engine_error(self, ev: Event) -> None:
        f = ev.fields
        text = f"{f.get('exc_type', '')} {f.get('message', '')}"
        if f.get("exc_type") == "CapacityError" or "KV cache is needed" in text:
            c = self.cands["oom-kv-capacity"]
            c.add(ev, "engine.error.capacity", True)
            c.cause = c.cause or "kv-below-max-model-len"
            return
        if not any(w in text for w in _OOM_WORDS):
            return
        phase = self._phase_from_frames(_FUNC.findall(str(f.get("traceback") or "")))
        if phase is None:
            # llmserve refuses weights that exceed the budget at start-up ("Model weights take X GiB").
            phase = "weights" if "weights" in str(f.get("message", "")).lower() else _ENGINE_PHASE.get(f.get("phase"))
        fid = PHASE_TO_ID[phase or "runtime"]
        self.num_known[fid] = self.num_known.get(fid, 0) + 1
        self.cands[fid].add(ev, f"engine.error.{f.get('phase')}", True, request_ids_of(ev))

    @staticmethod
    def _phase_from_frames(frames: list[str]) -> str | None:
        names = set(frames)
        if names & WEIGHT_FRAMES:
            return "weights"
        if names & KV_FRAMES:
            return "kv"
        if {"execute_model", "step", "_process_engine_step", "step_with_batch_queue", "generate"} & names:
            return "runtime"
        return None

    def _oom(self, ev: Event) -> None:
        phase = self._phase_from_frames(ev.fields.get("frames", []))
        if phase is None:  # a message that names its phase (the catalog's fixed field), then the file's markers
            phase = ev.fields.get("phase") or self.file_phase.get(ev.file)
        if phase is None and ev.file in self.start_failed:
            known = self.start_failed[ev.file]
            if known in ("weights", "kv"):
                self._add_known(ev, known)
            else:
                self._add_guessed(ev, "weights")
            return
        if phase is None:
            # No marker: a host OOM kill most often hits while weights load; a bare CUDA OOM is run time,
            # unless a marker after it says the engine never started.
            host = ev.kind in ("oom.host", "oom.weights")
            pending = self.host_unphased if host else self.unphased.setdefault(ev.file, [])
            if len(pending) < MAX_UNPHASED:
                pending.append(ev)
            else:
                self._add_guessed(ev, "weights" if host else "runtime")
            return
        self._add_known(ev, phase)

    def _resolve(self, file: str, phase: str) -> None:
        """The OOMs waiting for a phase in file, guessed at phase."""
        for ev in self.unphased.pop(file, ()):
            self._add_guessed(ev, phase)

    def _add_known(self, ev: Event, phase: str) -> None:
        """An OOM at a phase the logs show (an OOM that names the weights is at weight loading whatever)."""
        fid = PHASE_TO_ID["weights" if ev.kind == "oom.weights" and phase == "runtime" else phase]
        self.num_known[fid] = self.num_known.get(fid, 0) + 1
        self.cands[fid].add(ev, ev.kind, True, request_ids_of(ev))

    def _add_guessed(self, ev: Event, phase: str) -> None:
        fid = PHASE_TO_ID[phase]
        self.num_guessed[fid] = self.num_guessed.get(fid, 0) + 1
        self.cands[fid].add(ev, ev.kind, True, request_ids_of(ev))

    def _place_host_ooms(self) -> None:
        """A host OOM kill takes the phase of the last marker before it in any file (an engine log beside
        the kernel's); with none, it is guessed at weight loading, when host RAM peaks."""
        timeline = sorted(self.timeline, key=lambda entry: entry[0])
        times = [t for t, _ in timeline]
        for ev in self.host_unphased:
            ran = self._run_of(ev)
            if ran is not None and ran.fields["seconds"] >= SERVING_AFTER_S:
                self._add_guessed(ev, "runtime")
                self.cands["oom-runtime"].add(ran, "container.uptime", False)
                self.killed_after = max(self.killed_after or 0.0, ran.fields["seconds"])
                continue
            at = bisect_right(times, ev.ts) if ev.ts is not None else 0
            if at == 0:
                self._add_guessed(ev, "weights")
            else:
                self._add_known(ev, timeline[at - 1][1])
        self.host_unphased = []

    def _run_of(self, ev: Event) -> Event | None:
        """The container run printed beside a kill's line (its Started and Finished under the OOMKilled
        reason), or None."""
        near = [ran for ran in self.runs if ran.file == ev.file and ev.line is not None and ran.line is not None
                and abs(ran.line - ev.line) <= RAN_NEAR_LINES]
        return min(near, key=lambda ran: abs(ran.line - ev.line), default=None)

    def findings(self, facts: Facts) -> list[Finding]:
        for file in list(self.unphased):  # no marker after them either: run time, as guessed
            self._resolve(file, "runtime")
        self._place_host_ooms()
        self._driver_versions()
        out = []
        for fid, cand in self.cands.items():
            if not cand:
                continue
            confidence = None
            if self.num_guessed.get(fid) and not self.num_known.get(fid) and fid != "oom-kv-capacity":
                confidence = Confidence.MEDIUM
                cand.counter.append("the start-up phase is not visible in these logs; the phase is inferred")
            if fid == "oom-runtime":
                for ev in self.error_metrics[:3]:
                    cand.add(ev, "metric.finished_error", False)
            if fid.startswith("oom") and self.gpu_full is not None:
                cand.add(self.gpu_full, "nvidia-smi.memory_full", False)
            if fid.startswith("oom") and self.cands["driver-mismatch"]:
                cand.counter.append("a CUDA driver/runtime mismatch was also seen: it may be the real cause")
            explain, steps = EXPLAIN[fid], NEXT_STEPS[fid]
            if any(g.signal == "oom.host" for g in cand.evidence.groups.values()):
                explain += HOST_NOTE + HOST_PEAK[fid]
                steps = [HOST_STEP, HOST_RUNTIME_STEP, *steps] if fid == "oom-runtime" else [HOST_STEP, *steps]
            if fid == "oom-runtime" and self.killed_after is not None:
                explain += (f" The container had run {_duration(self.killed_after)} when it was killed: long past "
                            "its start-up, which takes minutes.")
            out.append(cand.finding(TITLES[fid], explain, steps, confidence))
        return out

    def _driver_versions(self) -> None:
        """nvidia-smi's CUDA Version below the runtime a wheel was built for means the driver is too old."""
        if self.driver_cuda is None or self.runtime_cuda is None:
            return
        try:
            driver = tuple(int(x) for x in self.driver_cuda[1].split(".")[:2])
            runtime = tuple(int(x) for x in self.runtime_cuda[1].split(".")[:2])
        except ValueError:
            return
        if runtime > driver:
            c = self.cands["driver-mismatch"]
            c.add(self.driver_cuda[0], "nvidia-smi.cuda_version", False)
            c.add(self.runtime_cuda[0], "runtime.cuda_version", False)
            c.cause = c.cause or "driver-too-old"


def _duration(seconds: float) -> str:
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"
