"""The llmserve command: flags (vLLM's names), start-up checks, then serve until SIGTERM drains it.

Example:
    llmserve --model builtin --port 8000 --max-num-seqs 32 --kv-cache-memory 256MiB
    curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"model": "builtin", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}'
"""

import argparse
import os
import re
import sys
from pathlib import Path

from engine.core.config import EngineConfig
from engine.core.faults import FaultConfig
from engine.obs.logs import EventLogger, LogFormat
from engine.obs.tracing import make_tracer_provider
from engine.server.state import ServerConfig

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
DTYPES = ("float32", "bfloat16", "float16", "auto")


class UsageError(Exception):
    """A bad flag or combination of flags: one line, exit 2."""


def parse_size(text: str) -> int:
    """Bytes from `2GiB`, `512MiB`, `1.5G` (binary without the i too, as memory sizes go), `1000000`."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 512MiB, 1073741824)")
    number, unit, _binary, _b = match.groups()
    value = int(float(number) * 1024 ** _POWERS[unit.lower()])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="llmserve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pos_int, pos_float = _positive(int), _positive(float)
    ap.add_argument("--model", default="builtin", help="a Hugging Face checkpoint folder, or builtin")
    ap.add_argument("--served-model-name", help="name clients use in `model` (default: the model's name)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=pos_int)
    ap.add_argument("--max-num-seqs", type=pos_int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=pos_int, default=2048)
    ap.add_argument("--block-size", type=pos_int, default=16)
    ap.add_argument("--kv-cache-memory", type=parse_size, help="KV cache budget, e.g. 2GiB")
    ap.add_argument("--num-kv-blocks", type=pos_int)
    ap.add_argument("--gpu-memory-utilization", type=pos_float, help="fraction of GPU memory (CUDA only)")
    ap.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--api-key", default=os.environ.get("LLMSERVE_API_KEY"),
                    help="require `Authorization: Bearer KEY` on /v1/* (env LLMSERVE_API_KEY)")
    ap.add_argument("--max-queue-len", type=pos_int, help="waiting requests beyond this get 429")
    ap.add_argument("--request-timeout", type=pos_float, help="seconds before a request is ended")
    ap.add_argument("--drain-timeout", type=float, default=30.0, help="seconds SIGTERM lets streams finish")
    ap.add_argument("--max-body-size", type=parse_size, default=4 << 20, help="request body limit (413)")
    ap.add_argument("--log-format", choices=[f.value for f in LogFormat], default="json")
    ap.add_argument("--log-file", help="append log lines here instead of stdout")
    ap.add_argument("--log-prompts", action="store_true", help="log prompt text in request.received")
    ap.add_argument("--log-stats-interval", type=pos_float, default=10.0, help="engine.stats period (s)")
    ap.add_argument("--otlp-traces-endpoint", help="OTLP/HTTP collector, e.g. http://127.0.0.1:4318")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", choices=DTYPES, default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-threads", type=pos_int, metavar="N",
                    help="torch CPU threads (default on CPU: the usable cores minus one, kept for the "
                         "HTTP event loop; at least 1)")
    test_only = ap.add_argument_group("fault injection (test-only, off by default)")
    test_only.add_argument("--fault-crash-after-requests", type=pos_int, metavar="N")
    test_only.add_argument("--fault-oom-after-requests", type=pos_int, metavar="N")
    test_only.add_argument("--fault-step-delay-s", type=pos_float, metavar="S")
    return ap


def configs_from_args(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """Check combinations the parser cannot see; raise UsageError naming the problem."""
    budget = [f for f in ("kv_cache_memory", "num_kv_blocks", "gpu_memory_utilization")
              if getattr(args, f) is not None]
    if len(budget) > 1:
        raise UsageError("choose one KV budget: " + " and ".join("--" + f.replace("_", "-") for f in budget)
                         + " were both given")
    if args.gpu_memory_utilization is not None and not args.device.startswith("cuda"):
        raise UsageError("--gpu-memory-utilization needs --device cuda; use --kv-cache-memory on CPU")
    if args.gpu_memory_utilization is not None and args.gpu_memory_utilization > 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.drain_timeout < 0:
        raise UsageError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
    if args.api_key is not None and not args.api_key:
        raise UsageError("--api-key is empty")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if args.device.startswith("cuda") else "float32")
    faults = FaultConfig(crash_after_requests=args.fault_crash_after_requests,
                         oom_after_requests=args.fault_oom_after_requests,
                         step_delay_s=args.fault_step_delay_s or 0.0)
    engine = EngineConfig(model=args.model, dtype=dtype, device=args.device, seed=args.seed,
                          block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                          kv_cache_memory=args.kv_cache_memory,
                          gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          enable_prefix_caching=args.enable_prefix_caching, faults=faults)
    server = ServerConfig(served_model_name=args.served_model_name, api_key=args.api_key,
                          max_queue_len=args.max_queue_len, request_timeout_s=args.request_timeout,
                          drain_timeout_s=args.drain_timeout, max_body_bytes=args.max_body_size,
                          log_prompts=args.log_prompts, stats_interval_s=args.log_stats_interval)
    return engine, server


def torch_threads(requested: int | None, device: str) -> int | None:
    """Threads for torch's CPU ops; None leaves torch's default (a GPU does the work).

    On CPU one core is left to the event loop (HTTP, SSE, logs): with every core in an OpenMP
    team, each op's barrier waits whenever the loop thread has a peer descheduled, and steps
    slow down far more than the loop's own work (docs/model.md: a batch-32 step 10x slower).
    """
    if requested is not None:
        return requested
    if device != "cpu":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def _open_log(args: argparse.Namespace) -> EventLogger:
    stream = sys.stdout
    if args.log_file:
        try:
            stream = open(args.log_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise UsageError(f"cannot open --log-file {args.log_file}: {exc.strerror}") from None
    name = args.served_model_name or ("builtin" if args.model == "builtin" else Path(args.model).name)
    return EventLogger(name, stream, LogFormat(args.log_format))


def run(argv: list[str] | None = None) -> int:
    from engine.server.builder import StartupError, build_state, load_engine
    from engine.server.runner import bind, serve

    args = build_parser().parse_args(argv)
    engine_config, server_config = configs_from_args(args)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    log = _open_log(args)
    threads = torch_threads(args.torch_threads, args.device)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        try:
            llm = load_engine(engine_config, log)
        except StartupError as exc:
            print(f"llmserve: error: {exc}", file=sys.stderr)
            return exc.exit_code
        state = build_state(llm, server_config, log, make_tracer_provider(args.otlp_traces_endpoint))
        return serve(state, sock)
    finally:
        sock.close()
        log.close()


def main(argv: list[str] | None = None) -> int:
    try:
        code = run(argv)
    except UsageError as exc:
        print(f"llmserve: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
