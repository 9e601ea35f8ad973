"""Timestamps of every log family, parsed by slicing (fast) into naive UTC datetimes."""

from datetime import UTC, datetime, timedelta
from functools import lru_cache

_MONTHS = {m: i + 1 for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))}
DEFAULT_YEAR = datetime.now(UTC).year  # vLLM and syslog stamps carry no year


def _mk(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int = 0) -> datetime | None:
    try:
        return datetime(y, mo, d, h, mi, s, us)
    except ValueError:
        return None


def _frac(s: str) -> int:
    digits = ""
    for ch in s:
        if not ch.isdigit():
            break
        digits += ch
    return int((digits + "000000")[:6]) if digits else 0


def _from_iso_c(s: str) -> datetime | None:
    """datetime.fromisoformat (C) for the common shapes; the slicing parser for the rest (9-digit fractions)."""
    if s[-1:] == "Z" and len(s) >= 20 and s[13:14] == ":" and s[16:17] == ":":  # naive UTC in one C call
        try:
            dt = datetime.fromisoformat(s[:-1])
        except ValueError:
            dt = None
        if dt is not None and dt.tzinfo is None:
            return dt
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return _parse_iso(s)
    if dt.tzinfo is not None:
        offset = dt.utcoffset()
        dt = dt.replace(tzinfo=None) - offset if offset else dt.replace(tzinfo=None)
    return dt


def _parse_iso(s: str) -> datetime | None:
    """2026-11-29T19:40:01.123Z, 2026-11-29 19:40:01,123, with an optional offset."""
    if len(s) < 19 or s[4] != "-" or s[7] != "-" or s[13] != ":":
        return None
    try:
        ts = _mk(int(s[0:4]), int(s[5:7]), int(s[8:10]), int(s[11:13]), int(s[14:16]), int(s[17:19]))
    except ValueError:
        return None
    if ts is None:
        return None
    rest = s[19:]
    if rest[:1] in (".", ","):
        ts = ts.replace(microsecond=_frac(rest[1:]))
        rest = rest[1:].lstrip("0123456789")
    if len(rest) >= 6 and rest[0] in "+-" and rest[3] == ":":
        try:
            offset = timedelta(hours=int(rest[1:3]), minutes=int(rest[4:6]))
        except ValueError:
            return ts
        ts = ts - offset if rest[0] == "+" else ts + offset
    return ts


def parse_slash(s: str) -> datetime | None:
    """nginx error log: 2026/11/29 19:40:01 (local time, taken as UTC)."""
    try:
        return _mk(int(s[0:4]), int(s[5:7]), int(s[8:10]), int(s[11:13]), int(s[14:16]), int(s[17:19]))
    except ValueError:
        return None


def clf_order_key(s: str) -> str | None:
    """A CLF time ("29/Nov/2026:19:40:01 +0000") as "20261129194001", which sorts as the times do among
    times of one offset; None for a text of another shape."""
    month = _MONTHS.get(s[3:6])
    key = f"{s[7:11]}{month or 0:02d}{s[0:2]}{s[12:14]}{s[15:17]}{s[18:20]}"
    return key if month and len(key) == 14 and key.isdigit() else None


def _parse_clf(s: str) -> datetime | None:
    """Common log format: 29/Nov/2026:19:40:01 +0000."""
    try:
        ts = _mk(int(s[7:11]), _MONTHS[s[3:6]], int(s[0:2]), int(s[12:14]), int(s[15:17]), int(s[18:20]))
    except (ValueError, KeyError):
        return None
    if ts is not None and len(s) >= 26 and s[21] in "+-":
        try:
            offset = timedelta(hours=int(s[22:24]), minutes=int(s[24:26]))
        except ValueError:
            return ts
        ts = ts - offset if s[21] == "+" else ts + offset
    return ts


def parse_md_hms(md: str, hms: str, year: int = DEFAULT_YEAR) -> datetime | None:
    """vLLM: 05-21 21:11:56 (no year)."""
    try:
        return _mk(year, int(md[0:2]), int(md[3:5]), int(hms[0:2]), int(hms[3:5]), int(hms[6:8]))
    except ValueError:
        return None


def parse_syslog(s: str, year: int = DEFAULT_YEAR) -> datetime | None:
    """syslog: Nov 29 19:40:01."""
    try:
        return _mk(year, _MONTHS[s[0:3]], int(s[4:6]), int(s[7:9]), int(s[10:12]), int(s[13:15]))
    except (ValueError, KeyError):
        return None


def parse_glog(s: str, year: int = DEFAULT_YEAR) -> datetime | None:
    """Triton/glog: I0527 12:00:00.123456 -> month 05 day 27."""
    try:
        ts = _mk(year, int(s[1:3]), int(s[3:5]), int(s[6:8]), int(s[9:11]), int(s[12:14]))
    except ValueError:
        return None
    if ts is not None and s[14:15] == ".":
        ts = ts.replace(microsecond=_frac(s[15:]))
    return ts


def parse_user_time(s: str) -> datetime:
    """--since/--until: ISO-8601 (a date alone is midnight) or epoch seconds; ValueError otherwise."""
    s = s.strip()
    if not s:
        raise ValueError("not a time: an empty value (use ISO-8601 like 2026-11-29T19:40:00Z or epoch seconds)")
    try:
        seconds = float(s)
    except ValueError:
        pass
    else:
        try:
            return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
        except (ValueError, OverflowError, OSError) as exc:  # nan, inf, beyond the platform's time_t
            raise ValueError(f"not a time: {s!r} is out of range as epoch seconds") from exc
    if len(s) == 10:
        s += "T00:00:00"
    ts = parse_iso(s)
    if ts is None:
        raise ValueError(f"not a time: {s!r} (use ISO-8601 like 2026-11-29T19:40:00Z or epoch seconds)")
    return ts


# Cached: neighbouring log lines usually share their timestamp string (access-log lines of one second do).
parse_iso = lru_cache(maxsize=4096)(_from_iso_c)
parse_clf = lru_cache(maxsize=4096)(_parse_clf)
