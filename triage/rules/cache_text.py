"""Cache-miss findings, one builder per cause, with their wording and next steps."""

from triage.model import Confidence, Finding

LOW_HIT_RATE = 0.3  # as triage.rules.cache

TITLE = "Prefix cache misses"
STEPS = {
    "disabled": ["start the engine with --enable-prefix-caching (vLLM V1 and llmserve default on)",
                 "TGI: PREFIX_CACHING=1 (check 'Using prefix caching'); SGLang: drop --disable-radix-cache",
                 "verify: llm_engine_info{prefix_caching=\"true\"} or vllm:cache_config_info"],
    "dynamic-prefix": ["move timestamps, request ids and user ids out of the start of the prompt (put them last)",
                       "keep the system prompt and tool list byte-identical and in a fixed order",
                       "verify: rate(llm_prefix_cache_hit_tokens_total[5m]) / rate(llm_prefix_cache_queried_tokens_total[5m])"],
    "eviction": ["raise the KV budget (--gpu-memory-utilization / --kv-cache-memory) so cached blocks survive",
                 "lower --max-num-seqs so live requests hold fewer blocks",
                 "compare hit rate with llm_kv_cache_usage_ratio over time"],
    "routing": ["route by prefix or session (consistent hashing on a session header: nginx hash $http_x_session_id consistent;)",
                "or use a prefix-aware router in front of the replicas",
                "check: awk '{print $1, $(NF-4)}' access.log | sort | uniq -c (client vs upstream)"],
    "short-prompts": ["nothing to fix in the cache: prompts shorter than one KV block cannot be cached",
                      "lower --block-size only if short shared prefixes matter"],
}


def _rate_text(rule) -> str:
    rate = rule.hit_rate()
    return f" Observed hit rate: {rate:.0%}." if rate is not None else ""


def _keys(rule):
    """(position, first block, next block), {earlier blocks: requests} and the requests of each key of the
    rule's pairs that two requests or more were seen with."""
    for block, keys in rule.pairs.items():
        if type(keys) is dict:  # (a list: one request)
            for (position, after), prefixes in keys.items():
                if (total := sum(prefixes.values())) >= 2:
                    yield (position, block, after), prefixes, total


def _reuse(rule) -> bool:
    """A real share of requests starts with the same two blocks (not one repeated probe)."""
    repeated = sum(total for key, _, total in _keys(rule) if key[0] == 0)
    return repeated >= max(5, 0.2 * rule.num_multi_block)


def finding_disabled(rule, cand) -> Finding | None:
    if rule.metric_prompt > 0 and rule.metric_queries == 0 and cand.num_decisive:
        cand.counter.append("prefix-cache query counters stayed flat while prompt tokens grew")
    if not cand.num_decisive:
        return None
    reuse = _reuse(rule)
    if rule.num_requests >= 10 and not reuse:
        return None  # caching is off, but no prompt would have hit anyway
    # Off alone is a setting, not an incident (vLLM V0's default: its config line says so in every start-up):
    # a hint until prompts that share their first blocks show what it costs.
    return cand.finding(
        TITLE + ": prefix caching is disabled",
        "Prefix caching is turned off in the engine's configuration, so every prompt is computed from "
        "scratch, however much it shares with the ones before." + _rate_text(rule), STEPS["disabled"],
        confidence=None if reuse else Confidence.LOW)


def _dynamic_count(rule) -> tuple[int, list, int]:
    """At the best block position: requests that share that block with others but not the blocks before
    it (all but the most common variant), their keys, and all requests sharing a block there."""
    by_position: dict[int, list] = {}
    for key, prefixes, total in _keys(rule):
        position = key[0]
        if position == 0:  # (the first blocks)
            continue
        entry = by_position.setdefault(position, [0, [], 0])
        entry[2] += total
        if len(prefixes) >= 2:
            entry[0] += total - max(prefixes.values())  # all but the most common variant missed
            entry[1].append(key)
    if not by_position:
        return 0, [], 0
    return tuple(max(by_position.values(), key=lambda e: e[0]))  # type: ignore[return-value]


def _first_difference(rule, keys: list) -> str:
    for key in keys:
        sample = rule.samples.get(key, [])
        if len(sample) >= 2:
            a, b = (s.fields["prefix_fingerprint"] for s in sample[:2])
            index = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            if index is not None:
                return f" (the first differing block is block {index})"
    return ""


def finding_dynamic_prefix(rule, cand) -> Finding | None:
    count, keys, shared = _dynamic_count(rule)
    detail = ""
    if count >= 4 and count >= 0.2 * shared:
        for key in keys[:3]:
            for ev in rule.samples.get(key, []):
                cand.add(ev, "fingerprint.first_block_differs", True, rule.ids(ev))
        detail = (f" {count} of the {shared} requests that share a later prompt block with others differ "
                  f"from them before it{_first_difference(rule, keys)}.")
    for variants in rule.text_prefixes.values():
        if len(variants) >= 2:
            for ev in variants.values():
                cand.add(ev, "prompt.dynamic_start", True, rule.ids(ev))
    detail += _slot_breaks(rule, cand)
    if not cand.num_decisive:
        return None
    return cand.finding(
        TITLE + ": the start of the prompt changes every request",
        "Prompts share their later blocks, but an early block differs every time (a timestamp, a request "
        "or user id near the start). Prefix caching matches from the first token, so one changed token "
        "early in the prompt makes every block after it miss." + detail + _rate_text(rule),
        STEPS["dynamic-prefix"], weight=float(count))


def _slot_breaks(rule, cand) -> str:
    """llama-server's slots: prompts nearly alike to the cached one whose common prefix stopped short, twice,
    or once where that same prefix length was kept for another prompt too (a fixed head, then a part that
    changes). One alone may be a user who edited an early message."""
    breaks = rule.slot_breaks
    if not breaks:
        return ""
    kept = breaks[0][1].fields["kept"]
    again = rule.kept_lengths.get(kept, [0, None])
    if len(breaks) < 2 and again[0] < 2:
        return ""
    for selected, kept_ev in breaks[:3]:
        cand.add(selected, "llama-server.prompt_alike_to_cached", True)
        cand.add(kept_ev, "llama-server.short_prefix_kept", True)
    if len(breaks) < 2 and again[1] is not breaks[0][1]:
        cand.add(again[1], "llama-server.same_prefix_kept", False)
    selected = breaks[0][0].fields
    return (f" llama-server found a new prompt {selected['similarity']:.0%} alike to its slot's cached one "
            f"({selected['lcs_len']} tokens in common, in order), yet kept only its first {kept} tokens as a common "
            f"prefix and computed the rest again" + (f"; {len(breaks)} prompts did so." if len(breaks) >= 2 else
                                                     f"; {again[0]} prompts kept just those {kept} tokens."))


FELL_FROM, FELL_TO = 0.3, 0.6  # a hit rate that was at least FELL_FROM fell to FELL_TO of it or less


def finding_hit_rate_fell(rule, cand) -> Finding | None:
    """Logs without prompts or prefix fingerprints (vLLM logs neither; --enable-log-requests prints the
    sampling params only): the hit rate the engine reports fell while the KV cache had room and one replica
    served, so cached prefixes were not evicted nor spread; what is left is that prompts stopped sharing
    their start. Low confidence: the changed block itself is not in the logs."""
    peak, last = rule.stats_peak, rule.stats_last
    if peak is None or last is None or rule.stats_high or rule.num_multi_block or rule.text_prefixes:
        return None
    if len(rule.upstreams) >= 2:
        return None
    high = peak.fields["prefix_hit_rate"]
    now = rule.metric_hits / rule.metric_queries if rule.metric_queries else last.fields["prefix_hit_rate"]
    if high < FELL_FROM or now >= LOW_HIT_RATE or now > FELL_TO * high or peak is last:
        return None
    cand.add(peak, "stats.hit_rate_before", False)
    cand.add(last, "stats.hit_rate_fell_kv_free", False)
    cand.counter.append("these logs hold no prompts nor prefix fingerprints: the early block that changes is "
                        "not shown (log prompts, or compare two prompts' first tokens)")
    return cand.finding(
        TITLE + ": the hit rate fell while the KV cache had room",
        f"The engine's prefix cache hit rate fell from {high:.0%} to {now:.0%} while its KV cache stayed "
        "below 90% used and one replica served: cached prefixes were neither evicted nor spread over replicas, "
        "so the prompts stopped sharing their start (a timestamp, a request or user id put near the "
        "beginning: prefix caching matches from the first token).", STEPS["dynamic-prefix"], Confidence.LOW)


def finding_eviction(rule, cand) -> Finding | None:
    high, low = rule.stats_high, rule.stats_low
    if len(high) < 2 or not low:
        return None
    mean_high, mean_low = sum(high) / len(high), sum(low) / len(low)
    if mean_low < 0.2 or mean_high >= 0.5 * mean_low:
        return None
    for ev in rule.stats_events:
        cand.add(ev, "stats.hit_rate_low_when_kv_full", False)
    return cand.finding(
        TITLE + ": cached prefixes are evicted under memory pressure",
        f"The hit rate falls to {mean_high:.0%} while the KV cache is over 90% used, against {mean_low:.0%} "
        "otherwise: live requests need the blocks, so cached prefixes are evicted before they are reused.",
        STEPS["eviction"], Confidence.MEDIUM)


def finding_routing(rule, cand) -> Finding | None:
    rate = rule.hit_rate()
    spread = [c for c, ups in rule.client_upstreams.items() if len(ups) >= 2]
    if len(rule.upstreams) < 2 or not spread or rate is None or rate >= 0.3:
        return None
    # Shared prefixes seen in the engine's fingerprints make it medium; with no fingerprints at all (engine
    # text logs) whether prompts share prefixes is unknown: low. Fingerprints without reuse: nothing to route.
    confidence = Confidence.MEDIUM if _reuse(rule) else Confidence.LOW if not rule.num_multi_block else None
    if confidence is None:
        return None
    if confidence is Confidence.LOW:
        cand.counter.append("no prefix fingerprints in these logs: whether the prompts share prefixes is unknown")
    for ev in rule.routing_sample:
        cand.add(ev, "gateway.upstream_addr_spread", False)
    return cand.finding(
        TITLE + ": one client's prompts are spread over several replicas",
        f"The gateway sends the same clients to {len(rule.upstreams)} upstreams in turn; each replica has its "
        "own prefix cache, so a shared prefix is cached once per replica and most requests land where it "
        "is not." + _rate_text(rule), STEPS["routing"], confidence)


def finding_short_prompts(rule, cand) -> Finding | None:
    rate = rule.hit_rate()
    if rule.num_requests < 10 or rule.num_short < 0.9 * rule.num_requests or rate is None or rate >= 0.1:
        return None
    for ev in rule.short_samples:
        cand.add(ev, "request.prompt_shorter_than_block", False)
    return cand.finding(
        TITLE + ": prompts shorter than one KV block",
        f"{rule.num_short} of {rule.num_requests} prompts are shorter than one block ({rule.block_size} "
        "tokens); only full blocks are cached, so these can never hit.", STEPS["short-prompts"],
        Confidence.MEDIUM)
