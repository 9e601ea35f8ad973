"""Prefix-cache misses and their cause: dynamic prefix, disabled, eviction, routing, short prompts."""

import re
from collections import Counter, deque
from itertools import chain, repeat, starmap
from operator import itemgetter

from triage.model import Event, Finding
from triage.parsers.batch import has_upstream
from triage.rules import Candidate, Facts, Rule, request_ids_of
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


def _later_keys(columns: list[list[str]], lo: int, hi: int) -> tuple[list, list]:
    """The later_to_prefixes keys of requests lo..hi-1 (their blocks by position: columns), in order
    (each request's, by position), and their values: tuple(fp[:j]) for the key at position j."""
    width = len(columns) - 2
    cols = [col[lo:hi] for col in columns]
    by_j = [list(zip(repeat(j), cols[j], cols[j + 1])) for j in range(1, width + 1)]
    by_head = [list(zip(*cols[:j], strict=True)) for j in range(1, width + 1)]
    if width == 1:
        return by_j[0], by_head[0]
    return (list(chain.from_iterable(zip(*by_j, strict=True))),
            list(chain.from_iterable(zip(*by_head, strict=True))))


def later_weight(prefixes: tuple | dict) -> int:
    """Requests counted under a later_to_prefixes key: its value is the one head seen once (a tuple) or
    {head: count} once a second request came."""
    return 1 if type(prefixes) is tuple else sum(prefixes.values())


class CacheRule(Rule):
    kinds = ("engine.startup", "request.finished", "engine.stats", "cache.config", "metric", "request.received",
             "http.access")

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
        # Keys of requests read in bulk, new to the table and to each other, that come after the table's own
        # (in order) but are not made yet: (fingerprint columns, first request, end). While every key is
        # seen once, most are dropped by a prune before anything looks them up; they are made only if
        # needed (a lookup that may hit, a prune that keeps some, the findings).
        self.pending: list[tuple] = []
        self.num_pending = 0
        # position -> the blocks at that position of the table's keys (None: not built) and of pending keys:
        # a key whose block is in neither is new (key (j, a, b): a in seen_table[j] or seen_pending[j])
        self.seen_table: dict[int, set] | None = None
        self.seen_pending: dict[int, set] = {}
        self.samples: dict[tuple, list[Event]] = {}
        self.prefix_keys: Counter = Counter()  # (first block, second block) -> requests
        # The same for prefix_keys: (first blocks, second blocks, first request, end) pending, new keys
        # counted once each; the first blocks of the table's keys (None: not built) and of pending keys.
        self.pending_prefixes: list[tuple] = []
        self.num_pending_prefixes = 0
        self.seen_prefix_table: set | None = None
        self.seen_prefix_pending: set = set()
        self.stats_high: list[float] = []
        self.stats_low: list[float] = []
        self.stats_events: list[Event] = []
        self.metric_queries = self.metric_hits = self.metric_prompt = 0.0
        self.text_prefixes: dict[str, dict[str, Event]] = {}
        self.client_upstreams: dict[str, set] = {}
        self.upstreams: set = set()
        self.routing_sample: list[Event] = []
        self.short_samples: list[Event] = []

    def observe(self, ev: Event) -> None:
        kind, f = ev.kind, ev.fields
        if kind == "request.finished":  # the two common kinds first
            self._finished(ev)
        elif kind == "http.access":
            if f.get("upstream_addr") and ev.source != "engine-json":
                self._routing(ev)
        elif kind == "engine.startup":
            self.block_size = int(f.get("block_size") or self.block_size)
            if f.get("prefix_caching") is False:
                self.cands["disabled"].add(ev, "engine.startup.prefix_caching_false", True)
        elif kind == "cache.config":
            off = f.get("enabled") in ("False", "false") or f.get("disabled") == "True"
            if off:
                self.cands["disabled"].add(ev, "config.prefix_caching_off", True)
        elif kind == "engine.stats":
            self._stats(ev)
        elif kind == "metric":
            self._metric(ev)
        elif kind == "request.received" and isinstance(f.get("prompt"), str):
            self._prompt_text(ev, f["prompt"])

    def observe_batch(self, batch) -> None:
        if batch.kind == "request.finished":
            self._finished_batch(batch)
        elif batch.kind == "http.access":
            self._routing_batch(batch)
        else:
            super().observe_batch(batch)

    def _finished(self, ev: Event) -> None:
        f = ev.fields
        prompt, cached = f.get("prompt_tokens"), f.get("cached_tokens")
        if isinstance(prompt, int):
            self.num_requests += 1
            self.num_prompt_tokens += prompt
            self.num_cached_tokens += cached if isinstance(cached, int) else 0
            if prompt < self.block_size:
                self.num_short += 1
                if len(self.short_samples) < 3:
                    self.short_samples.append(ev)
        fp = f.get("prefix_fingerprint")
        if not isinstance(fp, list) or len(fp) < 2:
            return
        self.num_multi_block += 1
        self._count_prefixes([(fp[0], fp[1])])
        self._later_blocks(fp, ev)

    def _finished_batch(self, batch) -> None:
        """_finished for each line of a FinishedBatch (int token counts, fingerprints lists of strings)."""
        prompts = batch.prompt
        self.num_requests += len(prompts)
        self.num_prompt_tokens += sum(prompts)
        self.num_cached_tokens += sum(batch.cached)
        if min(prompts) < self.block_size:
            short = [k for k, prompt in enumerate(prompts) if prompt < self.block_size]
            self.num_short += len(short)
            for k in short[:3 - len(self.short_samples)]:
                self.short_samples.append(batch.event(k))
        columns = batch.fp_columns()
        if columns is not None:  # every request with the same number of blocks
            if len(columns) < 2:
                return
            self.num_multi_block += len(prompts)
            self._count_prefixes_alike(columns[0], columns[1])
            if len(columns) > 2:
                self._later_blocks_alike(columns, batch)
            return
        fps = batch.fps
        multi = [k for k, fp in enumerate(fps) if len(fp) >= 2]
        if not multi:
            return
        self.num_multi_block += len(multi)
        self._count_prefixes([(fps[k][0], fps[k][1]) for k in multi])
        for k in multi:
            self._later_blocks(fps[k], None, batch, k)

    def _count_prefixes(self, keys: list[tuple]) -> None:
        """Counts requests by their first two blocks, in order; runs that cannot fill the table are
        counted in C (a prune happens only when a new key finds the table full)."""
        if self.num_pending_prefixes:
            self._settle_prefixes()
        table = self.prefix_keys
        seen = self.seen_prefix_table
        pos = 0
        while pos < len(keys):
            room = MAX_KEYS - len(table)
            if room > 0:
                run = keys[pos:pos + room]
                table.update(run)
                if seen is not None:
                    seen.update(map(itemgetter(0), run))
                pos += room
                continue
            key = keys[pos]
            if key not in table:
                _prune(table)
                seen = self.seen_prefix_table = None
            table[key] = table.get(key, 0) + 1
            if seen is not None:
                seen.add(key[0])
            pos += 1

    def _count_prefixes_alike(self, first: list[str], second: list[str]) -> None:
        """_count_prefixes for the keys zip(first, second): runs of keys new to the table and to each
        other (their first blocks are) that fit are added as pending; while every key was counted once, a
        prune drops the newest half in one step."""
        table = self.prefix_keys
        num = len(first)
        r = 0
        while r < num:
            room = MAX_KEYS - len(table) - self.num_pending_prefixes
            if room <= 0:  # the next key prunes the table if it is new
                if self._new_prefixes(first, r, r + 1) and (not table or max(table.values()) == 1):
                    self._drop_newest_prefixes()
                    continue
                self._count_prefixes(list(zip(first[r:], second[r:], strict=True)))
                return
            end = min(num, r + room)
            if self._new_prefixes(first, r, end):
                self.pending_prefixes.append((first, second, r, end))
                self.num_pending_prefixes += end - r
            else:
                self._count_prefixes(list(zip(first[r:end], second[r:end], strict=True)))
            r = end

    def _new_prefixes(self, first: list[str], lo: int, hi: int) -> bool:
        """Whether first[lo:hi] are first blocks of no key (pending ones too) and of no two of them: then
        their keys are new. If so, they are noted as pending."""
        seen = self.seen_prefix_table
        if seen is None:
            seen = self.seen_prefix_table = set(map(itemgetter(0), self.prefix_keys))
        blocks = set(first[lo:hi])
        if len(blocks) < hi - lo or not blocks.isdisjoint(seen) or not blocks.isdisjoint(self.seen_prefix_pending):
            return False
        self.seen_prefix_pending |= blocks
        return True

    def _settle_prefixes(self, limit: int | None = None) -> None:
        """Counts the pending keys, in order (the first limit only: the rest dropped)."""
        table = self.prefix_keys
        for first, second, lo, hi in self.pending_prefixes:
            if limit is not None:
                if limit <= 0:
                    break
                hi = min(hi, lo + limit)
                limit -= hi - lo
            table.update(zip(first[lo:hi], second[lo:hi], strict=True))
        if self.seen_prefix_table is not None:
            if limit is None:
                self.seen_prefix_table |= self.seen_prefix_pending
            else:
                self.seen_prefix_table = None
        self.pending_prefixes, self.num_pending_prefixes, self.seen_prefix_pending = [], 0, set()

    def _drop_newest_prefixes(self) -> None:
        """_prune of prefix_keys when every key (pending ones too) was counted once: the oldest half stays."""
        table = self.prefix_keys
        if len(table) >= MAX_KEYS // 2:
            self.pending_prefixes, self.num_pending_prefixes, self.seen_prefix_pending = [], 0, set()
            if len(table) > MAX_KEYS // 2:
                _keep_oldest_half(table)
                self.seen_prefix_table = None
        else:
            self._settle_prefixes(MAX_KEYS // 2 - len(table))

    def _later_blocks(self, fp: list, ev: Event | None, batch=None, k: int = 0) -> None:
        # Block j shared with other requests while the blocks before it differ: something early in the
        # prompt changes per request (block hashes are per block, so a shared later block survives).
        # Keys are two consecutive blocks: one shared block can be a coincidence (a template's tail).
        if self.num_pending:
            self._settle_later()
        table = self.later_to_prefixes
        for j in range(1, len(fp) - 1):
            key = (j, fp[j], fp[j + 1])
            prefixes = table.get(key)
            head = tuple(fp[:j])
            if prefixes is None:
                if len(table) >= MAX_KEYS:
                    self._prune_later()
                table[key] = head  # a new key: one prefix, nothing to sample yet
                if self.seen_table is not None:
                    self.seen_table.setdefault(j, set()).add(fp[j])
                continue
            if type(prefixes) is tuple:
                prefixes = table[key] = {prefixes: 1}
                self.num_shared_keys += 1
            if head not in prefixes and len(prefixes) >= 64:
                continue
            prefixes[head] = prefixes.get(head, 0) + 1
            if len(prefixes) >= 2:
                self._sample(key, head, ev, batch, k)

    def _prune_later(self) -> None:
        table = self.later_to_prefixes
        self.seen_table = None
        if not self.num_shared_keys:  # every key seen once: all alike
            _keep_oldest_half(table)
            return
        weights = list(map(later_weight, table.values()))
        _prune(table, weights)
        self.num_shared_keys = sum(type(v) is dict for v in table.values())

    def _later_blocks_alike(self, columns: list[list[str]], batch) -> None:
        """_later_blocks for requests with the same number of blocks (columns: block i of each): runs of
        them whose keys are all new (to the table and to each other) and fit without a prune are added
        as pending; while every key was seen once, a prune drops the newest half in one step."""
        width = len(columns) - 2  # keys a request has
        num = len(columns[0])
        r = 0
        while r < num:
            room = MAX_KEYS - len(self.later_to_prefixes) - self.num_pending
            if room < width:  # the next request's keys prune the table
                if room <= 0 and not self.num_shared_keys and self._new_blocks(columns, r, r + 1):
                    self._drop_newest_half()  # what its first key's prune does; then it fits
                    continue
                self._later_blocks(batch.fps[r], None, batch, r)
                r += 1
                continue
            end = min(num, r + room // width)
            if self._new_blocks(columns, r, end):
                self.pending.append((columns, r, end))
                self.num_pending += (end - r) * width
                r = end
                continue
            fps = batch.fps
            for q in range(r, end):
                self._later_blocks(fps[q], None, batch, q)
            r = end

    def _new_blocks(self, columns: list[list[str]], lo: int, hi: int) -> bool:
        """Whether requests lo..hi-1 have blocks at each key position that no key of the table (pending
        ones too) has there and no two of them share: then each key of theirs is new. If so, their
        blocks are noted as pending."""
        seen = self.seen_table
        if seen is None:
            seen = self.seen_table = {}
            for key in self.later_to_prefixes:
                seen.setdefault(key[0], set()).add(key[1])
        found = []
        for j in range(1, len(columns) - 1):
            blocks = set(columns[j][lo:hi])
            if len(blocks) < hi - lo or not blocks.isdisjoint(seen.get(j, ())) or not blocks.isdisjoint(
                    self.seen_pending.get(j, ())):
                return False
            found.append(blocks)
        for j, blocks in enumerate(found, 1):
            if j in self.seen_pending:
                self.seen_pending[j] |= blocks
            else:
                self.seen_pending[j] = blocks
        return True

    def _settle_later(self, limit: int | None = None) -> None:
        """Makes the pending keys, in order, with their values (the first limit only: the rest dropped)."""
        table = self.later_to_prefixes
        for columns, lo, hi in self.pending:
            keys, heads = _later_keys(columns, lo, hi)
            if limit is not None:
                if limit <= 0:
                    break
                keys, heads = keys[:limit], heads[:limit]
                limit -= len(keys)
            table.update(zip(keys, heads, strict=True))
        if self.seen_table is not None:
            if limit is None:
                for j, blocks in self.seen_pending.items():
                    self.seen_table.setdefault(j, set()).update(blocks)
            else:
                self.seen_table = None
        self.pending, self.num_pending, self.seen_pending = [], 0, {}

    def _drop_newest_half(self) -> None:
        """_prune_later when every key (pending ones too) was seen once: the oldest half stays."""
        table = self.later_to_prefixes
        if len(table) >= MAX_KEYS // 2:
            self.pending, self.num_pending, self.seen_pending = [], 0, {}
            if len(table) > MAX_KEYS // 2:
                _keep_oldest_half(table)
                self.seen_table = None
        else:
            self._settle_later(MAX_KEYS // 2 - len(table))

    def _sample(self, key: tuple, head: tuple, ev: Event | None, batch=None, k: int = 0) -> None:
        sample = self.samples.get(key)
        if sample is None:
            if len(self.samples) >= MAX_SAMPLE_KEYS:
                return
            sample = self.samples[key] = []
        if len(sample) < 6 and all(tuple(s.fields["prefix_fingerprint"][:len(head)]) != head for s in sample):
            sample.append(ev if ev is not None else batch.event(k))

    def _stats(self, ev: Event) -> None:
        f = ev.fields
        rate, kv = f.get("prefix_hit_rate"), f.get("kv_usage")
        if rate is None or kv is None:
            return
        (self.stats_high if kv >= 0.9 else self.stats_low).append(rate)
        if kv >= 0.9 and len(self.stats_events) < 50:
            self.stats_events.append(ev)

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
        if not _DYNAMIC.search(head):
            return
        key = _DYNAMIC.sub("<dyn>", prompt[:200])[:PROMPT_KEY_CHARS]
        variants = self.text_prefixes.get(key)
        if variants is None:
            if len(self.text_prefixes) >= MAX_PROMPT_KEYS:  # each holds whole logged lines: keep few
                return
            variants = self.text_prefixes[key] = {}
        if head not in variants and len(variants) < 6:
            variants[head] = ev

    def _routing(self, ev: Event) -> None:
        self._route(ev.fields.get("client") or "-", ev.fields["upstream_addr"], ev)

    def _route(self, client: str, upstream: str, ev: Event | None, batch=None, k: int = 0) -> None:
        self.upstreams.add(upstream)
        ups = self.client_upstreams.setdefault(client, set()) if len(self.client_upstreams) < MAX_KEYS else set()
        if upstream not in ups and len(ups) < 64:
            ups.add(upstream)
            if len(self.routing_sample) < 8:
                self.routing_sample.append(ev if ev is not None else batch.event(k))

    def _routing_batch(self, batch) -> None:
        """_routing for each line of an AccessBatch with an upstream address. A (client, upstream) pair
        seen before changes nothing while the client table has room (or the sample is full): then each
        distinct pair is routed once, at its first line."""
        with_upstream = has_upstream(batch.addr)
        if not with_upstream:
            return
        if len(with_upstream) == len(batch):
            clients, upstreams, at = batch.client, batch.addr, range(len(batch))
        else:
            clients = [batch.client[k] for k in with_upstream]
            upstreams = [batch.addr[k] for k in with_upstream]
            at = with_upstream
        pairs = list(zip(clients, upstreams, strict=True))
        distinct = dict.fromkeys(pairs)
        if len(self.client_upstreams) + len(distinct) <= MAX_KEYS or len(self.routing_sample) >= 8:
            for client, upstream in distinct:
                if len(self.routing_sample) < 8:
                    self._route(client, upstream, None, batch, at[pairs.index((client, upstream))])
                else:
                    self._route(client, upstream, None)
        else:
            for q, (client, upstream) in enumerate(pairs):
                self._route(client, upstream, None, batch, at[q])

    def hit_rate(self) -> float | None:
        if self.num_prompt_tokens:
            return self.num_cached_tokens / self.num_prompt_tokens
        if self.metric_queries:
            return self.metric_hits / self.metric_queries
        rates = self.stats_high + self.stats_low  # vLLM's "Prefix cache hit rate" per stats interval
        return sum(rates) / len(rates) if rates else None

    def findings(self, facts: Facts) -> list[Finding]:
        self._settle_later()
        self._settle_prefixes()
        self.seen_table = self.seen_prefix_table = None
        out = []
        for cause in ("disabled", "dynamic-prefix", "eviction", "routing", "short-prompts"):
            finding = getattr(T, "finding_" + cause.replace("-", "_"))(self, self.cands[cause])
            if finding is not None:
                out.append(finding)
        return out

    @staticmethod
    def ids(ev: Event) -> list[str]:
        return request_ids_of(ev)
