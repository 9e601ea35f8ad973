"""Which lines are routine: the forms of lines read in bulk (each a whole line, in RE2's syntax), and the
one RE2 pass over a block that finds the runs of them (triage.parsers.bulk sums each run up)."""

from functools import cache

import re2

# Bytes whose presence anywhere in a run sends it back to the line-by-line reading: what makes the
# per-line path read a routine-looking line otherwise (ANSI codes, the HAProxy and nvidia-smi tests,
# a CUDA build tag).
_TRICKY = (b"\x1b", b"haproxy[", b"NVIDIA-SMI", b"+cu", b"CUDA runtime version")  # (the first three: any line)
_NUM = r"(?:\d+(?:\.\d+)?|-)"
# nginx's combined format as triage.parsers.gateways reads it, served (1xx-3xx); the client starts with a
# digit or "[" (what FileParser.parse takes as an access line)
_COMBINED = (r'[\d\[]\S* \S+ \S+ \[[^\]\n]+\] "[^"\n]*" [1-3]\d\d (?:\d+|-)(?: "[^"\n]*" "[^"\n]*")?')


def _envoy_json() -> str:
    field = r'"[\w.-]+":(?:"[^"\\\n]*"|-?(?:0|[1-9]\d*)(?:\.\d+)?|null|true|false)'
    code, flags = r'"response_code":[1-3]\d\d', r'"response_flags":"-"'
    fields = f"(?:{field},)*"
    return (rf"\{{{fields}(?:{code},{fields}{flags}|{flags},{fields}{code})(?:,{field})*\}}")


_FORMS: dict[str, tuple[str, str, str]] = {  # name -> (kind, source, one whole line, RE2 syntax)
    # ingress-nginx upstreaminfo (gateways.NGINX_UPSTREAMINFO)
    "upstreaminfo": ("http.access", "nginx-access",
                     _COMBINED + r" \d+ (?:\d+\.?\d*|\.\d+) \[[^\]\n]*\] \[[^\]\n]*\] \S+ \S+ "
                     r"(?:\d+\.?\d*|\.\d+|-) \S+(?: \S+)?"),
    # a log_format with timings as key=value: request time first, then upstream times only
    "nginx-kv": ("http.access", "nginx-access",
                 _COMBINED + rf" (?:rt|request_time)={_NUM}(?: (?:uct|uht|urt|upstream_connect_time|"
                 rf"upstream_header_time|upstream_response_time)={_NUM})*"),
    # SGLang prints uvicorn's access line after its own "[<time>] " (a line the per-line reading makes
    # nothing of): counted as read, nothing else
    "sglang-uvicorn": ("", "sglang",
                       r'\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]\n]*\] INFO: +[\d.:\[\]a-f]+ - "[A-Z]+ [^\s"\[#]+ '
                       r"HTTP/[\d.]+\" \d{3}(?: [A-Za-z '-]*)?"),
    # Envoy's (Istio's) JSON access log, served with no response flag: flat objects (no escapes, no
    # nesting: a key is never inside a value), response_code and response_flags once each (counted)
    "envoy-json": ("http.access", "envoy", _envoy_json()),
    # vLLM's request logging: "Received request <id>: prompt: '...', params: ..."
    "received": ("request.received", "vllm",
                 r"\([\w.-]+ pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\]? ?"
                 r"Received request [^\s:]+:? prompt: ['\"][^\n]*"),
    # vLLM V1's periodic stats line: "Engine 000: Avg prompt throughput: ... Running: 8 reqs, Waiting: 0 reqs, ..."
    # (V0's "Running: N reqs, Swapped: N reqs, ..." holds a catalog keyword: read line by line)
    "vllm-stats": ("engine.stats", "vllm",
                   r"\([\w.-]+ pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\]? ?"
                   r"(?:Engine \d+: |\d+ Engines Aggregated: )?Avg prompt throughput: [\d.]+ tokens/s, Avg generation "
                   r"throughput: [\d.]+ tokens/s, Running: \d+ reqs, Waiting: \d+ reqs[^\n]*"),
    # SGLang's scheduler: "[<time>] Prefill batch, ... #running-req: ..." / "Decode batch, ..." (the per-line
    # reading takes a batch line for stats where it has "#running-req")
    "sglang-batch": ("engine.stats", "sglang",
                     r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]\n]*\] (?:Prefill|Decode) batch, [^\n]*#running-req[^\n]*"),
    # uvicorn's access line (vLLM and SGLang API servers), "INFO:" within its first 32 characters
    "uvicorn": ("http.access", "uvicorn",
                r'(?:\(\w{1,12} pid=\d{1,7}\) )?INFO: +[\d.:\[\]a-f]+ - "[A-Z]+ [^\s"\[]+ HTTP/[\d.]+" '
                r"[1-3]\d\d(?: [A-Za-z '-]*)?"),
}
# The forms one program writes into its own log, its access lines last. Once the runs of a block of a file
# are all of one family's forms, the file's runs are searched for that family's forms alone (a line of any
# other form ends a run), and the access lines of such a run are the lines the other forms leave: no pass
# over the run counts them (triage.parsers.bulk.summarise).
FAMILIES = (("received", "vllm-stats", "uvicorn"), ("sglang-batch", "sglang-uvicorn"), ("envoy-json",))
SCANNED = frozenset({"received", "vllm-stats", "sglang-batch", "sglang-uvicorn"})  # forms whose lines the per-line
# reading scans for catalog keywords and phase words: a run with them is searched for those words


class RunFinder:
    """RE2 over bytes: the runs of whole lines each of one of some forms. A search for one line of a form
    finds where the next run starts, and a match anchored there reads the run to its end: one pass over
    the run (a search for the whole run reads it twice, forward for its end, then back for its start)."""

    def __init__(self, names: list[str]):
        options = re2.Options()
        options.max_mem = 64 << 20
        alternation = "|".join(f"(?:{_FORMS[n][2]})" for n in names)
        self.first_line = re2.compile(f"(?m)^(?:{alternation})\n".encode(), options)
        self.run = re2.compile(f"(?:(?:{alternation})\n)+".encode(), options)

    def search(self, raw: bytes, pos: int) -> tuple[int, int] | None:
        """(start, end) of the next run at or after pos (pos: a line start), as `(?m)^(?:line\n)+` finds it."""
        m = self.first_line.search(raw, pos)
        if m is None:
            return None
        start = m.start()
        return start, self.run.match(raw, start).end()


@cache
def run_finder(names: tuple[str, ...]) -> RunFinder | None:
    return RunFinder(list(names)) if names else None


def family_of(found: set[str] | list[str], taken: list[str]) -> tuple[str, ...] | None:
    """The family whose forms the found forms (of some runs) all are, when every form of it is taken; else None."""
    for family in FAMILIES:
        if found and set(found) <= set(family) <= set(taken):
            return family
    return None


def form_pattern(name: str) -> str:
    """A form's whole line in RE2's syntax (Python's re reads it alike, the same or stricter with re.ASCII)."""
    return _FORMS[name][2]


def kinds_of(name: str) -> tuple[str, str]:
    return _FORMS[name][:2]


FORM_NAMES = tuple(_FORMS)


def stop_words(vllm: bool = False) -> list[str]:
    """Literals that send a run of routine lines back to the line-by-line reading (an access line's reading
    never looks for them): what makes that reading take such a line for something else. vllm: for vLLM's
    logged prompts and stats lines, whose per-line reading looks at no CUDA version in a logged prompt (it
    reads such a line as the prompt alone: a stats line's words in it are the user's). (vLLM's stats lines
    are read one by one for every stop word and catalog keyword: FileParser._pieces.)"""
    return [t.decode() for t in (_TRICKY[:3] if vllm else _TRICKY)]
