"""Cut streams told apart: engine crash, gateway timeout, client disconnect, proxy buffering."""

from collections import Counter
from itertools import compress

from triage.model import Confidence, Event, Finding
from triage.rules import Candidate, Facts, Need, Rule, column, needs_of, request_ids_of
from triage.rules import stream_text as T

SHUTDOWN_TAIL_S = 3.0  # disconnects this close to the end of a long log are the load stopping
MAX_SAMPLES = 100_000


class _Tenths(dict):
    """A request time -> its tenth of a second where it is 1 s or more, else None: each distinct time
    rounded once (a log repeats a few hundred)."""

    def __missing__(self, value: float) -> float | None:
        key = round(value, 1) if value >= 1.0 else None
        if len(self) < 65536:
            self[value] = key
        return key


_TENTHS = _Tenths()


def median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


class StreamRule(Rule):
    needs = needs_of(
        ("engine.error", "engine.shutdown", "engine.fatal", "metric", "gateway.connect_refused",
         "gateway.upstream_closed", "gateway.upstream_timeout", "gateway.client_closed", "http.access",
         "http.error_page", "client.connect_refused", "client.stream_cut", "client.timeout", "client.cancel",
         "request.aborted", "request.finished", "client.request", "config.proxy_buffering",
         "engine.stopping", "http.access.totals", "request.finished.totals"),
        http_access=Need("http.access", not_from=("engine-json",)))  # the engine's own: the gateway's count

    def __init__(self):
        self.crash = Candidate("engine-crash")
        self.timeout = Candidate("stream-cut-gateway-timeout")
        self.client = Candidate("stream-cut-client-disconnect")
        self.buffering = Candidate("stream-cut-proxy-buffering")
        self.aborts = Candidate("stream-cut-client-disconnect")  # engine aborts: whose they are is decided last
        self.stream_cuts: list[Event] = []
        self.num_untimed_cuts = 0
        self.first_cut_ts = None  # earliest disconnect seen anywhere (client, gateway or engine)
        self.server_ttft: list[float] = []
        self.client_ttft: list[float] = []
        self.client_ttft_ids: list[str | None] = []
        self.client_samples: list[Event] = []
        self.server_samples: list[Event] = []
        self.num_bursty = 0
        self.num_client_records = 0
        self.num_errors = 0
        self.timeout_durations: Counter = Counter()
        self.timeout_cut_durations: Counter = Counter()  # the times of requests a gateway cut by timeout
        self.client_durations: list[float] = []
        self.abort_metrics: list[Event] = []
        self.stopping_files: set[str] = set()  # files whose engine was asked to stop (a signal, a shutdown)
        self.shutdown_errors: list[Event] = []  # engine deaths logged after that: the stop itself
        # nginx configs that proxy with no proxy_buffering directive (on, nginx's default), by file, and the
        # files (or headers) that set buffering either way: a default counts only beside a broken stream
        self.default_buffering: dict[str, Event] = {}
        self.buffering_set: set[str] = set()
        # low-confidence hints of a dead engine (the openai SDK's APIConnectionError, raised for any transport
        # error): evidence beside other signs of a crash, a low finding alone, nothing beside a cut stream
        self.weak_crash: list[Event] = []

    def handlers(self):
        return {
            "engine.error": self._engine_error, "engine.shutdown": self._engine_shutdown,
            "engine.fatal": self._engine_fatal, "metric": self._metric,
            "gateway.connect_refused": self._gateway_connect_refused,
            "gateway.upstream_closed": self._gateway_upstream_closed,
            "gateway.upstream_timeout": self._gateway_upstream_timeout,
            "gateway.client_closed": self._gateway_client_closed, "http.access": self._http_access,
            "http.error_page": self._http_error_page, "client.connect_refused": self._client_connect_refused,
            "client.stream_cut": self._client_stream_cut, "client.timeout": self._client_timeout,
            "client.cancel": self._client_cancel, "request.aborted": self._request_aborted,
            "request.finished": self._request_finished, "client.request": self._client_request,
            "config.proxy_buffering": self._config_proxy_buffering, "engine.stopping": self._engine_stopping,
            "http.access.totals": self._access_totals, "request.finished.totals": self._finished_totals,
        }

    # --- engine death ---
    def _engine_stopping(self, ev: Event) -> None:
        self.stopping_files.add(ev.file)

    def _during_stop(self, ev: Event) -> bool:
        """An engine death logged after its own log said it was asked to stop: the stop, not a crash."""
        if ev.file in self.stopping_files:
            if len(self.shutdown_errors) < 10:
                self.shutdown_errors.append(ev)
            return True
        return False

    def _engine_error(self, ev: Event) -> None:
        if ev.fields.get("fatal") and self._during_stop(ev):
            return
        if ev.fields.get("fatal"):
            self.crash.add(ev, "engine.error.fatal", True, request_ids_of(ev))
        self.num_errors += 1

    def _engine_shutdown(self, ev: Event) -> None:
        if ev.fields.get("reason") == "fatal":
            self.crash.add(ev, "engine.shutdown.fatal", True)

    def _engine_fatal(self, ev: Event) -> None:
        if self._during_stop(ev):
            return
        weak = ev.fields.get("weak") or ev.fields.get("startup")
        self.crash.add(ev, "engine.fatal", not weak)

    def _metric(self, ev: Event) -> None:
        f = ev.fields
        if f["metric"] == "up" and f["num_points"] > 1 and f["max"] >= 1 and f["last"] == 0:
            self.crash.add(ev, "metric.up_dropped", False)
        elif f["metric"] == "ready" and f["num_points"] > 1 and f["max"] >= 1 and f["last"] == 0:
            self.crash.add(ev, "metric.ready_dropped", False)
        elif f["metric"] == "finished_total" and f["increase"] > 0 and f["num_points"] > 1:
            reason = f["labels"].get("finish_reason") or f["labels"].get("finished_reason")
            if reason == "abort":  # corroborates whichever cut is decided on; never decides alone
                self.abort_metrics.append(ev)

    def _gateway_connect_refused(self, ev: Event) -> None:
        self.crash.add(ev, ev.kind, False)

    def _gateway_upstream_closed(self, ev: Event) -> None:
        self.crash.add(ev, ev.kind, False)

    def _client_connect_refused(self, ev: Event) -> None:
        if ev.fields.get("confidence") == "low":
            if len(self.weak_crash) < 8:
                self.weak_crash.append(ev)
            return
        self.crash.add(ev, ev.kind, False, request_ids_of(ev))

    # --- gateway timeout ---
    def _gateway_upstream_timeout(self, ev: Event) -> None:
        if str(ev.fields.get("phase", "")).startswith("connecting"):
            self.crash.add(ev, "gateway.connect_timeout", False)  # nothing accepts connections: engine down
        else:
            self.timeout.add(ev, ev.kind, True)

    def _http_error_page(self, ev: Event) -> None:
        status = ev.fields.get("status")
        if status == "504":
            self.timeout.add(ev, "http.504_page", True)
        else:
            self.crash.add(ev, f"http.{status}_page", False)

    def _http_access(self, ev: Event) -> None:
        f = ev.fields
        if f.get("gateway") == "engine-json" or ev.source == "engine-json":
            return
        self._cut(ev)
        duration = f.get("duration_s")
        if duration and duration >= 1.0:
            self._count_time(round(duration, 1), 1)

    def _access_totals(self, ev: Event) -> None:
        """Served requests read in bulk: none was cut; their times of 1 s or more are counted."""
        if ev.source == "engine-json":
            return
        durations = ev.fields["durations"]
        keys = list(map(_TENTHS.__getitem__, durations))
        for key, num in compress(zip(keys, durations.values(), strict=True), keys):  # (those of 1 s or more)
            self._count_time(key, num)

    def _count_time(self, tenths: float, num: int) -> None:
        """Requests that took this long (1 s or more, by tenth of a second), at most 10,000 distinct times: a
        new one past that is not counted, one already there still is."""
        counts = self.timeout_durations
        if tenths in counts or len(counts) < 10_000:
            counts[tenths] = counts.get(tenths, 0) + num

    def _cut(self, ev: Event) -> None:
        f = ev.fields
        cut = f.get("cut")
        if cut == "timeout":
            self.timeout.add(ev, f"{ev.source}.timeout", True, request_ids_of(ev))
            duration = f.get("duration_s")
            if duration and len(self.timeout_cut_durations) < 1000:
                self.timeout_cut_durations[round(duration, 1)] += 1
        elif cut == "client":
            self.client.add(ev, f"{ev.source}.client_closed", True, request_ids_of(ev))
            if f.get("duration_s") is not None and len(self.client_durations) < MAX_SAMPLES:
                self.client_durations.append(f["duration_s"])
            self._cut_at(ev)
        elif cut == "upstream_failed":
            self.crash.add(ev, f"{ev.source}.upstream_failed", False, request_ids_of(ev))

    # --- client side ---
    def _gateway_client_closed(self, ev: Event) -> None:
        self.client.add(ev, ev.kind, True)
        self._cut_at(ev)

    def _client_cancel(self, ev: Event) -> None:
        self.client.add(ev, ev.kind, True, request_ids_of(ev))
        self._cut_at(ev)

    def _client_timeout(self, ev: Event) -> None:
        self.client.add(ev, ev.kind, True, request_ids_of(ev))
        self._cut_at(ev)

    def _client_stream_cut(self, ev: Event) -> None:
        if len(self.stream_cuts) < 1000:
            self.stream_cuts.append(ev)

    def _request_aborted(self, ev: Event) -> None:
        reason = ev.fields.get("reason")
        if reason in (None, "client_disconnect"):
            self.aborts.add(ev, "engine.aborted.client_disconnect", False, request_ids_of(ev))
            self._cut_at(ev)

    def _cut_at(self, ev: Event) -> None:
        if ev.ts is None:
            self.num_untimed_cuts += 1
        elif self.first_cut_ts is None or ev.ts < self.first_cut_ts:
            self.first_cut_ts = ev.ts

    # --- buffering: client vs engine time to first token ---
    def _request_finished(self, ev: Event) -> None:
        ttft = ev.fields.get("ttft_s")
        if isinstance(ttft, (int, float)) and len(self.server_ttft) < MAX_SAMPLES:  # a tuple: no Union per call
            self.server_ttft.append(float(ttft))
            if len(self.server_samples) < 2:
                self.server_samples.append(ev)
        if ev.fields.get("finish_reason") == "error":
            self.num_errors += 1

    def _finished_totals(self, ev: Event) -> None:
        """Finished requests read in bulk (none failed): their TTFTs, as _request_finished takes them."""
        rows = ev.fields["rows"]
        room = MAX_SAMPLES - len(self.server_ttft)
        if room <= 0:
            return
        ttfts = column(rows, "ttft_s", ev.fields.get("typed", False))
        timed = [i for i, ttft in enumerate(ttfts) if isinstance(ttft, (int, float))][:room]
        self.server_ttft.extend(float(ttfts[i]) for i in timed)
        for i in timed[:max(0, 2 - len(self.server_samples))]:
            self.server_samples.append(ev.fields["event"](i))

    def _client_request(self, ev: Event) -> None:
        f = ev.fields
        self.num_client_records += 1
        if f.get("ttft_s") is not None and len(self.client_ttft) < MAX_SAMPLES:
            self.client_ttft.append(f["ttft_s"])
            self.client_ttft_ids.append(f.get("request_id"))
            if len(self.client_samples) < 3:
                self.client_samples.append(ev)
        itl = f.get("itl_s") or []
        if len(itl) >= 4:
            tiny = sum(1 for g in itl if isinstance(g, int | float) and g < 0.002)
            if tiny >= 0.6 * len(itl):
                self.num_bursty += 1

    def _config_proxy_buffering(self, ev: Event) -> None:
        value = ev.fields.get("value", "").lower()
        if value == "default":  # a proxy_pass line: buffering is on unless the file says otherwise
            self.default_buffering.setdefault(ev.file, ev)
            return
        self.buffering_set.add(ev.file if ev.fields.get("signature") != "x-accel-buffering" else "*")
        if value in ("on", "yes"):
            self.buffering.add(ev, "config.proxy_buffering_on", False)
        else:
            self.buffering.counter.append(f"{ev.file}:{ev.line}: {ev.text.strip()}")

    def _default_buffering(self) -> None:
        """A config that proxies with buffering left at nginx's default (on), next to a stream a client saw
        cut mid-body (incomplete chunked encoding, curl 18) and no gateway timeout or crash to explain it."""
        if "*" in self.buffering_set or not self.stream_cuts or self.crash or self.timeout:
            return
        defaults = [ev for file, ev in self.default_buffering.items() if file not in self.buffering_set]
        for ev in defaults:
            self.buffering.add(ev, "config.proxy_buffering_default_on", False)
        for ev in self.stream_cuts[:3] if defaults else ():
            self.buffering.add(ev, "client.stream_cut_mid_body", False)

    def findings(self, facts: Facts) -> list[Finding]:
        self._default_buffering()  # before the timeout finding takes the cut streams as its own evidence
        out: list[Finding] = []
        weak_alone = not (self.crash or self.timeout or self.stream_cuts)
        if self.crash or weak_alone:
            for ev in self.weak_crash:
                self.crash.add(ev, ev.kind, False, request_ids_of(ev))
        if self.crash and weak_alone:
            out.append(T.crash_finding(self, Confidence.LOW))
        elif self.crash:
            if self.shutdown_errors:
                first = self.shutdown_errors[0]
                self.crash.counter.append(f"{first.file}:{first.line}: logged after a requested shutdown, so "
                                          "read as the shutdown, not as the crash")
            out.append(T.crash_finding(self))
        if self.timeout or (self.stream_cuts and not self.crash):
            out.append(T.timeout_finding(self))
        client = T.client_finding(self, facts)
        if client is not None:
            out.append(client)
        buffering = T.buffering_finding(self)
        if buffering is not None:
            out.append(buffering)
        return out

    def in_shutdown_tail(self, facts: Facts) -> bool:
        """Every disconnect came at once at the very end of a run that served others: the load stopping."""
        end = facts.last_request_ts
        if end is None or self.first_cut_ts is None or self.num_untimed_cuts:
            return False
        if facts.num_requests - self.aborts.num_corroborating < 5:
            return False  # an excerpt, or a run of nothing but disconnects
        return (end - self.first_cut_ts).total_seconds() <= SHUTDOWN_TAIL_S
