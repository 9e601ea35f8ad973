"""The catalog of known failure messages (triage/signatures.yaml), loaded as data.

Each entry names one real message of an engine, gateway, client, kernel or driver: a literal keyword
(checked first, and what the reader scans for), an optional pattern, the event kind the rules read,
the finding it points to and the confidence it gives alone. Users add entries with
`llmtriage diagnose --signatures my.yaml` (load_user_catalog)."""

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

CONFIDENCES = ("high", "medium", "low")
_ID = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_ENTRY_KEYS = {"id", "source", "keyword", "pattern", "kind", "finding", "cause", "confidence", "meaning", "next",
               "fields", "ignore_case", "match_line"}
_REQUIRED = ("id", "source", "keyword", "meaning")
_KEY_FIXUPS = {"gpu2": "gpu", "total2": "total", "enabled2": "enabled"}


class LazyPattern:
    """A built-in entry's pattern, compiled when first searched: compiling the catalog's hundred-odd
    patterns at start costs more than most runs spend searching them (a run searches the few whose
    keyword a line holds). The tests compile every one."""

    __slots__ = ("pattern", "flags", "compiled")

    def __init__(self, pattern: str, flags: int):
        self.pattern, self.flags = pattern, flags
        self.compiled: re.Pattern | None = None

    def search(self, text: str):
        compiled = self.compiled
        if compiled is None:
            compiled = self.compiled = re.compile(self.pattern, self.flags)
        return compiled.search(text)


class CatalogError(Exception):
    """A catalog file that cannot be used: the message names the file, the entry and the problem."""


@dataclass(slots=True, frozen=True)
class Signature:
    kind: str  # the event kind the rules read
    keyword: str  # a plain substring of every matching line, checked first: most lines are rejected by `in` alone
    pattern: "re.Pattern | LazyPattern | None" = None
    fields: tuple[tuple[str, str], ...] = ()  # fixed fields added to the event
    id: str = ""
    source: str = ""
    finding: str = ""
    cause: str | None = None
    confidence: str = "high"
    meaning: str = ""
    next: str = ""
    match_line: bool = False  # searched in the whole line (envelope included), not the message alone
    origin: str = "built-in"  # the file the entry came from


@dataclass(slots=True, frozen=True)
class Catalog:
    signatures: tuple[Signature, ...]
    kinds: dict  # kind -> its defaults (finding, confidence, next, decided_by)

    def __iter__(self) -> Iterator[Signature]:
        return iter(self.signatures)

    def __len__(self) -> int:
        return len(self.signatures)


def _fail(origin: str, where: str, problem: str) -> CatalogError:
    return CatalogError(f"{origin}: {where}: {problem}")


def _entry(raw, index: int, origin: str, kinds: dict, finding_ids: Iterable[str], lazy: bool = False) -> Signature:
    where = f"entry {index + 1}"
    if not isinstance(raw, dict):
        raise _fail(origin, where, f"an entry is a mapping of keys to values, got {type(raw).__name__}")
    if isinstance(raw.get("id"), str):
        where = f"entry {index + 1} ({raw['id']})"
    unknown = sorted(set(map(str, raw)) - _ENTRY_KEYS)
    if unknown:
        raise _fail(origin, where, f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_ENTRY_KEYS))})")
    for key in _REQUIRED:
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise _fail(origin, where, f"'{key}' is required and must be a non-empty string")
    for key in ("pattern", "kind", "finding", "cause", "confidence", "next"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise _fail(origin, where, f"'{key}' must be a string")
    if not _ID.match(raw["id"]):
        raise _fail(origin, where, "'id' must be lower-case letters, digits, '.' and '-'")
    kind = raw.get("kind") or "signature"
    if kind not in kinds:
        raise _fail(origin, where, f"unknown kind {kind!r} (known: {', '.join(sorted(kinds))})")
    defaults = kinds[kind]
    finding = raw.get("finding") or defaults.get("finding", "")
    if kind == "signature" and not raw.get("finding"):
        raise _fail(origin, where, "an entry of kind 'signature' needs a 'finding'")
    if finding not in finding_ids:
        raise _fail(origin, where, f"unknown finding {finding!r} (known: {', '.join(sorted(finding_ids))})")
    confidence = raw.get("confidence") or defaults.get("confidence", "high")
    if confidence not in CONFIDENCES:
        raise _fail(origin, where, f"confidence must be one of {', '.join(CONFIDENCES)}, got {confidence!r}")
    flags = re.IGNORECASE if raw.get("ignore_case") else 0
    pattern = None
    if raw.get("pattern") and lazy:
        pattern = LazyPattern(raw["pattern"], flags)
    elif raw.get("pattern"):
        try:
            pattern = re.compile(raw["pattern"], flags)
        except re.error as exc:
            raise _fail(origin, where, f"pattern does not compile ({exc})") from exc
    fixed = raw.get("fields") or {}
    if not isinstance(fixed, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in fixed.items()):
        raise _fail(origin, where, "'fields' must map names to string values")
    fields = dict(fixed)
    if raw.get("cause"):
        fields.setdefault("cause", raw["cause"])
    if kind == "signature" or raw.get("confidence"):
        fields.setdefault("confidence", confidence)
    fields.setdefault("signature", raw["id"])  # the finding explains itself with the entry's meaning
    if kind == "signature":
        fields.setdefault("finding", finding)
    return Signature(
        kind=kind, keyword=raw["keyword"], pattern=pattern, fields=tuple(fields.items()), id=raw["id"],
        source=raw["source"], finding=finding, cause=raw.get("cause"), confidence=confidence,
        meaning=raw["meaning"].strip(), next=(raw.get("next") or defaults.get("next", "")).strip(),
        match_line=bool(raw.get("match_line")), origin=origin)


def load_yaml(text: str, origin: str):
    """The YAML document in text; CatalogError naming where it is not valid YAML."""
    import yaml  # (the built-in catalog is read from its cache, without yaml: importing it costs 20 ms)

    try:
        try:  # libyaml's parser reads the catalog about ten times faster than PyYAML's Python one
            return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (safe)
        except yaml.YAMLError:  # PyYAML's own parser says where and what more plainly: its message
            return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}" if mark is not None else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _fail(origin, at, f"not valid YAML ({problem})") from exc


def parse_catalog(text: str | None, origin: str, kinds: dict | None = None,
                  taken: Iterable[str] = (), lazy: bool = False, doc=None) -> Catalog:
    """A catalog document (YAML text, or doc: the document loaded already): a `signatures` list, and
    `kinds` for the built-in file. lazy: patterns compiled when first searched (the built-in file, whose
    patterns the tests compile; a user's file is checked whole as it is read)."""
    from triage.model import FINDING_IDS  # (model imports nothing of this module)

    finding_ids = (*FINDING_IDS, "unrecognised-error")
    if text is not None:
        doc = load_yaml(text, origin)
    if not isinstance(doc, dict) or not isinstance(doc.get("signatures"), list):
        raise CatalogError(f"{origin}: a catalog is a mapping with a 'signatures' list of entries")
    if kinds is None:
        kinds = doc.get("kinds")
        if not isinstance(kinds, dict):
            raise CatalogError(f"{origin}: the built-in catalog needs its 'kinds' table")
    elif "kinds" in doc:
        raise CatalogError(f"{origin}: 'kinds' belongs to the built-in catalog; give each entry a 'kind' "
                           "or a 'finding' instead")
    seen = set(taken)
    out = []
    for index, raw in enumerate(doc["signatures"]):
        entry = _entry(raw, index, origin, kinds, finding_ids, lazy)
        if entry.id in seen:
            raise _fail(origin, f"entry {index + 1} ({entry.id})", "this id is used already")
        seen.add(entry.id)
        out.append(entry)
    return Catalog(tuple(out), kinds)


def _cache_dir() -> Path | None:
    """Where the built-in catalog's document is kept as JSON between runs ($XDG_CACHE_HOME/llmtriage, else
    ~/.cache/llmtriage); None without a home."""
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmtriage"
    except (RuntimeError, KeyError):
        return None


def builtin_document(raw: bytes, cache: Path | None):
    """The built-in catalog's YAML document: from its JSON copy in cache, named by a hash of the YAML (so an
    edited catalog is read afresh), else read from the YAML and copied there (reading the YAML costs a
    twentieth of a second at every start, its JSON copy a thousandth). A cache that cannot be read or written
    is passed by."""
    name = f"signatures-{hashlib.sha256(raw).hexdigest()[:32]}.json"
    if cache is not None:
        try:
            doc = orjson.loads((cache / name).read_bytes())
            if isinstance(doc, dict):
                return doc
        except (OSError, orjson.JSONDecodeError):
            pass
    doc = load_yaml(raw.decode("utf-8"), "triage/signatures.yaml")
    if cache is not None:
        try:
            data = orjson.dumps(doc)
            cache.mkdir(parents=True, exist_ok=True)
            for old in cache.glob("signatures-*.json"):  # (the copies of earlier catalogs)
                old.unlink(missing_ok=True)
            part = cache / f".{name}.{os.getpid()}"
            part.write_bytes(data)
            os.replace(part, cache / name)  # (whole or not at all, whoever reads it meanwhile)
        except (OSError, TypeError, orjson.JSONEncodeError):
            pass
    return doc


def _builtin() -> Catalog:
    # (beside this module: importlib.resources would cost a fiftieth of a second to import at every start)
    raw = Path(__file__).with_name("signatures.yaml").read_bytes()
    return parse_catalog(None, "triage/signatures.yaml", lazy=True, doc=builtin_document(raw, _cache_dir()))


BUILTIN = _builtin()
CATALOG: Catalog = BUILTIN  # what scan() uses: the built-in entries, then the user's (use_catalog)
SIGNATURES: tuple[Signature, ...] = BUILTIN.signatures


def load_user_catalog(path: str) -> Catalog:
    """The built-in catalog followed by the entries of the user's file; CatalogError when it cannot be used."""
    return extend_catalog(BUILTIN, path)


def extend_catalog(base: Catalog, path: str) -> Catalog:
    """base followed by the entries of the user's file at path; CatalogError when it cannot be used."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CatalogError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise CatalogError(f"{path}: is a folder, not a catalog file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read ({exc.strerror if isinstance(exc, OSError) else exc})") from exc
    user = parse_catalog(text, path, base.kinds, taken=(s.id for s in base))
    if not user.signatures:
        raise CatalogError(f"{path}: 'signatures' is empty")
    return Catalog(base.signatures + user.signatures, base.kinds)


def use_catalog(catalog: Catalog) -> None:
    """Makes scan() (and every reader of SIGNATURES) use catalog from now on."""
    global CATALOG, SIGNATURES
    CATALOG, SIGNATURES = catalog, catalog.signatures


def keywords() -> tuple[str, ...]:
    """The literal keywords of the catalog in use (every matching line holds one of them)."""
    return tuple(dict.fromkeys(s.keyword for s in SIGNATURES))


def scan(message: str, line: str | None = None) -> list[tuple[str, dict]]:
    """Every signature kind found in one message (entries with match_line: in the whole line), with the
    fields its pattern extracts. A line that matches a known message is no 'unrecognised' error."""
    found: list[tuple[str, dict]] = []
    kinds: set[str] = set()
    whole = message if line is None else line
    for s in SIGNATURES:
        text = whole if s.match_line else message
        if s.kind in kinds or s.keyword not in text:
            continue
        if s.kind == "log.error" and s.match_line and message[:1].isspace():
            continue  # an indented message continues a traceback or a block an error line began
        fields: dict = dict(s.fields)
        if s.pattern is not None:
            m = s.pattern.search(text)
            if m is None:
                continue
            for key, value in m.groupdict().items():
                if value is not None:
                    fields[_KEY_FIXUPS.get(key, key)] = value
        if s.kind != "signature":
            kinds.add(s.kind)
        found.append((s.kind, fields))
    if len(found) > 1 and "log.error" in kinds:  # explained by a known message: not unrecognised
        found = [item for item in found if item[0] != "log.error"]
    return found
