"""Prefix-cache misses and their cause: dynamic prefix, disabled, eviction, routing, short prompts."""

import re
from collections import Counter, deque
from collections.abc import Callable
from functools import cache, partial
from itertools import chain, islice, repeat, starmap

from triage.model import Event, Finding
from triage.rules import Candidate, Facts, Need, Rule, column, needs_of, request_ids_of
from triage.rules import cache_text as T

MAX_KEYS = 20_000  # bounded memory: when full, keys seen only once are dropped
MAX_SAMPLE_KEYS = 200
MAX_PROMPT_KEYS = 2000
LOW_HIT_RATE = 0.3
PROMPT_KEY_CHARS = 100  # prompts whose first 100 characters agree once ids and times are masked share a prefix
_DYNAMIC = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?Z?|\d\d:\d\d:\d\d|"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9a-f]{12,}\b|\b\d{6,}\b|"
    r"(?:user|session|request|req|trace)[_ -]?id\s*[:=]\s*\S+", re.I)


def _prune(table: dict, weights: list | None = None) -> bool:
    """Keeps the most repeated half (a random prompt's blocks are seen once); amortised O(1) per insert.
    Ties keep their insertion order (a stable sort). weights: one per key, in order (the values if None)."""
    if weights is None:
        weights = list(table.values())
    if max(weights) == min(weights):  # all seen alike: the oldest half stays, in order
        _keep_oldest_half(table)
        return True
    keys, values = list(table), list(table.values())
    order = sorted(range(len(keys)), key=weights.__getitem__, reverse=True)[: MAX_KEYS // 2]
    kept = dict(zip([keys[i] for i in order], [values[i] for i in order], strict=True))
    table.clear()
    table.update(kept)
    return True


def _keep_oldest_half(table: dict) -> None:
    deque(starmap(table.popitem, repeat((), len(table) - MAX_KEYS // 2)), 0)  # popitem takes the newest




def _alike(rows: list, typed: bool) -> tuple[list, list, list[tuple]] | None:
    """(prompt tokens, cached tokens, fingerprint columns: block i of each) of request.finished rows that
    all have integer token counts and fingerprints of strings of one length (two blocks or more); None
    for any other rows. typed: the rows' token counts are integers and their fingerprints lists of strings
    or None (the parser's typed rows), so only the fingerprints' presence and lengths are looked at."""
    columns_of = []  # (each column read only while the ones before are alike)
    for name, kind in (("prompt_tokens", int), ("cached_tokens", int), ("prefix_fingerprint", list)):
        values = column(rows, name, typed)
        if typed:
            if kind is list and None in values:
                return None
        elif set(map(type, values)) != {kind}:
            return None
        columns_of.append(values)
    prompts, cached, fps = columns_of
    lengths = set(map(len, fps))
    if len(lengths) != 1 or min(lengths) < 2:
        return None
    columns = list(zip(*fps, strict=True))
    if not typed and set(map(type, chain.from_iterable(columns))) != {str}:
        return None
    return prompts, cached, columns


def later_weight(prefixes: tuple | dict) -> int:
    """Requests counted under a later_to_prefixes key: its value is the one head seen once (a tuple) or
    {head: count} once a second request came."""
    return 1 if type(prefixes) is tuple else sum(prefixes.values())


class CacheRule(Rule):
    needs = needs_of(
        ("engine.startup", "request.finished", "engine.stats", "cache.config", "metric", "request.received",
         "http.access", "http.access.totals", "engine.stats.totals", "request.received.totals",
         "request.finished.totals"),
        request_received=Need("request.received", fields=("prompt",)),  # logged prompts only
        http_access=Need("http.access", not_from=("engine-json",)))  # a gateway's: it names the upstream

    def __init__(self):
        self.cands = {cause: Candidate("cache-miss", cause) for cause in
                      ("disabled", "dynamic-prefix", "eviction", "routing", "short-prompts")}
        self.block_size = 16
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.num_requests = 0
        self.num_multi_block = 0
        self.num_short = 0
        # (position, block hash, next block hash) -> {earlier blocks: count}, or the earlier blocks alone
        # while one request has the key (most keys: a dict each would cost more than the rest together)
        self.later_to_prefixes: dict[tuple, tuple | dict] = {}
        self.num_shared_keys = 0  # later_to_prefixes values that are dicts
        self.samples: dict[tuple, list[Event]] = {}
        self.prefix_keys: Counter = Counter()  # (first block, second block) -> requests
        self.stats_high: list[float] = []
        self.stats_low: list[float] = []
        self.last_kv: float | None = None  # vLLM V0 logs its hit rate on a line of its own after the stats line
        self.stats_events: list[Event] = []
        # the highest hit rate while the KV cache had room, and the last: their events, or for rows read in
        # bulk what makes the event (findings() makes it: most are passed by)
        self.stats_peak: Event | Callable[[], Event | None] | None = None
        self.stats_peak_rate = 0.0
        self.stats_last: Event | Callable[[], Event | None] | None = None
        self.metric_queries = self.metric_hits = self.metric_prompt = 0.0
        self.text_prefixes: dict[str, dict[str, Event]] = {}
        # whether a prompt's head holds an id or a time, by head: logged prompts repeat a few system
        # prompts, and one search of the id/time patterns costs tens of microseconds
        self.dynamic_heads: dict[str, bool] = {}
        self.client_upstreams: dict[str, set] = {}
        self.upstreams: set = set()
        self.routing_sample: list[Event] = []
        self.short_samples: list[Event] = []

    def handlers(self):
        return {"request.finished": self._finished, "http.access": self._access, "engine.startup": self._startup,
                "cache.config": self._config, "engine.stats": self._stats, "metric": self._metric,
                "request.received": self._received, "http.access.totals": self._access_totals,
                "engine.stats.totals": self._stats_totals, "request.received.totals": self._received_totals,
                "request.finished.totals": self._finished_totals}

    def _access_totals(self, ev: Event) -> None:
        """Each (client, upstream) pair once, first seen first: what _routing does for every line."""
        if ev.source == "engine-json":
            return
        make = ev.fields["event"]
        for (client, upstream), row in ev.fields["routes"].items():
            self._route(client or "-", upstream, lambda row=row: make(row))

    def _stats_totals(self, ev: Event) -> None:
        """What _stats does for each row, a row's event made only where it is kept."""
        cols = ev.fields["columns"]
        rates, kvs = cols.get("prefix_hit_rate"), cols.get("kv_usage")
        if kvs is not None:
            self.last_kv = next((kv for kv in reversed(kvs) if kv is not None), self.last_kv)
        if rates is None or kvs is None:
            return  # (_stats reads nothing else of such rows)
        make = ev.fields["event"]
        for row, (rate, kv) in enumerate(zip(rates, kvs, strict=True)):
            self._stat(rate, kv, cache(partial(make, row)))

    def _received_totals(self, ev: Event) -> None:
        """Each distinct logged prompt once, first seen first (a repeat changes nothing _prompt_text keeps)."""
        make = ev.fields["event"]
        for prompt, row in ev.fields["prompts"].items():
            self._prompt_text(lambda row=row: make(row), prompt)

    def _access(self, ev: Event) -> None:
        if ev.fields.get("upstream_addr") and ev.source != "engine-json":
            self._routing(ev)

    def _startup(self, ev: Event) -> None:
        f = ev.fields
        self.block_size = int(f.get("block_size") or self.block_size)
        if f.get("prefix_caching") is False:
            self.cands["disabled"].add(ev, "engine.startup.prefix_caching_false", True)

    def _config(self, ev: Event) -> None:
        f = ev.fields
        if f.get("enabled") in ("False", "false") or f.get("disabled") == "True":
            self.cands["disabled"].add(ev, "config.prefix_caching_off", True)

    def _received(self, ev: Event) -> None:
        if isinstance(ev.fields.get("prompt"), str):
            self._prompt_text(ev, ev.fields["prompt"])

    def _finished(self, ev: Event) -> None:
        self._finished_row(ev.fields, ev)

    def _finished_totals(self, ev: Event) -> None:
        """request.finished lines read in bulk: what _finished_row does for each row, in order (a row's event
        made only when kept as a sample). Rows alike (integer token counts, fingerprints of one length) are
        read column by column, their counts summed and their keys made in C, wherever the order cannot change
        what the tables keep; other rows one by one."""
        make, rows = ev.fields["event"], ev.fields["rows"]
        alike = _alike(rows, ev.fields.get("typed", False))
        if alike is None:
            for row, f in enumerate(rows):
                self._finished_row(f, lambda row=row: make(row))
            return
        prompts, cached, columns = alike
        self.num_requests += len(rows)
        self.num_prompt_tokens += sum(prompts)
        self.num_cached_tokens += sum(cached)
        num_short = sum(map(self.block_size.__gt__, prompts))
        self.num_short += num_short
        if num_short and len(self.short_samples) < 3:
            short = (row for row, prompt in enumerate(prompts) if prompt < self.block_size)
            self.short_samples.extend(map(make, islice(short, 3 - len(self.short_samples))))
        self.num_multi_block += len(rows)
        keys = list(zip(columns[0], columns[1], strict=True))
        distinct, table = set(keys), self.prefix_keys
        if len(table) + len(distinct) - len(table.keys() & distinct) <= MAX_KEYS:
            table.update(keys)  # (no new key finds the table full: nothing is pruned)
        else:
            for key in keys:
                self._count_prefix(key)
        if len(columns) > 2 and not self._new_later_blocks(columns):
            for row, fp in enumerate(column(rows, "prefix_fingerprint")):
                self._later_blocks(fp, lambda row=row: make(row))

    def _new_later_blocks(self, columns: list[tuple]) -> bool:
        """_later_blocks of requests whose blocks by position are columns, when every key of theirs is new
        to the table and to the others (else False, nothing done): each key gets its one head, in order,
        and the table is pruned where a new key finds it full, as one by one."""
        width = len(columns) - 2
        num = len(columns[0])
        by_position = [list(zip(repeat(j, num), columns[j], columns[j + 1], strict=True)) for j in range(1, width + 1)]
        keys = by_position[0] if width == 1 else list(chain.from_iterable(zip(*by_position, strict=True)))
        table = self.later_to_prefixes
        if len(set(keys)) != len(keys) or not table.keys().isdisjoint(keys):
            return False
        heads = [list(zip(*columns[:j], strict=True)) for j in range(1, width + 1)]  # (tuple(fp[:j]) of each)
        heads = heads[0] if width == 1 else list(chain.from_iterable(zip(*heads, strict=True)))
        at = 0
        while at < len(keys):
            if len(table) >= MAX_KEYS:
                self._prune_later()
            room = MAX_KEYS - len(table)
            table.update(zip(keys[at:at + room], heads[at:at + room], strict=True))
            at += room
        return True

    def _finished_row(self, f: dict, ev) -> None:
        prompt, cached = f.get("prompt_tokens"), f.get("cached_tokens")
        if isinstance(prompt, int):
            self.num_requests += 1
            self.num_prompt_tokens += prompt
            self.num_cached_tokens += cached if isinstance(cached, int) else 0
            if prompt < self.block_size:
                self.num_short += 1
                if len(self.short_samples) < 3:
                    self.short_samples.append(ev if isinstance(ev, Event) else ev())
        fp = f.get("prefix_fingerprint")
        if not isinstance(fp, list) or len(fp) < 2:
            return
        try:
            hash(tuple(fp))
        except TypeError:
            return  # (a list or an object where a block hash stands: not read)
        self.num_multi_block += 1
        self._count_prefix((fp[0], fp[1]))
        self._later_blocks(fp, ev)

    def _count_prefix(self, key: tuple) -> None:
        """Counts a request by its first two blocks; a new key prunes the table when it is full."""
        table = self.prefix_keys
        if key not in table and len(table) >= MAX_KEYS:
            _prune(table)
        table[key] = table.get(key, 0) + 1

    def _later_blocks(self, fp: list, ev: Event) -> None:
        # Block j shared with other requests while the blocks before it differ: something early in the
        # prompt changes per request (block hashes are per block, so a shared later block survives).
        # Keys are two consecutive blocks: one shared block can be a coincidence (a template's tail).
        table = self.later_to_prefixes
        for j in range(1, len(fp) - 1):
            key = (j, fp[j], fp[j + 1])
            prefixes = table.get(key)
            head = tuple(fp[:j])
            if prefixes is None:
                if len(table) >= MAX_KEYS:
                    self._prune_later()
                table[key] = head  # a new key: one prefix, nothing to sample yet
                continue
            if type(prefixes) is tuple:
                prefixes = table[key] = {prefixes: 1}
                self.num_shared_keys += 1
            if head not in prefixes and len(prefixes) >= 64:
                continue
            prefixes[head] = prefixes.get(head, 0) + 1
            if len(prefixes) >= 2:
                self._sample(key, head, ev)

    def _prune_later(self) -> None:
        table = self.later_to_prefixes
        if not self.num_shared_keys:  # every key seen once: all alike
            _keep_oldest_half(table)
            return
        weights = list(map(later_weight, table.values()))
        _prune(table, weights)
        self.num_shared_keys = sum(type(v) is dict for v in table.values())

    def _sample(self, key: tuple, head: tuple, ev: Event) -> None:
        sample = self.samples.get(key)
        if sample is None:
            if len(self.samples) >= MAX_SAMPLE_KEYS:
                return
            sample = self.samples[key] = []
        if len(sample) < 6 and all(tuple(s.fields["prefix_fingerprint"][:len(head)]) != head for s in sample):
            sample.append(ev if isinstance(ev, Event) else ev())

    def _stats(self, ev: Event) -> None:
        f = ev.fields
        rate, kv = f.get("prefix_hit_rate"), f.get("kv_usage")
        if kv is None:
            kv = self.last_kv
        else:
            self.last_kv = kv
        if rate is not None and kv is not None:
            self._stat(rate, kv, ev)

    def _stat(self, rate: float, kv: float, ev) -> None:
        """One stats line's hit rate and KV cache usage; ev: its event, or what makes it (memoised)."""
        (self.stats_high if kv >= 0.9 else self.stats_low).append(rate)
        if kv < 0.9:
            if self.stats_peak is None or rate > self.stats_peak_rate:
                self.stats_peak, self.stats_peak_rate = ev, rate
            self.stats_last = ev
        if kv >= 0.9 and len(self.stats_events) < 50:
            made = ev if isinstance(ev, Event) else ev()
            if made is not None:
                self.stats_events.append(made)

    def _metric(self, ev: Event) -> None:
        f = ev.fields
        name = f["metric"]
        if name == "engine_info":
            value = str(f["labels"].get("prefix_caching", f["labels"].get("enable_prefix_caching", ""))).lower()
            if value == "false":
                self.cands["disabled"].add(ev, "metric.info_prefix_caching_false", True)
        elif name == "prefix_queries_total":
            self.metric_queries += f["increase"]
        elif name == "prefix_hits_total":
            self.metric_hits += f["increase"]
        elif name == "prompt_tokens_total":
            self.metric_prompt += f["increase"]

    def _prompt_text(self, ev: Event, prompt: str) -> None:
        head = prompt[:64]
        dynamic = self.dynamic_heads.get(head)
        if dynamic is None:
            dynamic = _DYNAMIC.search(head) is not None
            if len(self.dynamic_heads) < MAX_PROMPT_KEYS:
                self.dynamic_heads[head] = dynamic
        if not dynamic:
            return
        key = _DYNAMIC.sub("<dyn>", prompt[:200])[:PROMPT_KEY_CHARS]
        variants = self.text_prefixes.get(key)
        if variants is None:
            if len(self.text_prefixes) >= MAX_PROMPT_KEYS:  # each holds whole logged lines: keep few
                return
            variants = self.text_prefixes[key] = {}
        if head not in variants and len(variants) < 6:
            variants[head] = ev if isinstance(ev, Event) else ev()  # (a row read in bulk: made now)

    def _routing(self, ev: Event) -> None:
        self._route(ev.fields.get("client") or "-", ev.fields["upstream_addr"], ev)

    def _route(self, client: str, upstream: str, ev: Event) -> None:
        self.upstreams.add(upstream)
        ups = self.client_upstreams.setdefault(client, set()) if len(self.client_upstreams) < MAX_KEYS else set()
        if upstream not in ups and len(ups) < 64:
            ups.add(upstream)
            if len(self.routing_sample) < 8:
                self.routing_sample.append(ev if isinstance(ev, Event) else ev())

    def hit_rate(self) -> float | None:
        if self.num_prompt_tokens:
            return self.num_cached_tokens / self.num_prompt_tokens
        if self.metric_queries:
            return self.metric_hits / self.metric_queries
        rates = self.stats_high + self.stats_low  # vLLM's "Prefix cache hit rate" per stats interval
        return sum(rates) / len(rates) if rates else None

    def findings(self, facts: Facts) -> list[Finding]:
        if callable(self.stats_peak):
            self.stats_peak = self.stats_peak()
        if callable(self.stats_last):
            self.stats_last = self.stats_last()  # (the same row as the peak: the same event)
        out = []
        for cause in ("disabled", "dynamic-prefix", "eviction", "routing", "short-prompts"):
            finding = getattr(T, "finding_" + cause.replace("-", "_"))(self, self.cands[cause])
            if finding is not None:
                out.append(finding)
        if not out and (finding := T.finding_hit_rate_fell(self, self.cands["dynamic-prefix"])) is not None:
            out.append(finding)
        return out

    @staticmethod
    def ids(ev: Event) -> list[str]:
        return request_ids_of(ev)
