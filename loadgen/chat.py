"""Locustfile: streaming load against an OpenAI-compatible server, measuring what users feel.

    locust -f loadgen/chat.py --headless -u 32 -r 8 -t 2m --host http://127.0.0.1:8000 \\
        --profile poisson --rate 4 --slo-ttft-ms 500 --report-dir reports

Each request streams (HttpUser, stream=True) and reports TTFT, TPOT, its longest ITL gap and E2E to
Locust as request types of their own (every gap goes to the report); failures are counted by kind. On stop the master (or the
single process) writes loadgen_summary.json/.md, loadgen_requests.csv and PNG plots into
--report-dir. See docs/loadgen.md for every option and profile.
"""

import gc
import logging
import random
import time

import gevent
import locust.stats
from gevent import GreenletExit
from locust import HttpUser, LoadTestShape, events, task
from locust.runners import MasterRunner, WorkerRunner

from loadgen import client, nonstream, profiles, resolver, runtime, webui
from loadgen.options import add_arguments
from loadgen.prompts import Prompt, PromptFactory, messages_to_prompt
from loadgen.records import FailureKind, Outcome, RequestRecord, perf_to_unix
from loadgen.server_info import prompt_tokens_from_error

logger = logging.getLogger("loadgen")
STATE: runtime.LoadgenState | None = None


def bucket_response_time(response_time: float) -> float:
    """Locust's histogram keys: 0.1 ms below 100 ms (ITL and TPOT live there), 3 digits above."""
    if response_time < 100:
        return round(response_time, 1)
    return float(f"{response_time:.3g}")


locust.stats.bucket_response_time = bucket_response_time


@events.init_command_line_parser.add_listener
def _add_arguments(parser, **kwargs):
    add_arguments(parser)


@events.init.add_listener
def _on_init(environment, **kwargs):
    global STATE
    if environment.parsed_options is None:  # locustfile imported as a library (tests)
        return
    try:
        STATE = runtime.build_state(environment)
    except runtime.SetupError as exc:
        runtime.exit_with(str(exc))
    runtime.install_distributed(lambda: STATE, environment)
    if environment.web_ui is not None:
        webui.install(environment)


@events.test_start.add_listener
def _on_test_start(environment, **kwargs):
    """Rebuild the state: the web UI (or, on a worker, the master) may have changed the options."""
    global STATE
    worker = isinstance(environment.runner, WorkerRunner)
    if STATE is not None and STATE.log is not None:
        STATE.log.close()
    try:
        STATE = runtime.build_state(environment)
    except runtime.SetupError as exc:
        logger.error("loadgen: error: %s", exc)
        environment.runner.quit()
        return
    if worker:
        STATE.worker_name = f"worker-{environment.runner.worker_index}"
    else:  # Locust does not forward its own --profile to workers; this custom option is forwarded.
        environment.parsed_options.loadgen_profile = STATE.config.profile
    if not isinstance(environment.runner, MasterRunner):
        resolver.install()  # each user's first connection to an IP address: no trip through gevent's threadpool
        _resolve_early(environment)
        STATE.loop_lag.start()
    # What start-up made (Locust, numpy, the prompts) lives to the end: out of the cyclic GC's sight,
    # a full collection walks only what the run made (else one took 200 ms at 100 users, a pause in
    # every stream in flight, against none in the reference client in the same 10 s).
    gc.freeze()


def _resolve_early(environment) -> None:
    """Ask the server (model, lengths, probe) before users spawn. Done lazily under a lock instead,
    every user would wait for the probe and then send at the same instant: users in lockstep stay in
    lockstep (identical latencies), and each round's burst would inflate the client's own TTFT."""
    try:
        STATE.resolve(environment.host or "")
    except runtime.ServerInfoError as exc:  # each request retries, and counts the failure
        logger.warning("loadgen: %s", exc)
    except runtime.SetupError as exc:
        logger.error("loadgen: error: %s", exc)
        environment.runner.quit()


@events.test_stop.add_listener
def _on_test_stop(environment, **kwargs):
    if STATE is None:
        return
    STATE.loop_lag.stop()
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.send_message(runtime.RECORDS_MESSAGE, STATE.take_unsent(final=True))
        return
    if isinstance(environment.runner, MasterRunner):
        runtime.collect_final_records(STATE, environment.runner)
    STATE.write(environment.host or "")


@events.quitting.add_listener
def _on_quitting(environment, **kwargs):
    if STATE is not None:  # the master may have merged the workers' last records after test_stop
        STATE.write(environment.host or "")
        if STATE.log is not None:
            STATE.log.close()


class ProfileShape(LoadTestShape):
    """Users over time for the selected --profile (-u is the peak, -r the spawn rate)."""

    use_common_options = True

    def tick(self):
        opts = self.runner.environment.parsed_options
        if opts.run_time and self.get_run_time() >= opts.run_time:
            return None  # with a shape, Locust leaves -t to the shape
        profile = STATE.config.profile if STATE is not None else "steady"
        num_users = STATE.config.max_concurrency if profile == "poisson" else int(opts.num_users or 1)
        shape = profiles.shape_for(profile)(num_users=num_users, spawn_rate=float(opts.spawn_rate or 1),
                                            stage_s=opts.stage_s, num_steps=opts.num_steps)
        return shape.users_at(self.get_run_time())


class ChatUser(HttpUser):
    """One simulated user: closed loop (back to back), or open loop under --profile poisson."""

    def __init__(self, environment):
        # The session's pools make QuickCheck connections: a request goes out without waiting on the loop first.
        self.pool_manager = client.quick_check_pool_manager()
        super().__init__(environment)
        # What a user needs before its first request is made here, when Locust makes the user: Locust makes
        # every user of a spawn before any of them runs, so none of it comes inside another user's first
        # request (from its start to its connect, 100 users starting at once run one after another).
        self.state = STATE
        cfg = STATE.config
        client.read_environment_once(self.client, STATE.verify)  # the same requests, without 0.12 ms of look-ups
        self.settings = client.StreamSettings(
            timeout_s=cfg.timeout_s, headers=STATE.headers,
            abort_after_tokens=cfg.abort_after_tokens if cfg.profile == "abort" else None)
        self.factory: PromptFactory | None = None
        if STATE.resolved:  # (else the first request asks the server, and counts its failure)
            try:
                self._factory()
            except (runtime.ServerInfoError, runtime.SetupError):  # the first request meets it again, as before
                self.factory = None

    def _factory(self) -> PromptFactory:
        if self.factory is None:
            self.state.resolve(self.host)
            rng = random.Random(self.state.rng.getrandbits(64))
            self.factory = PromptFactory(self.state.prompt_settings(), self.state.calibration, rng)
        return self.factory

    def _spec(self, prompt: Prompt) -> client.RequestSpec:
        cfg = self.state.config
        body = {"model": self.state.model, "max_tokens": prompt.max_tokens, "ignore_eos": True,
                "stream": cfg.stream}
        if cfg.stream:
            body["stream_options"] = {"include_usage": True}
        if cfg.endpoint == "chat":
            body["messages"] = prompt.messages
        else:
            body["prompt"] = messages_to_prompt(prompt.messages)
        return client.RequestSpec(path=cfg.path, body=body, name=cfg.endpoint, max_tokens=prompt.max_tokens)

    @task
    def stream_one(self):
        state = self.state
        cfg = state.config
        poisson = cfg.profile == "poisson"
        slot_ts = state.schedule.next_slot() if poisson else None
        record = RequestRecord(request_id=client.new_request_id(), worker=state.worker_name, profile=cfg.profile,
                               scheduled_unix=perf_to_unix(time.perf_counter()))
        try:
            factory = self._factory()
        except runtime.ServerInfoError as exc:
            self._setup_failed(record, exc, slot_ts or time.perf_counter())
            return
        except runtime.SetupError as exc:
            logger.error("loadgen: error: %s", exc)
            self.environment.runner.quit()
            return
        prompt = factory.next_prompt()
        spec = self._spec(prompt)
        if poisson:  # open loop: latency counts from the slot, so a late client shows as client queue
            runtime.sleep_until(slot_ts)
            scheduled_ts = slot_ts
        else:
            scheduled_ts = time.perf_counter()
        record.scheduled_unix = perf_to_unix(scheduled_ts)
        try:
            run = client.run_request if cfg.stream else nonstream.run_request
            text = run(self.client, spec, record, self.settings, scheduled_ts, log=state.log)
        except GreenletExit:
            state.add(record)  # counted as incomplete: the test stopped under it
            raise
        state.add(record)
        if record.outcome is Outcome.OK:
            state.calibration.observe(prompt.num_words, record.prompt_tokens)
        elif record.failure_kind is FailureKind.HTTP_STATUS:  # a too-long prompt still tells its length
            state.calibration.observe(prompt.num_words, prompt_tokens_from_error(record.error))
        factory.on_answer(text, record.outcome is Outcome.OK)
        self._fire(record, cfg.endpoint)

    def _setup_failed(self, record: RequestRecord, exc: runtime.ServerInfoError, scheduled_ts: float) -> None:
        record.outcome = Outcome.FAILED
        record.failure_kind = exc.kind
        record.error = str(exc)
        record.end_s = time.perf_counter() - scheduled_ts
        self.state.add(record)
        if self.state.log is not None:
            self.state.log.write(record)
        failure = client.FAILURE_CLASSES[exc.kind](client.short_failure(exc.kind, str(exc)))
        self._event("E2E", self.state.config.endpoint, record.end_s, failure)
        gevent.sleep(1.0)  # the server is not there: do not spin

    def _fire(self, record: RequestRecord, name: str) -> None:
        """Failures show on the POST row, by kind; a cancelled stream still has a real TTFT and ITL."""
        if record.outcome not in (Outcome.OK, Outcome.ABORTED):
            return
        length = record.output_tokens or 0
        if record.ttft_s is not None:
            self._event("TTFT", name, record.ttft_s, None, length)
        if record.itl_s:  # one event per request, its longest gap: every gap is in the report and the CSV
            self._event("ITL", name, max(record.itl_s), None, 0)
        if record.outcome is Outcome.ABORTED:
            return
        if record.tpot_s is not None:
            self._event("TPOT", name, record.tpot_s, None, length)
        if record.e2e_s is not None:
            self._event("E2E", name, record.e2e_s, None, length)

    def _event(self, kind: str, name: str, seconds: float, exc: Exception | None, length: int = 0) -> None:
        self.environment.events.request.fire(request_type=kind, name=name, response_time=seconds * 1000,
                                             response_length=length, exception=exc, context={})
