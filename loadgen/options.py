"""Command-line options of the locustfile and their validation into one LoadgenConfig."""

from dataclasses import dataclass
from pathlib import Path

PROFILES = ("steady", "ramp", "spike", "step", "poisson", "long-context", "shared-prefix",
            "dynamic-prefix", "abort", "multi-turn")
DEFAULT_REPORT_DIR = "reports"
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class ConfigError(Exception):
    """An option value the load generator cannot run with; the message names the option."""


@dataclass(slots=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def as_dict(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms}


@dataclass(slots=True)
class LoadgenConfig:
    profile: str
    endpoint: str
    api_key: str | None
    model: str | None
    prompt_tokens: int
    output_tokens: int | None
    dataset: str | None
    rate: float
    max_concurrency: int
    max_model_len: int | None
    block_size: int
    prefix_tokens: int
    num_turns: int
    abort_after_tokens: int
    stage_s: float
    num_steps: int
    slo: SLO
    report_dir: Path
    client_log: str | None
    client_log_format: str
    timeout_s: float
    seed: int | None
    num_users: int
    stream: bool = True  # --no-stream: stream false, E2E only

    @property
    def path(self) -> str:
        return ENDPOINTS[self.endpoint]


def add_arguments(parser) -> None:
    """Register the options on Locust's parser (they show in the web UI).

    Locust already owns `--profile` (a free-text run label); on the command line it names the load
    profile. `--load-profile` is the same choice as a list (the web UI shows it as one) and wins
    when both are given.
    """
    add = parser.add_argument  # Locust's own: knows include_in_web_ui, is_secret (a group's does not)
    add("--load-profile", choices=PROFILES, default=None,
        help=f"Load profile: {', '.join(PROFILES)} (default: --profile, else steady)")
    add("--endpoint", choices=sorted(ENDPOINTS), default="chat", help="chat or completions API")
    add("--api-key", default=None, is_secret=True, env_var="OPENAI_API_KEY", help="Bearer token")
    add("--model", default=None, help="Model name (default: the first from /v1/models)")
    add("--prompt-tokens", type=int, default=256, help="Prompt length of the built-in generator")
    add("--output-tokens", type=int, default=0,
        help="max_tokens, sent with ignore_eos (0: 128, or with --dataset each entry's answer length)")
    add("--dataset", default=None, help="ShareGPT JSON file to take prompts from")
    add("--rate", type=float, default=1.0, help="poisson: mean arrivals per second")
    add("--max-concurrency", type=int, default=0, help="poisson: most requests in flight (default -u)")
    add("--max-model-len", type=int, default=0,
        help="long-context: the server's context length (default: read from /v1/models or /metrics)")
    add("--block-size", type=int, default=16, help="KV block size, for the best possible prefix hit rate")
    add("--prefix-tokens", type=int, default=1024, help="shared-prefix / dynamic-prefix: shared part")
    add("--turns", type=int, default=4, help="multi-turn: turns per conversation")
    add("--abort-after-tokens", type=int, default=3, help="abort: chunks read before the client cancels")
    add("--stage-s", type=float, default=10.0, help="ramp, spike, step: seconds per stage")
    add("--num-steps", type=int, default=4, help="step: number of user steps up to -u")
    add("--slo-ttft-ms", type=float, default=0.0, help="goodput SLO on TTFT (0: none)")
    add("--slo-tpot-ms", type=float, default=0.0, help="goodput SLO on TPOT (0: none)")
    add("--slo-e2e-ms", type=float, default=0.0, help="goodput SLO on E2E latency (0: none)")
    add("--report-dir", default=DEFAULT_REPORT_DIR, help="Where the summary, CSV and plots go")
    add("--client-log", default="", help="Client log file: one line per failed, cut or cancelled request")
    add("--client-log-format", choices=["text", "json"], default="text", help="text or json lines")
    add("--timeout-s", type=float, default=300.0, help="Read timeout: longest silence inside a stream")
    add("--no-stream", action="store_true", default=False,
        help="Send stream: false and wait for the whole answer (E2E only: no TTFT, ITL or TPOT)")
    add("--seed", type=int, default=0, help="Prompt generator seed (0: random)")
    add("--loadgen-profile", default="", include_in_web_ui=False,
        help="(internal) the master's profile, forwarded to workers")


def _positive(name: str, value: float | int) -> None:
    if value is None or value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


def profile_of(opts, worker: bool = False) -> str:
    """The run's load profile: --load-profile, else Locust's --profile, else steady. A worker takes
    the one its master forwarded (Locust does not forward its own --profile)."""
    if worker and getattr(opts, "loadgen_profile", ""):
        return opts.loadgen_profile
    return getattr(opts, "load_profile", None) or getattr(opts, "profile", None) or "steady"


def config_from_options(opts, worker: bool = False) -> LoadgenConfig:
    """Validate Locust's parsed options; raises ConfigError naming the bad option."""
    profile = profile_of(opts, worker)
    if profile not in PROFILES:
        raise ConfigError(f"--profile {profile!r} is not a load profile; choose one of {', '.join(PROFILES)}")
    if opts.endpoint not in ENDPOINTS:
        raise ConfigError(f"--endpoint {opts.endpoint!r}: choose chat or completions")
    for name in ("prompt_tokens", "block_size", "prefix_tokens", "turns", "abort_after_tokens",
                 "num_steps", "stage_s", "timeout_s"):
        _positive("--" + name.replace("_", "-"), getattr(opts, name))
    for name in ("output_tokens", "rate", "max_concurrency", "max_model_len", "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"):
        if getattr(opts, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(opts, name)}")
    if profile == "poisson":
        _positive("--rate", opts.rate)
    if getattr(opts, "no_stream", False):  # the first token arrives with the last: nothing to time or cancel
        if profile == "abort":
            raise ConfigError("--no-stream cannot be used with --profile abort: it cancels streams after "
                              "--abort-after-tokens chunks")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            if getattr(opts, name):
                raise ConfigError(f"--no-stream cannot be used with --{name.replace('_', '-')}: without a "
                                  "stream the client sees no first token; use --slo-e2e-ms")
    num_users = int(getattr(opts, "num_users", None) or 1)
    return LoadgenConfig(
        profile=profile, endpoint=opts.endpoint, api_key=opts.api_key or None, model=opts.model or None,
        prompt_tokens=opts.prompt_tokens, output_tokens=opts.output_tokens or None, dataset=opts.dataset or None,
        rate=opts.rate, max_concurrency=opts.max_concurrency or num_users,
        max_model_len=opts.max_model_len or None, block_size=opts.block_size, prefix_tokens=opts.prefix_tokens,
        num_turns=opts.turns, abort_after_tokens=opts.abort_after_tokens, stage_s=opts.stage_s,
        num_steps=opts.num_steps,
        slo=SLO(opts.slo_ttft_ms or None, opts.slo_tpot_ms or None, opts.slo_e2e_ms or None),
        report_dir=Path(opts.report_dir or DEFAULT_REPORT_DIR), client_log=opts.client_log or None,
        client_log_format=opts.client_log_format, timeout_s=opts.timeout_s, seed=opts.seed or None,
        num_users=num_users, stream=not getattr(opts, "no_stream", False),
    )
