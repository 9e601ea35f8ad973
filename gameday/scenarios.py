"""The game-day scenarios, declared as data: what to start, which load, what must be seen."""

from __future__ import annotations

from dataclasses import dataclass, field

from gameday.errors import UnknownScenarioError
from gameday.nginx import DEFAULT_READ_TIMEOUT_S


@dataclass(slots=True)
class LoadPhase:
    """One headless Locust run of loadgen/chat.py."""

    profile: str
    users: int
    run_time_s: int
    spawn_rate: float = 10.0
    extra_args: list[str] = field(default_factory=list)  # loadgen flags (--max-tokens, --rate ...)


@dataclass(slots=True)
class Fault:
    """An action the harness itself takes during the load (not an llmserve flag)."""

    # "kill-replica": SIGKILL engine replica `replica` (its whole process group);
    # "kill-engine-core": SIGKILL vLLM's engine core process alone (the API server then exits)
    kind: str
    at_s: float  # seconds after Prometheus started watching the load
    replica: int = 0


@dataclass(slots=True)
class Scenario:
    name: str
    summary: str
    engine: str = "llmserve"  # the engine under test: llmserve or vllm (gameday/scenarios_vllm.py)
    engine_flags: list[str] = field(default_factory=list)
    num_replicas: int = 1
    proxy_read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    proxy_buffering: bool = False  # on: with gzip for event streams and X-Accel-Buffering ignored
    phases: list[LoadPhase] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # Each inner list is one expectation met by any of its alerts ("A or B").
    expected_alerts: list[list[str]] = field(default_factory=list)
    # Alerts that may also fire as true co-symptoms (name -> why); any other alert fails the run.
    expected_finding: str | None = None  # None: triage must report status ok
    expected_cause: str | None = None
    engine_starts: bool = True  # False: llmserve must refuse to start (the fault is the config)
    alert_wait_s: float = 40.0  # after the load, how long to wait for the expected alerts
    settle_s: float = 4.0  # healthy runs: how long to keep watching after the load (nothing fires)
    ci: bool = False  # part of the fast subset in make test
    probe_dashboards: bool = False  # run every dashboard panel query at the end (dashboards.json)
    # proxy-buffering: the client's TTFT p50 over the engine's own mean TTFT must reach this
    min_client_ttft_ratio: float | None = None
    # Load straight to engine-0 (no gateway), its /metrics read before and after: loadgen's p50s must
    # lie in the engine's median buckets and its usage tokens equal the engine's (gameday.agreement)
    loadgen_agreement: bool = False


# Default prompt and answer sizes keep a CPU step short; the scenario flags make the fault.
_STEADY = ["--output-tokens", "32", "--prompt-tokens", "64"]

SCENARIOS: list[Scenario] = [
    Scenario(
        name="healthy", summary="steady load well within capacity: nothing fires, triage finds nothing",
        phases=[LoadPhase("steady", users=2, run_time_s=15, extra_args=_STEADY)], ci=True, probe_dashboards=True),
    Scenario(
        name="kv-pressure",
        summary="a tiny KV budget (64 blocks of 16 tokens) overflowed by 6 long streams: preemptions, fast starts",
        # max_model_len 1024: the budget holds one longest request, as llmserve requires at start. A few
        # long streams whose growth overflows the cache (not many short ones) keep the waiting queue to
        # preempted streams, which already had their first token: new requests need 3 blocks and get them
        # whenever a long stream ends, so the TTFT SLO holds and only the KV alerts fire (check c).
        engine_flags=["--num-kv-blocks", "64", "--block-size", "16", "--max-model-len", "1024"],
        phases=[LoadPhase("steady", users=6, run_time_s=60, spawn_rate=0.5,
                          extra_args=["--output-tokens", "300", "--prompt-tokens", "32"])],
        expected_alerts=[["LLMKVCacheNearlyFull"], ["LLMPreemptionsHigh"]],
        expected_finding="kv-preemption", probe_dashboards=True),
    Scenario(
        name="kv-capacity-startup", summary="max_model_len 4096 needs 32 MiB of KV cache, the budget is 16 MiB: llmserve refuses to start",
        engine_flags=["--max-model-len", "4096", "--kv-cache-memory", "16MiB"],
        engine_starts=False, expected_alerts=[["LLMEngineDown"]], expected_finding="oom-kv-capacity"),
    Scenario(
        name="overload", summary="open-loop arrivals far beyond what 2 sequences at a time can serve",
        engine_flags=["--max-num-seqs", "2", "--fault-step-delay-s", "0.02"],
        phases=[LoadPhase("poisson", users=32, run_time_s=30,
                          extra_args=["--rate", "8", "--max-concurrency", "32", *_STEADY])],
        expected_alerts=[["LLMQueueBacklog"], ["LLMTTFTSLOBurn"]], expected_finding="queue-backlog"),
    Scenario(
        name="gateway-timeout",
        summary="nginx proxy_read_timeout 1s, but a non-streamed 192-token answer takes the engine ~4s",
        proxy_read_timeout_s=1.0,
        phases=[LoadPhase("steady", users=2, run_time_s=20,
                          extra_args=["--no-stream", "--output-tokens", "192", "--prompt-tokens", "64"])],
        expected_alerts=[["LLMStreamAbortsHigh", "LLMErrorRateHigh"]],
        expected_finding="stream-cut-gateway-timeout", ci=True),
    Scenario(
        name="client-abort", summary="clients cancel their streams after a few tokens",
        phases=[LoadPhase("abort", users=2, run_time_s=20, extra_args=["--output-tokens", "128", "--prompt-tokens", "64"])],
        expected_alerts=[["LLMStreamAbortsHigh"]], expected_finding="stream-cut-client-disconnect", ci=True),
    Scenario(
        name="proxy-buffering",
        summary="nginx proxy_buffering on with gzip on event streams: the engine is healthy, clients wait",
        proxy_buffering=True, min_client_ttft_ratio=3.0,
        phases=[LoadPhase("steady", users=2, run_time_s=15, extra_args=["--output-tokens", "64", "--prompt-tokens", "64"])],
        expected_finding="stream-cut-proxy-buffering"),
    Scenario(
        name="dynamic-prefix", summary="a shared system prompt, then a timestamp at the start of every prompt",
        phases=[LoadPhase("shared-prefix", users=2, run_time_s=30, extra_args=[*_STEADY, "--prefix-tokens", "256"]),
                LoadPhase("dynamic-prefix", users=2, run_time_s=30, extra_args=[*_STEADY, "--prefix-tokens", "256"])],
        expected_alerts=[["LLMPrefixCacheHitRateLow"]], expected_finding="cache-miss", expected_cause="dynamic-prefix"),
    Scenario(
        name="engine-crash", summary="the engine loop dies after 10 finished requests and the process exits",
        engine_flags=["--fault-crash-after-requests", "10"],
        phases=[LoadPhase("steady", users=2, run_time_s=20, extra_args=_STEADY)],
        expected_alerts=[["LLMEngineDown"]], expected_finding="engine-crash", ci=True),
    Scenario(
        name="runtime-oom", summary="CUDA out-of-memory raised in the forward pass after 8 requests, engine stays up",
        engine_flags=["--fault-oom-after-requests", "8"],
        phases=[LoadPhase("steady", users=4, run_time_s=20, extra_args=_STEADY)],
        expected_alerts=[["LLMErrorRateHigh"]], expected_finding="oom-runtime"),
    Scenario(
        name="replica-down", summary="two replicas behind nginx, one killed mid-load; traffic continues",
        num_replicas=2, faults=[Fault("kill-replica", at_s=8.0, replica=1)],
        phases=[LoadPhase("steady", users=4, run_time_s=20, extra_args=_STEADY)],
        expected_alerts=[["LLMEngineDown"]], expected_finding="engine-crash"),
]


ENGINES = ("llmserve", "vllm")


def scenarios_for(engine: str = "llmserve") -> list[Scenario]:
    if engine == "vllm":
        from gameday.scenarios_vllm import VLLM_SCENARIOS

        return VLLM_SCENARIOS
    if engine != "llmserve":
        raise UnknownScenarioError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return SCENARIOS


def get_scenario(name: str, engine: str = "llmserve") -> Scenario:
    scenarios = scenarios_for(engine)
    for scenario in scenarios:
        if scenario.name == name:
            return scenario
    names = ", ".join(s.name for s in scenarios)
    suffix = "" if engine == "llmserve" else f" on {engine}"
    raise UnknownScenarioError(f"unknown scenario {name!r}{suffix}; known: {names}")
