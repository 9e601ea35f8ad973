"""The signature catalog as data: its loader, `llmtriage signatures`, `--signatures`, unrecognised errors,
the healthy summary, evidence file:line, and one case per real wording (tests/triage/real)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from triage import signatures
from triage.signatures import BUILTIN, CatalogError, extend_catalog, parse_catalog, scan

REAL = Path(__file__).parent / "real"
REAL_CASES = sorted(p for p in REAL.iterdir() if (p / "case.yaml").is_file())


def _case_copy(case: Path, tmp_path: Path) -> Path:
    dest = tmp_path / case.name
    shutil.copytree(case, dest, ignore=shutil.ignore_patterns("case.yaml"))
    return dest


@pytest.mark.parametrize("case", REAL_CASES, ids=[c.name for c in REAL_CASES])
def test_real_wording_case(case, tmp_path, diagnose_json):
    """Each real message alone names its cause first; the healthy ones stay below medium confidence."""
    label = yaml.safe_load((case / "case.yaml").read_text())
    folder = _case_copy(case, tmp_path)
    code, doc, err = diagnose_json(folder)
    assert "Traceback" not in err
    findings = doc["findings"]
    if label["label"] == "healthy":
        assert [f["id"] for f in findings if f["confidence"] != "low"] == []
        return
    assert code == 1 and findings, err
    assert findings[0]["id"] == label["label"]
    if label.get("cause"):
        assert findings[0]["cause"] == label["cause"]
    for finding in findings:  # every finding quotes its lines verbatim, with the file and line they are at
        assert finding["evidence"]
        for item in finding["evidence"]:
            lines = Path(item["file"]).read_text().splitlines()
            assert lines[item["line"] - 1] == item["text"]


def test_real_cases_cover_the_labels():
    labels = {yaml.safe_load((c / "case.yaml").read_text())["label"] for c in REAL_CASES}
    assert {"oom-kv-capacity", "oom-weights", "engine-crash", "context-overflow", "stream-cut-client-disconnect",
            "stream-cut-gateway-timeout", "driver-mismatch", "queue-backlog", "cache-miss", "healthy"} <= labels


# --- the built-in catalog ---

def test_builtin_entries_are_complete_and_unique():
    ids = [s.id for s in BUILTIN]
    assert len(ids) == len(set(ids)) and len(ids) >= 150
    for s in BUILTIN:
        assert s.keyword and s.meaning and s.source and s.next, s.id
        assert s.confidence in ("high", "medium", "low"), s.id
    # every engine, gateway and client family has entries
    sources = " ".join(s.source for s in BUILTIN)
    for family in ("vLLM V1", "vLLM V0", "SGLang", "TGI", "llama.cpp", "Ollama", "LM Studio", "LMDeploy", "Triton",
                   "nginx", "Envoy", "Cloudflare", "openai", "LiteLLM", "httpx", "aiohttp", "Linux kernel",
                   "Kubernetes", "NVML", "NVIDIA kernel driver"):
        assert family in sources, family


def _fixture_lines() -> list[str]:
    return [line for case in REAL_CASES for f in case.iterdir() if f.name != "case.yaml"
            for line in f.read_text().splitlines()]


def test_keyword_is_in_every_line_a_pattern_matches():
    """The reader scans for keywords only: an entry whose pattern matched a line without its keyword would
    never see that line."""
    lines = _fixture_lines()
    for s in BUILTIN:
        if s.pattern is None:
            continue
        for line in lines:
            if s.pattern.search(line):
                assert s.keyword in line, (s.id, line)


def test_scan_wordings_across_versions():
    found = dict(scan("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                      "(4000 in the messages, 1000 in the completion)."))
    assert found["context.overflow"]["max_model_len"] == "4096" and found["context.overflow"]["requested"] == "5000"
    found = dict(scan("This model's maximum context length is 16384 tokens. However, your request has 19427 input "
                      "tokens. Please reduce the length of the input messages."))
    assert found["context.overflow"]["requested"] == "19427"
    assert "engine.preemption" in dict(scan(
        "Sequence group cmpl-71c6-0 is preempted in PreemptionMode.RECOMPUTE mode because there is not enough "
        "KV cache space. This can impact end-to-end performance."))
    assert "engine.preemption" in dict(scan(
        "Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
        "space. total_num_cumulative_preemption=3"))


def test_a_known_message_is_not_unrecognised_and_an_indented_line_is_not_an_error():
    line = "(APIServer pid=1) ERROR 12-01 21:50:57 [async_llm.py:906] AsyncLLM output_handler failed."
    assert [k for k, _ in scan("AsyncLLM output_handler failed.", line)] == ["engine.fatal"]
    line = "(APIServer pid=1) ERROR 12-01 21:50:57 [async_llm.py:906] something nobody knows"
    assert [k for k, _ in scan("something nobody knows", line)] == ["log.error"]
    line = "(APIServer pid=1) ERROR 12-01 21:50:57 [async_llm.py:906]     outputs = await get()"
    assert scan("    outputs = await get()", line) == []


# --- the loader: a bad file is a clear error ---

GOOD = {"id": "my-entry", "source": "my app 1.2", "keyword": "flux capacitor overheated",
        "finding": "engine-crash", "meaning": "The app's engine overheated."}


def _load(tmp_path: Path, doc) -> signatures.Catalog:
    path = tmp_path / "my.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return extend_catalog(BUILTIN, str(path))


@pytest.mark.parametrize("doc, message", [
    ("signatures: [\n", "line 2: not valid YAML (expected the node content, but found '<stream end>')"),
    ("- a\n- b\n", "a catalog is a mapping with a 'signatures' list of entries"),
    ({"signatures": []}, "'signatures' is empty"),
    ({"signatures": ["x"]}, "entry 1: an entry is a mapping of keys to values, got str"),
    ({"signatures": [{**GOOD, "colour": "red"}]}, "entry 1 (my-entry): unknown key(s) colour (known: "),
    ({"signatures": [{k: v for k, v in GOOD.items() if k != "keyword"}]},
     "entry 1 (my-entry): 'keyword' is required and must be a non-empty string"),
    ({"signatures": [{**GOOD, "id": "My Entry"}]},
     "entry 1 (My Entry): 'id' must be lower-case letters, digits, '.' and '-'"),
    ({"signatures": [{**GOOD, "pattern": "("}]},
     "entry 1 (my-entry): pattern does not compile (missing ), unterminated subpattern at position 0)"),
    ({"signatures": [{**GOOD, "kind": "engine.exploded"}]}, "entry 1 (my-entry): unknown kind 'engine.exploded'"),
    ({"signatures": [{**GOOD, "finding": "gremlins"}]}, "entry 1 (my-entry): unknown finding 'gremlins'"),
    ({"signatures": [{k: v for k, v in GOOD.items() if k != "finding"}]},
     "entry 1 (my-entry): an entry of kind 'signature' needs a 'finding'"),
    ({"signatures": [{**GOOD, "confidence": "certain"}]},
     "entry 1 (my-entry): confidence must be one of high, medium, low, got 'certain'"),
    ({"signatures": [GOOD, GOOD]}, "entry 2 (my-entry): this id is used already"),
    ({"signatures": [{**GOOD, "id": "vllm-enginecore-fatal"}]}, "entry 1 (vllm-enginecore-fatal): this id is used already"),
    ({"signatures": [{**GOOD, "fields": {"phase": 3}}]}, "entry 1 (my-entry): 'fields' must map names to string values"),
    ({"kinds": {}, "signatures": [GOOD]}, "'kinds' belongs to the built-in catalog"),
])
def test_bad_catalog_files_name_the_problem(tmp_path, doc, message):
    with pytest.raises(CatalogError) as exc:
        _load(tmp_path, doc)
    assert str(exc.value).startswith(f"{tmp_path / 'my.yaml'}: ") and message in str(exc.value)


def test_missing_and_folder_catalogs(tmp_path):
    with pytest.raises(CatalogError, match=r"nope\.yaml: no such file$"):
        extend_catalog(BUILTIN, str(tmp_path / "nope.yaml"))
    with pytest.raises(CatalogError, match="is a folder, not a catalog file$"):
        extend_catalog(BUILTIN, str(tmp_path))


def test_a_user_entry_extends_the_catalog(tmp_path):
    catalog = _load(tmp_path, {"signatures": [GOOD]})
    assert len(catalog) == len(BUILTIN) + 1
    entry = catalog.signatures[-1]
    assert (entry.kind, entry.finding, entry.confidence, entry.origin) == (
        "signature", "engine-crash", "high", str(tmp_path / "my.yaml"))
    assert parse_catalog("signatures: []\nkinds: {}\n", "x.yaml").signatures == ()


# --- the command line ---

def test_signatures_lists_every_entry(run_cli):
    code, out, err = run_cli("signatures")
    lines = out.splitlines()
    assert code == 0 and err == ""
    assert lines[0].split() == ["ID", "SOURCE", "KEYWORD", "FINDING"]
    assert lines[-1] == f"{len(BUILTIN)} signatures"
    row = next(line for line in lines if line.startswith("vllm-enginecore-fatal "))
    assert "'EngineCore encountered a fatal error'" in row and row.endswith("engine-crash")
    row = next(line for line in lines if line.startswith("torch-cuda-oom "))
    assert row.endswith("oom-weights/oom-kv-capacity/oom-runtime (by phase)")


def test_signatures_json_and_filter(run_cli, tmp_path):
    (tmp_path / "my.yaml").write_text(yaml.safe_dump({"signatures": [GOOD]}))
    code, out, _ = run_cli("signatures", "--format", "json", "--finding", "engine-crash",
                           "--signatures", tmp_path / "my.yaml")
    entries = json.loads(out)
    assert code == 0 and {e["finding"] for e in entries} == {"engine-crash"}
    assert entries[-1] == {"id": "my-entry", "source": "my app 1.2", "keyword": "flux capacitor overheated",
                           "pattern": None, "kind": "signature", "finding": "engine-crash", "cause": None,
                           "confidence": "high", "meaning": "The app's engine overheated.",
                           "next": "see the finding's next steps", "origin": str(tmp_path / "my.yaml")}
    assert run_cli("signatures", "--finding", "gremlins")[0] == 2


def test_diagnose_with_user_signatures(run_cli, diagnose_json, tmp_path):
    log = tmp_path / "logs" / "app.log"
    log.parent.mkdir()
    log.write_text("INFO starting\nERROR flux capacitor overheated at step 3\nINFO stopped\n")
    mine = tmp_path / "my.yaml"
    mine.write_text(yaml.safe_dump({"signatures": [{**GOOD, "next": "cool the flux capacitor"}]}))
    code, doc, _ = diagnose_json(log.parent)  # unknown: a low-confidence hint quoting the line
    assert code == 1 and [(f["id"], f["confidence"]) for f in doc["findings"]] == [("unrecognised-error", "low")]
    assert doc["findings"][0]["evidence"][0]["text"] == "ERROR flux capacitor overheated at step 3"
    assert doc["findings"][0]["evidence"][0]["line"] == 2
    code, doc, _ = diagnose_json(log.parent, extra=("--signatures", mine))
    first = doc["findings"][0]
    assert (first["id"], first["confidence"], first["explanation"], first["next_steps"]) == (
        "engine-crash", "high", "The app's engine overheated.", ["cool the flux capacitor"])
    assert [f["id"] for f in doc["findings"]] == ["engine-crash"]  # explained: no unrecognised hint beside it
    code, doc, _ = diagnose_json(log.parent)  # the user's entries last for one run only
    assert doc["findings"][0]["id"] == "unrecognised-error"
    bad = tmp_path / "bad.yaml"
    bad.write_text("signatures:\n  - id: x\n")
    code, out, err = run_cli("diagnose", log.parent, "--signatures", bad)
    assert (code, out) == (2, "")
    assert err == f"llmtriage: --signatures {bad}: entry 1 (x): 'source' is required and must be a non-empty string\n"


def test_unrecognised_error_text_report_quotes_file_and_line(run_cli, tmp_path):
    log = tmp_path / "worker.log"
    log.write_text("2026-11-29T10:00:00Z starting\nKeyError: 'lm_head.weight'\n")
    code, out, _ = run_cli("diagnose", log)
    assert code == 1
    assert out.startswith("No problems found (1 files, 2 lines read).\n")
    assert "1 low-confidence hint(s), not findings:" in out
    assert f"    - {log}:2\n        KeyError: 'lm_head.weight'\n" in out


def test_healthy_report_says_what_it_read(run_cli, tmp_path):
    folder = _case_copy(REAL / "vllm-0.32-sigterm-shutdown", tmp_path)
    code, out, _ = run_cli("diagnose", folder)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "No problems found (1 files, 151 lines read)."
    assert lines[1] == f"  files: {folder / 'vllm.log'}"
    assert lines[2].startswith("  formats recognised: vLLM text log (")
    assert lines[3] == "  time span: 2026-12-01T21:44:57.000Z .. 2026-12-01T21:50:57.000Z (6 min)"
    assert lines[4].startswith("  requests: ") and lines[5] == "  errors: 0 error lines, 0 HTTP 5xx responses"


def test_shutdown_errors_are_counter_evidence_of_a_real_crash(diagnose_json, tmp_path):
    """An engine that crashed before it was stopped is still a crash; the errors of the stop are noted."""
    log = tmp_path / "vllm.log"
    log.write_text(
        "(EngineCore_DP0 pid=5) ERROR 12-01 21:40:00 [core.py:710] EngineCore encountered a fatal error.\n"
        "(EngineCore pid=5) INFO 12-01 21:50:57 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM\n"
        "(APIServer pid=1) ERROR 12-01 21:50:57 [async_llm.py:906] AsyncLLM output_handler failed.\n")
    code, doc, _ = diagnose_json(log)
    crash = doc["findings"][0]
    assert (crash["id"], crash["confidence"]) == ("engine-crash", "high")
    assert [e["line"] for e in crash["evidence"]] == [1]
    assert crash["counter_evidence"] == [
        f"{log}:3: logged after a requested shutdown, so read as the shutdown, not as the crash"]


@pytest.mark.parametrize("message, kind", [
    ("'max_tokens' or 'max_completion_tokens' is too large: 4096. This model's maximum context length is 4096 "
     "tokens and your request has 10 input tokens (4096 > 4096 - 10).", "context.overflow"),
    ("Input validation error: `inputs` must have less than 1024 tokens. Given: 2000", "context.overflow"),
    ("prompt is too long: 208310 tokens > 200000 maximum", "context.overflow"),
    ('{"error": {"code": "context_length_exceeded"}}', "context.overflow"),
    ("Received sigquit from a child process. It usually means the child failed.", "engine.fatal"),
    ("AsyncEngineDeadError: Task finished unexpectedly. This should never happen!", "engine.fatal"),
    ("NVRM: GPU at PCI:0000:00:1e.0: GPU has fallen off the bus.", "engine.fatal"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "engine.fatal"),
    ("Avg prompt throughput: 0.0 tokens/s, Running: 3 reqs, Swapped: 2 reqs, Pending: 0 reqs", "engine.preemption"),
    ("openai.RateLimitError: Error code: 429", "queue.full"),
    ("vllm.exceptions.QueueOverflowError: The engine is currently busy and cannot accept new requests. Please try "
     "again later or on a different instance.", "queue.full"),
    ("vllm.exceptions.MaxQueuedTokensError: The engine has reached its prefill token backlog limit. Please try again "
     "later or on a different instance.", "queue.full"),
    ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a "
     "newer version, or use an earlier cuda container: unknown", "driver.mismatch"),
    ('{"message": "Endpoint request timed out"}', "gateway.upstream_timeout"),
    ("httpcore.RemoteProtocolError: Server disconnected without sending a response.", "client.stream_cut"),
    ("TypeError: fetch failed ... code: 'UND_ERR_HEADERS_TIMEOUT'", "client.timeout"),
])
def test_more_wordings(message, kind):
    assert kind in dict(scan(message))


def test_no_swapped_requests_is_no_preemption():
    assert "engine.preemption" not in dict(scan("Running: 3 reqs, Swapped: 0 reqs, Pending: 0 reqs"))


def test_builtin_patterns_compile_when_first_searched():
    """The built-in entries' patterns are compiled on first use (start-up time): each one compiles, and
    searches as the compiled pattern does."""
    import re
    lazy = [s for s in BUILTIN if isinstance(s.pattern, signatures.LazyPattern)]
    assert len(lazy) == sum(s.pattern is not None for s in BUILTIN) > 50
    for s in lazy:
        compiled = re.compile(s.pattern.pattern, s.pattern.flags)
        for text in (s.keyword, s.meaning):
            found, expected = s.pattern.search(text), compiled.search(text)
            assert (found and found.span()) == (expected and expected.span()), s.id
        assert s.pattern.compiled is not None


def test_the_builtin_catalog_is_read_from_its_json_copy_once_made(tmp_path, monkeypatch):
    """The built-in catalog's document is copied as JSON into the cache folder at the first start and read
    from there after (yaml is not even imported then); the copy is named by the YAML's hash, so an edited
    catalog is read afresh and replaces it; a copy that cannot be read is read past, a folder that cannot be
    written leaves the YAML read each time."""
    raw = (Path(signatures.__file__).with_name("signatures.yaml")).read_bytes()
    expected = yaml.safe_load(raw)
    cache = tmp_path / "cache"
    assert signatures.builtin_document(raw, cache) == expected  # (read from the YAML, copied)
    [copy] = cache.iterdir()
    assert json.loads(copy.read_bytes()) == expected

    def no_yaml(text, origin):
        raise AssertionError("the YAML was read")

    monkeypatch.setattr(signatures, "load_yaml", no_yaml)
    assert signatures.builtin_document(raw, cache) == expected  # (from the copy)
    monkeypatch.undo()
    edited = raw + b"\n# an edit\n"
    assert signatures.builtin_document(edited, cache) == expected
    assert [p.name for p in cache.iterdir()] != [copy.name] and len(list(cache.iterdir())) == 1
    [copy] = cache.iterdir()
    copy.write_bytes(b"{not json")
    assert signatures.builtin_document(edited, cache) == expected  # (read past, made again)
    assert json.loads(copy.read_bytes()) == expected
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    assert signatures.builtin_document(raw, blocked) == expected
    assert signatures.builtin_document(raw, None) == expected


def test_a_start_with_the_catalog_copied_imports_no_yaml(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(Path(signatures.__file__).parents[1]))
    code = "import sys, triage.signatures as s; print(len(s.SIGNATURES), 'yaml' in sys.modules)"
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.split()[1] == "True" and second.stdout.split() == [first.stdout.split()[0], "False"]
    assert int(first.stdout.split()[0]) == len(signatures.SIGNATURES)
