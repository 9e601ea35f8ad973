"""Load beyond capacity: KV preemption, a growing waiting queue, prompts beyond the context window."""

from triage.model import Confidence, Event, Finding
from triage.rules import Candidate, Facts, Need, Rule, needs_of, request_ids_of, totals_rows

SLOW_QUEUE_S = 1.0  # a request that waited this long before its first schedule was queued, not served
KV_FULL = 0.9
DEEP_QUEUE = 32
BURST_S = 60.0  # a queue seen for less than this that then drains to under 4 was a burst, not a backlog
FEW_PREEMPTIONS = 3  # a metric counter that rose by this much or less, with no preemption line: a hint
MINOR_PREEMPTION_SHARE = 0.05  # below this share of requests, preemption is a side note in a big run
# A few 429s among many served requests are a client's retry or a per-user rate limit, not a backlog.
MINOR_REFUSALS = 3
MINOR_REFUSAL_SHARE = 0.05

EXPLAIN_PREEMPT = (
    "The KV cache ran out of free blocks while requests were decoding, so the scheduler preempted running "
    "requests and recomputed them later. Throughput drops and latency rises; nothing crashes.")
STEPS_PREEMPT = [
    "llmtriage plan --model <model dir> --gpu-memory <GiB> (tokens the KV cache holds)",
    "raise the KV budget: --gpu-memory-utilization / --kv-cache-memory / --num-kv-blocks",
    "lower --max-num-seqs (fewer sequences competing for blocks) or --max-num-batched-tokens",
    "watch rate(llm_preemptions_total[5m]) and llm_kv_cache_usage_ratio",
]
EXPLAIN_QUEUE = (
    "Requests arrived faster than the engine could start them: they waited in the queue (or were refused "
    "with 429 or 503 by an admission limit), so time to first token grew with the queue.")
STEPS_QUEUE = [
    "compare arrival rate with throughput: rate(llm_requests_finished_total[1m]) vs the load",
    "add replicas, or raise --max-num-seqs if KV capacity allows (llmtriage plan)",
    "set --max-queue-len so excess load is refused fast (429 + Retry-After) instead of timing out",
    "watch llm_requests_waiting and histogram_quantile(0.99, rate(llm_request_queue_time_seconds_bucket[5m]))",
]
EXPLAIN_CONTEXT = (
    "Requests asked for more tokens (prompt + max_tokens) than the model's context window, so they were "
    "rejected (or truncated) before reaching the GPU.")
STEPS_CONTEXT = [
    "have clients cap prompt tokens + max_tokens at max_model_len (truncate history, summarise)",
    "raise --max-model-len if the model and the KV budget allow it (llmtriage plan --max-model-len N)",
]


class LoadRule(Rule):
    needs = needs_of(
        ("request.preempted", "engine.stats", "engine.preemption", "metric", "request.rejected", "queue.full",
         "request.scheduled", "http.access", "context.overflow", "http.access.totals", "engine.stats.totals"),
        request_scheduled=Need("request.scheduled", at_least=(("queue_s", SLOW_QUEUE_S),)),
        http_access=Need("http.access", not_from=("engine-json",)))  # the engine refuses with request.rejected

    def __init__(self):
        self.preempt = Candidate("kv-preemption")
        self.queue = Candidate("queue-backlog")
        self.context = Candidate("context-overflow")
        self.num_preemptions = 0
        self.num_metric_preemptions = 0  # preemption counters that rose (decisive evidence from metrics alone)
        self.num_slow_queue = 0
        self.max_waiting = 0.0
        self.num_waiting_obs = 0  # stats lines or series showing a queue of 4 or more
        self.waiting_since = self.waiting_until = None  # the first and last time a queue of 4 or more was seen
        self.last_waiting: float | None = None  # the queue of the last stats line
        self.num_access = 0  # gateway/engine access lines seen
        self.num_429 = 0

    def handlers(self):
        return {"http.access": self._access, "request.preempted": self._preempted,
                "engine.preemption": self._preemption, "engine.stats": self._stats, "metric": self._metric,
                "request.rejected": self._rejected, "queue.full": self._queue_full,
                "context.overflow": self._context_overflow, "request.scheduled": self._scheduled,
                "http.access.totals": self._access_totals, "engine.stats.totals": self._stats_totals}

    def _access_totals(self, ev: Event) -> None:
        self.num_access += ev.fields["count"]  # served requests: no 429 among them

    def _stats_totals(self, ev: Event) -> None:
        """A run of stats lines as columns: what _stats does per line, the lines it quotes made on demand."""
        cols = ev.fields["columns"]
        if any(cols.get("preemptions") or ()):  # preempting while the run went on: line by line, in order
            for row in totals_rows(ev, range(ev.fields["count"])):
                self._stats(row)
            return
        if self.preempt:
            kv = cols.get("kv_usage") or ()
            if kv and max(kv) >= KV_FULL:  # (the rows past it only where one is: most runs have none)
                for row in totals_rows(ev, [i for i, v in enumerate(kv) if v >= KV_FULL]):
                    self.preempt.add(row, "stats.kv_usage_high", False)
        waiting = cols.get("waiting") or ()
        if not waiting:
            return
        most = max(waiting)
        self.max_waiting = max(self.max_waiting, most)
        self.last_waiting = waiting[-1]
        if most >= 4:
            deep = [i for i, v in enumerate(waiting) if v >= 4]
            self.num_waiting_obs += len(deep)
            for row in totals_rows(ev, deep):
                self._queue_seen(row)

    def _access(self, ev: Event) -> None:
        self.num_access += 1
        if ev.fields.get("status") == 429:
            self.num_429 += 1
            self.queue.add(ev, "http.429", True, request_ids_of(ev))

    def _preempted(self, ev: Event) -> None:
        self.num_preemptions += 1
        self.preempt.add(ev, ev.kind, True, request_ids_of(ev))

    def _preemption(self, ev: Event) -> None:
        f = ev.fields
        self.num_preemptions += int(f.get("total", 1)) if f.get("total") else 1
        self.preempt.add(ev, ev.kind, True)

    def _rejected(self, ev: Event) -> None:
        f = ev.fields
        if f.get("reason") == "queue_full":
            self.queue.add(ev, "request.rejected.queue_full", True, request_ids_of(ev))
        elif f.get("reason") == "prompt_too_long":
            self.context.add(ev, "request.rejected.prompt_too_long", True, request_ids_of(ev))

    def _queue_full(self, ev: Event) -> None:
        self.queue.add(ev, ev.kind, True, request_ids_of(ev))

    def _context_overflow(self, ev: Event) -> None:
        if ev.source != "engine-json":
            self.context.add(ev, ev.kind, True, request_ids_of(ev))

    def _scheduled(self, ev: Event) -> None:
        queue_s = ev.fields.get("queue_s")
        if isinstance(queue_s, int | float) and queue_s >= SLOW_QUEUE_S:
            self.num_slow_queue += 1
            self.queue.add(ev, "request.scheduled.slow_queue", False, request_ids_of(ev))

    def _stats(self, ev: Event) -> None:
        f = ev.fields
        preemptions = f.get("preemptions") or 0
        if preemptions > 0:
            if ev.source != "engine-json":  # the engine's own request.preempted events are counted already
                self.num_preemptions += preemptions
            self.preempt.add(ev, "stats.preemptions", True)
        if (f.get("kv_usage") or 0) >= KV_FULL and self.preempt:
            self.preempt.add(ev, "stats.kv_usage_high", False)
        waiting = f.get("waiting") or 0
        self.max_waiting = max(self.max_waiting, waiting)
        if "waiting" in f:
            self.last_waiting = waiting
        if waiting >= 4:
            self.num_waiting_obs += 1
            self._queue_seen(ev)

    def _queue_seen(self, ev: Event) -> None:
        """A stats line with a queue of 4 or more."""
        self.queue.add(ev, "stats.waiting", False)
        if ev.ts is not None:
            self.waiting_since = ev.ts if self.waiting_since is None else min(self.waiting_since, ev.ts)
            self.waiting_until = ev.ts if self.waiting_until is None else max(self.waiting_until, ev.ts)

    def _drained_burst(self) -> bool:
        """Queues seen for less than BURST_S, none deep, and the last stats line's queue under 4: a burst the
        engine absorbed (a batch job's requests arriving at once), not arrivals beyond its capacity."""
        if self.last_waiting is None or self.last_waiting >= 4 or self.max_waiting >= DEEP_QUEUE:
            return False
        if self.waiting_since is None or self.waiting_until is None:
            return False
        return (self.waiting_until - self.waiting_since).total_seconds() < BURST_S

    def _metric(self, ev: Event) -> None:
        f = ev.fields
        name = f["metric"]
        if name == "preemptions_total" and f["increase"] > 0:
            if not self.num_preemptions:
                self.num_preemptions = int(f["increase"])
            self.preempt.add(ev, "metric.preemptions", True)
            self.num_metric_preemptions += 1
        elif name == "retracted" and f["max"] > 0:
            self.preempt.add(ev, "metric.retracted", True)
        elif name == "kv_usage" and f["max"] >= KV_FULL and self.preempt:
            self.preempt.add(ev, "metric.kv_usage_high", False)
        elif name == "waiting" and f["max"] >= 4:
            self.max_waiting = max(self.max_waiting, f["max"])
            self.num_waiting_obs += 1
            self.queue.add(ev, "metric.waiting", False)
        elif name == "rejected_total" and f["labels"].get("reason") == "queue_full" and f["increase"] > 0:
            self.queue.add(ev, "metric.rejected_queue_full", True)

    def findings(self, facts: Facts) -> list[Finding]:
        out = []
        n = facts.num_requests
        if self.preempt.num_decisive:
            minor = n >= 20 and self.num_preemptions < MINOR_PREEMPTION_SHARE * n
            few = self.preempt.num_decisive == self.num_metric_preemptions and self.num_preemptions <= FEW_PREEMPTIONS
            if minor:
                self.preempt.counter.append(
                    f"only {self.num_preemptions} preemptions for {n} requests: a side effect, not the main load")
            elif few:
                self.preempt.counter.append(
                    f"the preemption counter rose by only {self.num_preemptions} and no line reports one: "
                    "a brush with a full KV cache, not an incident of its own")
            out.append(self.preempt.finding(
                "KV cache exhausted: requests preempted and recomputed", EXPLAIN_PREEMPT, STEPS_PREEMPT,
                Confidence.MEDIUM if minor else Confidence.LOW if few else None, weight=float(self.num_preemptions)))
        if self.queue:
            out.extend(self._queue_finding(n))
        if self.context:
            out.append(self.context.finding(
                "Requests longer than the context window", EXPLAIN_CONTEXT, STEPS_CONTEXT))
        return out

    def _queue_finding(self, n: int) -> list[Finding]:
        """Slow first schedules alone can be slow steps; a backlog needs a waiting queue or refusals."""
        q = self.queue
        slow_enough = self.num_slow_queue >= max(3, 0.1 * n)
        # One snapshot of a short queue is ordinary; a queue seen twice, or a deep one, is a backlog.
        sustained = (self.num_waiting_obs >= 2 and not self._drained_burst()) or self.max_waiting >= DEEP_QUEUE
        minor_429s = (self.num_429 and self.num_429 == q.num_decisive and self.num_429 < MINOR_REFUSALS
                      and self.num_429 < MINOR_REFUSAL_SHARE * self.num_access)
        if minor_429s and not sustained and not slow_enough:
            q.counter.append(f"only {self.num_429} of {self.num_access} requests were refused with 429, "
                             "and nothing else shows a queue: a retry or a per-client limit, not a backlog")
            return [q.finding("A few requests refused with 429", EXPLAIN_QUEUE, STEPS_QUEUE, Confidence.LOW)]
        if q.num_decisive or (slow_enough and self.num_waiting_obs):
            confidence = Confidence.HIGH
        elif sustained:
            confidence = Confidence.MEDIUM
        else:
            return []
        if self.num_slow_queue or self.max_waiting >= 2 or not q.num_decisive:
            detail = (f" {self.num_slow_queue} requests waited at least {SLOW_QUEUE_S:.0f} s before their first "
                      f"schedule; the waiting queue peaked at {self.max_waiting:.0f}.")
        else:  # refused at admission (vLLM --max-num-queued-reqs, a gateway's limit): no queue to see
            detail = f" {q.requests.count} requests were refused before they were queued."
        return [q.finding("Requests queued beyond capacity", EXPLAIN_QUEUE + detail, STEPS_QUEUE, confidence)]
