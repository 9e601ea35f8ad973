"""Per-process state of a run: config, records, client log, server facts, and the worker-to-master merge.

Workers ship their new records to the master with every stats report (`report_to_master`) and once
more on stop (a `loadgen_records` message), so the master writes one report over all of them.
"""

import logging
import random
import sys
import time

import gevent
from gevent.lock import Semaphore
from locust.runners import MasterRunner, WorkerRunner

from loadgen.client import verify_from_environment
from loadgen.clientlog import ClientLog, ClientLogError
from loadgen.looplag import LoopLag
from loadgen.options import ConfigError, LoadgenConfig, config_from_options
from loadgen.profiles import ArrivalSchedule
from loadgen.prompts import Calibration, DatasetError, PromptSettings, load_sharegpt, shared_prefix_text
from loadgen.records import RequestRecord
from loadgen.report import ReportError, RunInfo, write_report
from loadgen.server_info import ServerInfoError, discover_max_model_len, list_models, probe_tokens_per_word

logger = logging.getLogger("loadgen")
RECORDS_MESSAGE = "loadgen_records"
FLUSH_MESSAGE = "loadgen_flush"
LONG_CONTEXT_FILL = 0.9  # long-context prompts take this share of what max_model_len leaves


_DATASETS: dict[str, list] = {}  # path -> entries: ShareGPT files run to hundreds of MB, read them once


def _dataset(path: str) -> list:
    if path not in _DATASETS:
        _DATASETS[path] = load_sharegpt(path)
    return _DATASETS[path]


class SetupError(Exception):
    """The run cannot start: the message is the one line the user sees."""


class LoadgenState:
    def __init__(self, config: LoadgenConfig, environment):
        self.config = config
        self.environment = environment
        self.records: list[RequestRecord] = []
        self.unsent: list[RequestRecord] = []  # worker: not yet shipped to the master
        self.model: str | None = config.model
        self.max_model_len: int | None = config.max_model_len
        self.calibration = Calibration()
        self.prefix_text: str | None = None
        self.dataset = _dataset(config.dataset) if config.dataset else None
        self.log = ClientLog(config.client_log, config.client_log_format) if config.client_log else None
        self.rng = random.Random(config.seed)
        self.schedule = ArrivalSchedule(config.rate, random.Random(self.rng.random()), share=self._rate_share)
        self._resolve_lock = Semaphore()
        self._resolved = False
        self.verify = verify_from_environment()  # as the run starts (None: sessions look before each request)
        self._dirty = False
        self._written = False
        self.worker_name = "local"
        self.final_worker_ids: set[str] = set()  # master: workers whose last records arrived
        self.cpu_warning = False  # Locust warned of a client process above 90% CPU (this one or a worker)
        self.max_cpu_percent: float | None = None
        self.loop_lag = LoopLag()
        self.worker_lag_p99_s: float | None = None  # master: the worst p99 a worker reported

    def loop_lag_p99_s(self) -> float | None:
        """The worst loop lateness (p99) of this process and every worker heard from."""
        values = [v for v in (self.loop_lag.p99_s(), self.worker_lag_p99_s) if v is not None]
        return max(values) if values else None

    def note_cpu(self, cpu_percent: float) -> None:
        self.cpu_warning = True
        self.max_cpu_percent = max(cpu_percent, self.max_cpu_percent or 0.0)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    def _rate_share(self) -> float:
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):  # users are spread evenly, so is the arrival rate
            return min(1.0, max(1, runner.user_count) / self.config.max_concurrency)
        return 1.0

    @property
    def resolved(self) -> bool:
        """Whether `resolve` has succeeded (the server's model and lengths are known)."""
        return self._resolved

    def resolve(self, host: str) -> None:
        """Model, max_model_len and tokens per word, once per process; ServerInfoError if unreachable."""
        with self._resolve_lock:
            if self._resolved:
                return
            if self.model is None:
                self.model = list_models(host, self.headers)[0]["id"]
            if self.config.profile == "long-context" and self.max_model_len is None:
                self.max_model_len = discover_max_model_len(host, self.headers, self.model)
                if self.max_model_len is None:
                    raise SetupError(f"long-context: {host} reports no max_model_len in /v1/models or /metrics; "
                                     "pass --max-model-len")
            if self.dataset is None:
                ratio = probe_tokens_per_word(host, self.config.path, self.headers, self.model,
                                              self.config.endpoint == "chat")
                if ratio is not None:
                    self.calibration.tokens_per_word = ratio
            self._resolved = True

    def prompt_settings(self) -> PromptSettings:
        cfg = self.config
        prompt_tokens = cfg.prompt_tokens
        output_tokens = cfg.output_tokens
        if cfg.profile == "long-context":
            output_tokens = output_tokens or 16
            if self.max_model_len <= output_tokens:
                raise SetupError(f"long-context: --output-tokens {output_tokens} leaves no room in "
                                 f"max_model_len {self.max_model_len}")
            prompt_tokens = max(1, int((self.max_model_len - output_tokens) * LONG_CONTEXT_FILL))
        if self.prefix_text is None:  # after the probe, so every process derives the same words
            self.prefix_text = shared_prefix_text(self.calibration.words_for(cfg.prefix_tokens))
        return PromptSettings(profile=cfg.profile, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                              prefix_tokens=cfg.prefix_tokens, num_turns=cfg.num_turns, dataset=self.dataset,
                              prefix_text=self.prefix_text)

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)
        self._dirty = True
        if isinstance(self.environment.runner, WorkerRunner):
            self.unsent.append(record)

    # --- distributed plumbing -------------------------------------------------------------
    def take_unsent(self, final: bool = False) -> dict:
        batch, self.unsent = self.unsent, []
        return {"records": [r.to_dict() for r in batch], "model": self.model, "final": final,
                "cpu_warning": self.cpu_warning, "max_cpu_percent": self.max_cpu_percent,
                "loop_lag_p99_s": self.loop_lag.p99_s(),
                "tokens_per_word": self.calibration.tokens_per_word, "prefix_text": self.prefix_text}

    def merge(self, data: dict) -> None:
        records = data.get("records") or []
        self.records.extend(RequestRecord.from_dict(r) for r in records)
        self.model = self.model or data.get("model")
        if data.get("tokens_per_word"):
            self.calibration.tokens_per_word = data["tokens_per_word"]
        self.prefix_text = self.prefix_text or data.get("prefix_text")
        if data.get("cpu_warning"):
            self.note_cpu(data.get("max_cpu_percent") or 0.0)
        if data.get("loop_lag_p99_s") is not None:
            self.worker_lag_p99_s = max(data["loop_lag_p99_s"], self.worker_lag_p99_s or 0.0)
        self._dirty = self._dirty or bool(records)

    def reset(self) -> None:
        self.records, self.unsent, self._dirty, self._written = [], [], False, False

    def write(self, host: str) -> None:
        """Master or local runner: the report over every record so far (rewritten if more arrive)."""
        if isinstance(self.environment.runner, WorkerRunner) or (self._written and not self._dirty):
            return
        self._dirty, self._written = False, True
        shared = None
        if self.config.profile == "shared-prefix":
            words = len((self.prefix_text or shared_prefix_text(self.calibration.words_for(
                self.config.prefix_tokens))).split())
            shared = words * self.calibration.tokens_per_word
        info = RunInfo(profile=self.config.profile, endpoint=self.config.endpoint, host=host, model=self.model,
                       slo=self.config.slo.as_dict(), block_size=self.config.block_size,
                       shared_prefix_tokens=shared, stream=self.config.stream,
                       client_cpu_warning=self.cpu_warning, max_client_cpu_percent=self.max_cpu_percent,
                       client_loop_lag_p99_s=self.loop_lag_p99_s())
        try:
            summary = write_report(self.records, info, self.config.report_dir)
        except ReportError as exc:
            logger.error("loadgen: %s", exc)
            return
        logger.info("loadgen: report of %d requests (%d ok, %d failed) written to %s", summary["num_requests"],
                    summary["num_succeeded"], summary["num_failed"], self.config.report_dir)


def build_state(environment) -> LoadgenState:
    """Validate the options into a state; SetupError with one line on any bad input."""
    try:
        config = config_from_options(environment.parsed_options, isinstance(environment.runner, WorkerRunner))
        return LoadgenState(config, environment)
    except (ConfigError, DatasetError, ClientLogError) as exc:
        raise SetupError(str(exc)) from exc


def exit_with(message: str) -> None:
    """Bad input at start-up: one line on stderr, exit code 2 (no traceback)."""
    sys.stderr.write(f"loadgen: error: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


def install_distributed(state_ref, environment) -> None:
    """Wire the record merge: workers send, the master listens; every process notes Locust's CPU warning."""
    runner = environment.runner

    def on_cpu_warning(environment, cpu_usage, **kwargs):
        if state_ref() is not None:
            state_ref().note_cpu(cpu_usage)

    environment.events.cpu_warning.add_listener(on_cpu_warning)
    if isinstance(runner, WorkerRunner):
        def on_report(client_id, data):
            if state_ref() is not None:
                data[RECORDS_MESSAGE] = state_ref().take_unsent()

        def on_flush(environment, msg, **kwargs):
            runner.stop()  # graceful (--stop-timeout); its test_stop sends the final records

        environment.events.report_to_master.add_listener(on_report)
        runner.register_message(FLUSH_MESSAGE, on_flush, concurrent=True)
    elif isinstance(runner, MasterRunner):
        def on_worker_report(client_id, data):
            if state_ref() is not None and RECORDS_MESSAGE in data:
                state_ref().merge(data[RECORDS_MESSAGE])

        def on_message(environment, msg, **kwargs):
            if state_ref() is not None:
                state_ref().merge(msg.data)
                if msg.data.get("final"):
                    state_ref().final_worker_ids.add(msg.node_id)

        environment.events.worker_report.add_listener(on_worker_report)
        runner.register_message(RECORDS_MESSAGE, on_message)


def collect_final_records(state: LoadgenState, runner: MasterRunner) -> None:
    """Master at test_stop: make sure every worker stopped and sent its last records.

    On a headless -t run Locust's master only sends `quit` and waits half a second, which loses
    what workers were still streaming; so the master asks each worker to stop first and waits.
    """
    pending = {c.id for c in runner.clients.all} - state.final_worker_ids
    for client_id in pending:
        runner.send_message(FLUSH_MESSAGE, None, client_id=client_id)
    deadline = time.monotonic() + (runner.environment.stop_timeout or 0) + 30
    while pending - state.final_worker_ids and time.monotonic() < deadline:
        gevent.sleep(0.05)
    if missing := pending - state.final_worker_ids:
        logger.warning("loadgen: no final records from %d worker(s); the report may miss their last requests",
                       len(missing))


def sleep_until(ts: float) -> None:
    delay = ts - time.perf_counter()
    if delay > 0:
        gevent.sleep(delay)


__all__ = ["LoadgenState", "SetupError", "ServerInfoError", "build_state", "collect_final_records", "exit_with",
           "install_distributed", "sleep_until"]
