"""The llmtriage command: `diagnose` names an incident's cause from logs and metrics; `signatures` lists
the failure messages it knows; `plan` does KV arithmetic.

Examples:
  llmtriage diagnose logs/ --format text
  llmtriage diagnose engine.log nginx/ client.log.gz --prometheus http://127.0.0.1:9090 --format json
  llmtriage diagnose logs/ --signatures my-signatures.yaml
  llmtriage signatures --finding engine-crash
  llmtriage plan --model Qwen2.5-7B/ --gpu-memory 80GiB --max-model-len 32768

Exit status: 0 no findings (plan: fits), 1 findings (plan: does not fit), 2 bad usage or nothing readable.
"""

import argparse
import json
import sys

from triage import signatures
from triage.diagnose import DiagnoseOptions, diagnose
from triage.reader import InputError, keep_freed_blocks
from triage.report import DEFAULT_RUNBOOK_BASE, read_summary, render_json, render_text, summary_lines
from triage.timeparse import parse_user_time


class UsageError(Exception):
    """A command-line argument that cannot be used."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own convention)
        self.exit(2, f"llmtriage: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llmtriage", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("diagnose", help="name the cause of an incident from logs (and Prometheus)")
    d.add_argument("paths", nargs="+", metavar="PATH", help="log files, .gz files or folders (recursive)")
    d.add_argument("--format", choices=("text", "json"), default="text")
    d.add_argument("--since", help="ignore lines before this time (ISO-8601 UTC or epoch seconds)")
    d.add_argument("--until", help="ignore lines after this time")
    d.add_argument("--prometheus", metavar="URL", help="Prometheus base URL; queries /api/v1/query_range")
    d.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE, help="prefix of runbook links")
    d.add_argument("--signatures", metavar="FILE", action="append", default=[],
                   help="a YAML catalog of more failure messages, added to the built-in ones (repeatable); "
                        "see `llmtriage signatures` and docs/triage.md")
    s = sub.add_parser("signatures", help="list the failure messages llmtriage knows (id, source, keyword, finding)")
    s.add_argument("--signatures", metavar="FILE", action="append", default=[],
                   help="a YAML catalog to add to the list (checked as diagnose would)")
    s.add_argument("--finding", help="only entries pointing to this finding id")
    s.add_argument("--format", choices=("text", "json"), default="text")
    p = sub.add_parser("plan", help="KV cache arithmetic for a model on a GPU")
    p.add_argument("--model", required=True, help="model folder or its config.json")
    p.add_argument("--gpu-memory", required=True, help="memory per GPU, e.g. 80GiB, 24G")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--format", choices=("text", "json"), default="text")
    return parser


def run_diagnose(args: argparse.Namespace) -> int:
    try:
        since = parse_user_time(args.since) if args.since is not None else None
        until = parse_user_time(args.until) if args.until is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if since is not None and until is not None and since > until:
        raise UsageError(f"--since {args.since} is after --until {args.until}")
    if args.prometheus and not args.prometheus.startswith(("http://", "https://")):
        raise UsageError(f"--prometheus needs an http(s) URL, got {args.prometheus!r}")
    _use_signatures(args.signatures)
    keep_freed_blocks()
    try:
        result = diagnose(DiagnoseOptions(args.paths, since, until, args.prometheus))
    except InputError as exc:
        raise UsageError(str(exc)) from exc
    result.notes.flush()
    if not result.readable:
        print("llmtriage: nothing readable in the given paths", file=sys.stderr)
        return 2
    num_files, num_lines = result.notes.num_files_read, result.notes.num_lines_read
    if args.format == "json":
        print(render_json(result.findings, args.runbook_base,
                          read_summary(result.files, result.facts, num_files, num_lines)))
    else:
        print(render_text(result.findings, args.runbook_base, num_files, num_lines,
                          summary_lines(result.files, result.facts, num_files, num_lines)), end="")
    return 1 if result.findings else 0


def _use_signatures(paths: list[str]) -> None:
    """The built-in catalog plus each --signatures file, in order; a file that cannot be used is a usage error."""
    catalog = signatures.BUILTIN
    for path in paths:
        try:
            catalog = signatures.extend_catalog(catalog, path)
        except signatures.CatalogError as exc:
            raise UsageError(f"--signatures {exc}") from exc
    signatures.use_catalog(catalog)


def run_signatures(args: argparse.Namespace) -> int:
    _use_signatures(args.signatures)
    entries = list(signatures.CATALOG)
    if args.finding:
        known = {s.finding for s in signatures.CATALOG}
        if args.finding not in known:
            raise UsageError(f"--finding {args.finding!r} is no finding of the catalog (known: {', '.join(sorted(known))})")
        entries = [s for s in entries if s.finding == args.finding]
    if args.format == "json":
        print(json.dumps([{
            "id": s.id, "source": s.source, "keyword": s.keyword,
            "pattern": s.pattern.pattern if s.pattern is not None else None, "kind": s.kind,
            "finding": s.finding, "cause": s.cause, "confidence": s.confidence, "meaning": s.meaning,
            "next": s.next, "origin": s.origin} for s in entries], indent=2))
        return 0
    rows = [("ID", "SOURCE", "KEYWORD", "FINDING")]
    for s in entries:
        finding = s.finding + (f" ({s.cause})" if s.cause else "")
        if signatures.CATALOG.kinds.get(s.kind, {}).get("decided_by") == "phase":
            finding = "oom-weights/oom-kv-capacity/oom-runtime (by phase)"
        source = s.source if len(s.source) <= 48 else s.source[:45] + "..."
        rows.append((s.id, source, repr(s.keyword), finding))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}")
    print(f"{len(entries)} signatures")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from triage.plan import PlanError, PlanRequest, make_plan, parse_size, render_plan  # (only for plan)

    try:
        req = PlanRequest(args.model, parse_size(args.gpu_memory), args.gpu_memory_utilization,
                          args.max_model_len, args.dtype, args.tensor_parallel_size, args.block_size)
        plan = make_plan(req)
    except PlanError as exc:
        raise UsageError(str(exc)) from exc
    print(json.dumps(plan.to_json(), indent=2) if args.format == "json" else render_plan(plan), end="\n"
          if args.format == "json" else "")
    return 0 if plan.fits else 1


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed on one line
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "diagnose":
            return run_diagnose(args)
        return run_signatures(args) if args.command == "signatures" else run_plan(args)
    except UsageError as exc:
        print(f"llmtriage: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
