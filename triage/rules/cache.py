"""Prefix-cache misses and their cause: dynamic prefix, disabled, eviction, routing, short prompts."""

import re
from collections import deque
from collections.abc import Callable
from functools import cache, partial
from itertools import chain, compress, islice, repeat
from operator import itemgetter

from triage.model import Event, Finding
from triage.rules import Candidate, Facts, Need, Rule, column, needs_of, request_ids_of
from triage.rules import cache_text as T

MAX_KEYS = 20_000  # bounded memory: the fingerprint table keeps the keys seen lately (Recent)
MAX_SAMPLE_KEYS = 200
MAX_PROMPT_KEYS = 2000
LOW_HIT_RATE = 0.3
SLOT_ALIKE = 0.8  # llama-server: a new prompt holding this share of a slot's cached tokens, in order, ...
SLOT_SHORT = 0.25  # ... with a common prefix of at most this share of those ...
SLOT_LOST_TOKENS = 64  # ... and at least these many computed again
PROMPT_KEY_CHARS = 100  # prompts whose first 100 characters agree once ids and times are masked share a prefix
_DYNAMIC = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?Z?|\d\d:\d\d:\d\d|"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9a-f]{12,}\b|\b\d{6,}(?:\.\d+)?\b|"
    r"(?:user|session|request|req|trace|conversation|correlation|message)[_ -]?u?id\s*[:=]\s*\S+|"
    r"(?:\b|(?<=\\n))(?:session|user|request|trace|conversation)\s*[:=]\s*[\w-]*\d[\w.-]*",  # (a value with a digit:
    re.I)  # an id; "\\n" before it: a line start in a logged prompt's repr)


# A chat template's markup at a rendered prompt's start (its special tokens, role names and line ends, "\\n" in
# a logged repr): Llama 3's "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n", ChatML's
# "<|im_start|>system\n", Gemma's "<bos><start_of_turn>user\n", Mistral's "<s>[INST] ", DeepSeek's
# "<｜begin▁of▁sentence｜>". It is the same for every request: the part that may change comes after it.
_TEMPLATE_HEAD = re.compile(
    r"(?:<\|[^|>\s]{1,32}\|>|<｜[^｜\s]{1,32}｜>|</?s>|<bos>|</?start_of_turn>|<end_of_turn>|\[/?INST\]|<</?SYS>>|\\n|"
    r"\s|(?:system|user|assistant|developer|model)(?=\\n|<|\s))+")


class Recent:
    """The keys seen lately, at most `limit` of them, in two generations of at most limit // 2 each: a new
    key goes into the young one; when that is full it becomes the old one, and the old one is dropped but
    for its heaviest keys (a dict value weighed by `weight`; other values weigh nothing), at most a quarter
    of a generation, which go into the young one. A key found in the old generation moves to the young one.
    So a key seen once is gone after two generations (a random prompt's blocks are seen once), a key seen
    again stays while it is seen, and the heaviest stay after their requests stop (an incident's evidence,
    in a log that goes on after it). get() and put() are O(1) but at a turn; add_new() puts many new keys in
    one step, as put() one by one would."""

    def __init__(self, limit: int, weight: Callable[[dict], int] | None = None):
        self.half = max(1, limit // 2)
        self.weight = weight
        self.young: dict = {}
        self.old: dict = {}
        self.young_weighs = self.old_weighs = False  # whether a generation may hold a dict value

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def items(self):
        return chain(self.old.items(), self.young.items())

    def values(self):
        return chain(self.old.values(), self.young.values())

    def get(self, key):
        """The key's value (moved into the young generation if it was in the old one), or None."""
        value = self.young.get(key)
        if value is None:
            value = self.old.pop(key, None)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key, value) -> None:
        """Sets a key's value: a new key goes into the young generation, which turns old if it was full."""
        if key not in self.young and len(self.young) >= self.half:
            self._turn()
        self.young[key] = value
        if type(value) is dict:
            self.young_weighs = True

    def _turn(self) -> None:
        """The young generation turns old; the old one is dropped but for its heaviest keys, in their order."""
        dropped, self.old, self.young = self.old, self.young, {}
        weighs, self.old_weighs, self.young_weighs = self.old_weighs, self.young_weighs, False
        room = self.half // 4
        if self.weight is None or not room or not weighs:
            return
        # (only dict values weigh: found by C-level passes, a generation holds few)
        heavy = compress(dropped.items(), map(isinstance, dropped.values(), repeat(dict)))
        weighed = [(self.weight(value), -k, key, value) for k, (key, value) in enumerate(heavy)]
        kept = sorted(w for w in weighed if w[0] > 0)[-room:]  # (the heaviest; the earliest first of equals)
        self.young.update((key, value) for _, _, key, value in sorted(kept, key=itemgetter(1), reverse=True))
        self.young_weighs = bool(kept)

    def add_new(self, keys: list, values: list) -> bool:
        """put() of each key with its value (none a dict: a new key weighs nothing), in turn, where none is in
        the table and no two are alike (True); else nothing is done (False). By C-level steps over all. The
        values are objects the table does not hold yet (each request's own fingerprint)."""
        young = self.young
        if not self.old.keys().isdisjoint(keys):
            return False
        if len(keys) <= self.half - len(young):  # (the common case: no generation turns)
            # each put where absent, and the young generation's growth tells whether all were new and
            # unlike: one step a key where a check then an update took two
            size = len(young)
            deque(map(young.setdefault, keys, values), maxlen=0)
            if len(young) == size + len(keys):
                return True
            for key, value in zip(keys, values, strict=True):  # one there already, or two alike: what was
                if young.get(key) is value:  # put undone (a value is a request's own fingerprint: no
                    del young[key]  # key there before holds it)
            return False
        if not young.keys().isdisjoint(keys):
            return False
        new = dict(zip(keys, values, strict=True))
        if len(new) != len(keys):
            return False
        items = iter(new.items())
        left = len(new)
        while left:
            if len(self.young) >= self.half:
                self._turn()
            room = min(left, self.half - len(self.young))
            self.young.update(islice(items, room))
            left -= room
        return True


def _pair_weight(keys: dict) -> int:
    """The most requests any one pair of a first block's entry was seen with (0 for one each): what the
    table keeps after the requests stop."""
    most = max(map(sum, map(dict.values, keys.values())))
    return most if most >= 2 else 0


def _pair_keys(fps: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The keys of these fingerprints (two blocks or more each) in the order _pairs takes them (row by row,
    block by block: each block but the last), each with its value for one request: its fingerprint."""
    widths = set(map(len, fps))
    if len(widths) != 1:
        return [block for fp in fps for block in fp[:-1]], [fp for fp in fps for _ in range(len(fp) - 1)]
    width = widths.pop()
    keys = list(chain.from_iterable(fps))
    del keys[width - 1::width]  # (each fingerprint's last block)
    if width == 2:
        return keys, fps
    values = [None] * len(keys)  # each fingerprint width - 1 times in a row, by C-level slice assignments
    for j in range(width - 1):
        values[j::width - 1] = fps
    return keys, values


def _rows_alike(rows: list, typed: bool) -> tuple[list, list, list] | None:
    """(prompt tokens, cached tokens, fingerprints) of request.finished rows whose token counts are all
    integers and whose fingerprints are all lists of strings or absent; None for any other rows. typed:
    the parser's typed rows, which are so (triage.parsers.finished.FinishedRow)."""
    prompts = column(rows, "prompt_tokens", typed)
    cached = column(rows, "cached_tokens", typed)
    fps = column(rows, "prefix_fingerprint", typed)
    if not typed:
        if set(map(type, prompts)) != {int} or set(map(type, cached)) != {int}:
            return None
        if not set(map(type, fps)) <= {list, type(None)}:
            return None
        if not set(map(type, chain.from_iterable(fp for fp in fps if fp is not None))) <= {str}:
            return None
    return prompts, cached, fps


class CacheRule(Rule):
    needs = needs_of(
        ("engine.startup", "request.finished", "engine.stats", "cache.config", "metric", "request.received",
         "http.access", "http.access.totals", "engine.stats.totals", "request.received.totals",
         "request.finished.totals", "cache.slot_selected", "cache.slot_kept", "request.routed"),
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
        # the first of two consecutive blocks -> the fingerprint of the one request seen with it (where the
        # block is first), or {(position, next block): {earlier blocks: requests}} once a second came (_pairs)
        self.pairs = Recent(MAX_KEYS, _pair_weight)
        self.samples: dict[tuple, list[Event]] = {}
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
        # llama-server: each slot's last selection by similarity, until the prefix it kept is logged; the
        # selections of a prompt nearly alike to the cached one whose common prefix was short (with what was
        # kept); how often each prefix length was kept, and the first line that kept it
        self.slot_selected: dict[int, Event] = {}
        self.slot_breaks: list[tuple[Event, Event]] = []
        self.kept_lengths: dict[int, list] = {}
        self.client_upstreams: dict[str, set] = {}
        self.upstreams: set = set()
        self.routing_sample: list[Event] = []
        self.short_samples: list[Event] = []

    def handlers(self):
        return {"request.finished": self._finished, "http.access": self._access, "engine.startup": self._startup,
                "cache.config": self._config, "engine.stats": self._stats, "metric": self._metric,
                "request.received": self._received, "http.access.totals": self._access_totals,
                "engine.stats.totals": self._stats_totals, "request.received.totals": self._received_totals,
                "request.finished.totals": self._finished_totals, "cache.slot_selected": self._slot_selected,
                "cache.slot_kept": self._slot_kept, "request.routed": self._routing}

    def _slot_selected(self, ev: Event) -> None:
        if len(self.slot_selected) < MAX_SAMPLE_KEYS or ev.fields["slot"] in self.slot_selected:
            self.slot_selected[ev.fields["slot"]] = ev

    def _slot_kept(self, ev: Event) -> None:
        """The prefix a slot kept of its cache for a new prompt: short beside a prompt nearly alike to the
        cached one (most of its tokens in order), something early in the prompt changed."""
        kept = ev.fields["kept"]
        seen = self.kept_lengths.get(kept)
        if seen is not None:
            seen[0] += 1
        elif len(self.kept_lengths) < MAX_PROMPT_KEYS:
            self.kept_lengths[kept] = [1, ev]
        selected = self.slot_selected.pop(ev.fields["slot"], None)
        if selected is None or kept < 1 or len(self.slot_breaks) >= 50:  # (0 kept: cache_prompt off, or another start)
            return
        lcs = selected.fields["lcs_len"]
        if selected.fields["similarity"] >= SLOT_ALIKE and kept <= SLOT_SHORT * lcs and lcs - kept >= SLOT_LOST_TOKENS:
            self.slot_breaks.append((selected, ev))

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
        made only when kept as a sample). Rows alike (integer token counts, fingerprints of strings) are read
        column by column: their counts summed, and their keys put in the table in one step where all are new
        (most are: a key is shared by requests with a common prompt); other rows one by one."""
        make, rows = ev.fields["event"], ev.fields["rows"]
        alike = _rows_alike(rows, ev.fields.get("typed", False))
        if alike is None:
            for row, f in enumerate(rows):
                self._finished_row(f, lambda row=row: make(row))
            return
        prompts, cached, fps = alike
        self.num_requests += len(rows)
        self.num_prompt_tokens += sum(prompts)
        self.num_cached_tokens += sum(cached)
        num_short = sum(map(self.block_size.__gt__, prompts))
        self.num_short += num_short
        if num_short and len(self.short_samples) < 3:
            short = (row for row, prompt in enumerate(prompts) if prompt < self.block_size)
            self.short_samples.extend(map(make, islice(short, 3 - len(self.short_samples))))
        if None in fps or min(map(len, fps)) < 2:  # (rows without two blocks are in no table)
            multi = [row for row, fp in enumerate(fps) if fp is not None and len(fp) >= 2]
            fps = [fps[row] for row in multi]
        else:
            multi = range(len(fps))
        self.num_multi_block += len(fps)
        if not self.pairs.add_new(*_pair_keys(fps)):
            for row, fp in zip(multi, fps, strict=True):
                self._pairs(fp, lambda row=row: make(row))

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
        self._pairs(fp, ev)

    def _pairs(self, fp: list, ev: Event) -> None:
        # Requests that share their first two blocks could share cached ones (position 0). Block j shared with
        # other requests while the blocks before it differ: something early in the prompt changes per request
        # (block hashes are per block, so a shared later block survives). A key is two consecutive blocks at
        # a position (one shared block can be a coincidence: a template's tail, or two 32-bit hashes alike),
        # kept by its first block (table: pairs).
        table = self.pairs
        for j in range(len(fp) - 1):
            block = fp[j]
            keys = table.get(block)
            if keys is None:
                table.put(block, fp)  # a new key: one request (the block's first place in it), nothing to sample
                continue
            if type(keys) is list:  # a second request or key: the keys by (position, next block)
                k = keys.index(block)
                keys = {(k, keys[k + 1]): {tuple(keys[:k]): 1}}
                table.put(block, keys)
            key, head = (j, fp[j + 1]), tuple(fp[:j])
            prefixes = keys.get(key)
            if prefixes is None:
                if len(keys) < 64:
                    keys[key] = {head: 1}
                continue
            if head not in prefixes and len(prefixes) >= 64:
                continue
            prefixes[head] = prefixes.get(head, 0) + 1
            if len(prefixes) >= 2:
                self._sample((j, block, fp[j + 1]), head, ev)

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
        if (markup := _TEMPLATE_HEAD.match(prompt)) is not None:
            prompt = prompt[markup.end():]
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
