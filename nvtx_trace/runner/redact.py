"""Write a copy of an Nsight Systems export without the capturing machine's secrets.

Why: an export carries the profiled process's whole environment (three times:
the ``DeviceEnvironment`` row of ``TARGET_INFO_SYSTEM_ENV``, the
``PROCESS_n:ENVIRONMENT_VARIABLE`` rows of ``META_DATA_CAPTURE`` and
NUL-separated blocks in ``StringIds``, where SQLite's LIKE stops at the first
NUL), host and user names, absolute paths, the command line and the program's
captured stdout/stderr. Environments hold tokens, and users share reports.

What stays byte-identical, so every analysis result is unchanged: the event
tables (``CUPTI_*``, ``NVTX_*``, ``OSRT_API``, ...), ``ThreadNames``,
``ENUM_*``, ``ANALYSIS_DETAILS``, ``TARGET_INFO_GPU`` (all but ``uuid``), pids,
the metadata version keys, and every ``StringIds`` entry that an event table
references (kernel, API, NVTX and thread names), but for the paths nvtx_autotrace's own ranges carry (the
folder its settings record names, a ``file:line`` outside that folder), cut to basenames like every other
path: they name the user's home. Rows are replaced rather than
deleted wherever an id points at them; only environment rows of the metadata
tables, which nothing references, are deleted.

How: the input is opened read-only and immutable, copied with SQLite's backup
API to a temporary file beside OUT, edited there, VACUUMed (otherwise the old
text survives in free pages) and then moved onto OUT. Running it again on its
own output changes nothing (``RedactSummary.total == 0``).
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from nvtx_trace import names
from nvtx_trace.analyzer.trace.opening import open_export
from nvtx_trace.errors import BadReportError
from nvtx_trace.files import cannot_write, check_outputs

REDACTED = "[redacted]"

# Categories, in the order the summary prints them.
ENV = "environment variables"
HOST = "host and user names"
PATHS = "absolute paths"
ARGS = "command-line arguments"
OUTPUT = "captured program output"
IDS = "machine and session identifiers"
NET = "network addresses"
SECRET = "environment values found elsewhere"
CATEGORIES = (ENV, HOST, PATHS, ARGS, OUTPUT, IDS, NET, SECRET)

# Tables analyses read: never edited, and the strings they reference stay verbatim.
EVENT_PREFIXES = ("CUPTI_", "NVTX_", "CUDA_", "CUBLAS_", "CUDNN_", "OPENACC_", "OPENMP_", "MPI_", "UCX_",
                  "NCCL_", "OSRT_API", "PROFILER_OVERHEAD", "ThreadNames", "ENUM_", "ANALYSIS_DETAILS",
                  "UnwindMethodType")
# Columns that hold StringIds ids even where the schema comment does not say so.
NAME_ID_COLUMNS = {"nameId", "textId", "jsonTextId", "demangledName", "shortName", "mangledName"}
# StringIds references whose text is not a name but a path or the program's output.
OUTPUT_REFS = {("ProcessStreams", "contentId"), ("ANALYSIS_FILE", "contentId")}
PATH_REF_COLUMNS = {"filenameId", "module"}  # ProcessStreams.filenameId, *_CALLCHAINS.module

METADATA_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA", "META_DATA_CAPTURE")
KEEP_META = re.compile(r"^EXPORT_(PRODUCT|SCHEMA)_|^CAPTURE_EVENT_TYPE$")
META_RULES = (  # key pattern -> category of a value replaced whole
    (re.compile(r"ARGUMENT"), ARGS),
    (re.compile(r"HOST|USER|DISPLAY_NAME"), HOST),
    (re.compile(r"WORKING_DIR"), PATHS),
    (re.compile(r"UUID|SESSION_ID"), IDS),
)
SYSTEM_ENV_RULES = {"DeviceEnvironment": ENV, "Hostname": HOST, "SystemUID": IDS, "NicInfo": NET}

_REF = re.compile(r"^\s*(\w+)\s+\w+[^\n]*REFERENCES\s+StringIds\s*\(", re.M)
_ENV_START = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASS|KEY|AUTH|CRED|COOKIE|SESSION|PRIVATE|SIGNATURE|DSN|WEBHOOK", re.I)
# nvtx_autotrace's ranges that may carry a path of the user's: the settings record's folder, lines of syncs,
# copies and DataLoader creation sites outside that folder
PATH_CARRYING_RANGES = (names.SETTINGS_PREFIX, names.SYNC_PREFIX, names.H2D_COPY_PREFIX, names.LOADER_WAIT_PREFIX,
                        names.WORKER_FETCH_PREFIX, names.MEMORY_LINES_PREFIX, names.OOM_PREFIX)
_UNIX_PATH = re.compile(r"(?<![\w.~/-])(?:/[\w.+~@%-]+)+/?")
_FILE_URL = re.compile(r"\bfile://(?:localhost)?((?:/[^\s'\"<>/]+)+/?)")  # file:///home/dave/x.py
_TILDE_PATH = re.compile(r"(?<![\w.~/-])~[\w.-]*(?:/[\w.+~@%-]+)+/?")  # ~erin/scripts/run.py
# in nvtx_autotrace's own ranges, a file named from a folder whose names hold spaces: "user name/my proj/t.py:1"
_SPACED_PATH = re.compile(r"(?:(?<= at )|(?<=\[)|(?<=\"))(?:[\w.+~@%-]+(?: [\w.+~@%-]+)*/)+(?=[\w.+~@%-]+\.py\b)")
_HOME = re.compile(r"^(?:/home|/Users)/[^/]+/?$")  # a home folder itself: its basename is the user's name
_WIN_PATH = re.compile(r"\b[A-Za-z]:\\(?:[^\\\s'\"<>|:;]+\\)*([^\\\s'\"<>|:;]*)")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w.-])")
_MAC = re.compile(r"(?<![\w:-])[0-9A-Fa-f]{2}(?:([:-])[0-9A-Fa-f]{2})(?:\1[0-9A-Fa-f]{2}){4}(?![\w:-])")
NULL_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass
class RedactSummary:
    """What ``redact`` changed: cells replaced (or metadata rows deleted), per category."""

    report: Path
    out: Path
    counts: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        if not self.total:
            return ["Nothing to redact (already clean)."]
        lines = ["Redacted (values replaced or rows removed, by kind):"]
        lines += [f"  {cat:<36} {n:>6}" for cat in CATEGORIES if (n := self.counts.get(cat))]
        return lines


def redact(report, out, force: bool = False) -> RedactSummary:
    """Write ``out``: ``report`` without environments, names, paths, arguments or program output."""
    report, out = Path(report), Path(out)
    source = _open_export(report)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.redact-tmp")
    summary = RedactSummary(report=report, out=out)
    try:
        _check_paths(report, out, force)
        tmp.unlink(missing_ok=True)
        dest = sqlite3.connect(tmp)
        try:
            source.backup(dest)
            source.close()
            dest.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, whatever the input used
            dest.execute("PRAGMA secure_delete=ON")
            with dest:
                _Redactor(dest, summary.counts).run()
            dest.execute("VACUUM")  # rebuilds every page: the removed text is gone from the file too
        finally:
            dest.close()
        os.replace(tmp, out)
    except sqlite3.DatabaseError as exc:
        if _writing_failed(exc):  # the copy could not be written: the output's fault, not the input's
            raise cannot_write(out, OSError(errno.ENOSPC if _full(exc) else errno.EIO, str(exc))) from None
        raise BadReportError(f"{report}: cannot be copied and redacted ({exc}); export it again") from None
    except OSError as exc:
        raise cannot_write(out, exc) from None
    finally:
        source.close()
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):  # nothing half-written stays behind
            try:
                leftover.unlink(missing_ok=True)
            except OSError:
                pass
    return summary


# SQLite's primary result codes for a copy that could not be written (SQLITE_FULL, _IOERR, _READONLY, _CANTOPEN,
# _PERM): the input is opened read-only, so these come from the output.
_WRITE_FAILURES = {13: "full", 10: "I/O error", 8: "read-only", 14: "cannot open", 3: "permission denied"}


def _writing_failed(exc: sqlite3.DatabaseError) -> bool:
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF in _WRITE_FAILURES


def _full(exc: sqlite3.DatabaseError) -> bool:
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == 13


def _check_paths(report: Path, out: Path, force: bool) -> None:
    check_outputs([out], [report], force)


def _open_export(path: Path) -> sqlite3.Connection:
    return open_export(path)[0]


def _basename(match: re.Match) -> str:
    text = match.group(0)
    if _HOME.match(text):
        return "~"  # a home folder's own name is its user's
    return re.split(r"[/\\]", text.rstrip("/\\"))[-1] or REDACTED


def _url_basename(match: re.Match) -> str:
    return "file://" + _basename(re.match(r".*", match.group(1)))


def parse_environment(text: str) -> dict[str, str]:
    """``KEY=VALUE`` pairs of an environment block (NUL-, ';'- or newline-separated, values maybe quoted)."""
    sep = "\x00" if "\x00" in text else ("\n" if "\n" in text else ";")
    env = {}
    for item in text.split(sep):
        key, eq, value = item.partition("=")
        if eq and _ENV_START.match(item):
            env[key] = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    return env


class _Scrubber:
    """Rewrites free text: paths to basenames, UUIDs, IP/MAC addresses and known secret values out."""

    def __init__(self, env: dict[str, str], hosts: set[str], gpu_uuids: dict[str, str]):
        self.gpu_uuids = {u.lower(): p for u, p in gpu_uuids.items()}
        self.exact = {h for h in hosts if h and h != REDACTED}  # short names: only whole cells
        tokens: dict[str, str] = {h: HOST for h in self.exact if len(h) >= 4}
        home = env.get("HOME", "")
        if re.match(r"^(/home|/Users)/[^/]+", home):
            tokens.setdefault(home.rstrip("/").rsplit("/", 1)[-1], HOST)
        for key, value in env.items():
            if "/" in value or value == REDACTED:
                continue  # paths are cut to basenames anyway
            if key in ("USER", "LOGNAME", "HOSTNAME") and len(value) >= 3:
                tokens.setdefault(value, HOST)
            elif (_SECRET_NAME.search(key) and len(value) >= 4) or len(value) >= 12:
                tokens.setdefault(value, SECRET)
        self.tokens = tokens
        alts = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
        self.token_re = re.compile(rf"(?<![A-Za-z0-9_])(?:{alts})(?![A-Za-z0-9_])") if tokens else None

    def paths(self, text: str, hits: set, spaced: bool = False) -> str:
        new = _FILE_URL.sub(_url_basename, text)
        new = _WIN_PATH.sub(_basename, _UNIX_PATH.sub(_basename, _TILDE_PATH.sub(_basename, new)))
        if spaced:  # nvtx_autotrace's own ranges, whose file:line format is known: folders named with spaces go
            new = _SPACED_PATH.sub(lambda m: "" if " " in m.group(0) else m.group(0), new)
        if new != text:
            hits.add(PATHS)
        return new

    def text(self, text: str) -> tuple[str, set]:
        hits: set = set()
        if text in self.exact:
            return REDACTED, {HOST}
        new = self.paths(text, hits)
        for regex, cat, repl in ((_UUID, IDS, self._uuid), (_MAC, NET, REDACTED), (_IPV4, NET, REDACTED)):
            newer = regex.sub(repl, new)
            if newer != new:
                hits.add(cat)
            new = newer
        if self.token_re is not None:
            def token(m: re.Match) -> str:
                hits.add(self.tokens[m.group(0)])
                return REDACTED
            new = self.token_re.sub(token, new)
        return new, (hits if new != text else set())

    def _uuid(self, match: re.Match) -> str:
        return self.gpu_uuids.get(match.group(0).lower(), NULL_UUID)


def _gpu_placeholder(gpu_id) -> str:
    return f"00000000-0000-0000-0000-{int(gpu_id or 0):012d}"


class _Redactor:
    """The rules, applied in place to the copy: one method per kind of place."""

    def __init__(self, db: sqlite3.Connection, counts: Counter):
        self.db, self.counts = db, counts
        self.tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        self.sql = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall())

    def columns(self, table: str) -> list[tuple[str, str]]:
        return [(r[1], (r[2] or "").upper()) for r in self.db.execute(f'PRAGMA table_info("{table}")')]

    def has(self, table: str, *cols: str) -> bool:
        return table in self.sql and set(cols) <= {c for c, _ in self.columns(table)}

    def run(self) -> None:
        env, hosts = self._collect_secrets()
        gpu_uuids = self._gpu_uuids()
        self.scrub = _Scrubber(env, hosts, gpu_uuids)
        self._metadata()
        self._system_env()
        self._strings()
        if self.has("NVTX_EVENTS", "text"):  # older exports keep range names inline
            self._rewrite("NVTX_EVENTS", "text", self._autotrace_paths)
        if self.has("PROCESSES", "name"):  # process names are analysis data: only paths become basenames
            self._rewrite("PROCESSES", "name", self._path_only)
        for table in self.tables:
            if table in ("StringIds", "PROCESSES", "TARGET_INFO_GPU", "TARGET_INFO_SYSTEM_ENV", *METADATA_TABLES) \
                    or table.startswith(EVENT_PREFIXES):
                continue
            for col, ctype in self.columns(table):
                if "TEXT" in ctype or ctype in ("", "VARCHAR", "STRING"):
                    self._rewrite(table, col, self.scrub.text)

    def _autotrace_paths(self, value: str) -> tuple[str, set]:
        """nvtx_autotrace's ranges that carry the user's paths: only those paths become basenames."""
        if not value.startswith(PATH_CARRYING_RANGES):
            return value, set()
        return self._path_only(value)

    def _path_only(self, value: str) -> tuple[str, set]:
        hits: set = set()
        return self.scrub.paths(value, hits, spaced=value.startswith(PATH_CARRYING_RANGES)), hits

    # -- gathering what to look for ---------------------------------------------
    def _collect_secrets(self) -> tuple[dict[str, str], set[str]]:
        env: dict[str, str] = {}
        hosts: set[str] = set()
        if self.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            for name, value in self.db.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV "
                                               "WHERE name IN ('DeviceEnvironment', 'Hostname')"):
                if name == "Hostname":
                    hosts.add(str(value or ""))
                else:
                    env.update(parse_environment(str(value or "")))
        for table in METADATA_TABLES:
            if self.has(table, "name", "value"):
                for key, value in self.db.execute(f"SELECT name, value FROM {table}"):
                    if "ENVIRONMENT" in key:
                        env.update(parse_environment(str(value or "")))
                    elif re.search(r"HOST|USER|DISPLAY_NAME", key) and not KEEP_META.search(key):
                        hosts.add(str(value or ""))
        for (value,) in self.db.execute("SELECT value FROM StringIds"):
            if isinstance(value, str) and _ENV_START.match(value):
                env.update(parse_environment(value))
        hosts |= {env.get(k, "") for k in ("HOSTNAME", "USER", "LOGNAME")}
        hosts.discard("")
        return env, hosts

    def _gpu_uuids(self) -> dict[str, str]:
        """Replace each GPU's uuid (a hardware serial) by a placeholder that stays distinct per GPU id."""
        if not self.has("TARGET_INFO_GPU", "uuid", "id"):
            return {}
        found = {}
        for gpu_id, uuid in self.db.execute("SELECT DISTINCT id, uuid FROM TARGET_INFO_GPU WHERE uuid != ''"):
            placeholder = _gpu_placeholder(gpu_id)
            found.update({u: placeholder for u in _UUID.findall(str(uuid))})
            if uuid != placeholder:
                self.counts[IDS] += self.db.execute("UPDATE TARGET_INFO_GPU SET uuid = ? WHERE id IS ? AND uuid = ?",
                                                    (placeholder, gpu_id, uuid)).rowcount
        return found

    # -- places -------------------------------------------------------------------
    def _metadata(self) -> None:
        for table in METADATA_TABLES:
            if not self.has(table, "name", "value"):
                continue
            self.counts[ENV] += self.db.execute(
                f"DELETE FROM {table} WHERE instr(name, 'ENVIRONMENT') > 0").rowcount

            def rule(key: str, value: str) -> tuple[str, set]:
                if KEEP_META.search(key):
                    return value, set()
                for pattern, cat in META_RULES:
                    if pattern.search(key):
                        return (REDACTED, {cat}) if value not in ("", REDACTED) else (value, set())
                return self.scrub.text(value)
            self._rewrite(table, "value", rule, key="name")

    def _system_env(self) -> None:
        if not self.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            return

        def rule(name: str, value: str) -> tuple[str, set]:
            cat = SYSTEM_ENV_RULES.get(name)
            if cat is None:
                return self.scrub.text(value)
            if value in ("", "{}", REDACTED):
                return value, set()
            return REDACTED, {cat}
        self._rewrite("TARGET_INFO_SYSTEM_ENV", "value", rule, key="name")

    def _strings(self) -> None:
        """StringIds: names stay, program output goes, paths shrink, environment blocks go."""
        keep, output, paths = set(), set(), set()
        for table in self.tables:
            if table == "StringIds" or table.startswith("ENUM_"):
                continue
            cols = {c for c, _ in self.columns(table)}
            refs = set(_REF.findall(self.sql.get(table) or "")) & cols
            if table.startswith(EVENT_PREFIXES):
                refs |= NAME_ID_COLUMNS & cols
            for col in refs:
                ids = {r[0] for r in self.db.execute(f'SELECT DISTINCT "{col}" FROM "{table}" WHERE "{col}" IS NOT NULL')}
                if (table, col) in OUTPUT_REFS:
                    output |= ids
                elif col in PATH_REF_COLUMNS:
                    paths |= ids
                elif table.startswith(EVENT_PREFIXES) or table.endswith("_CALLCHAINS"):
                    keep |= ids
        updates = []
        for sid, value in self.db.execute("SELECT id, value FROM StringIds"):
            if not isinstance(value, str):
                continue
            if sid in keep:
                new, hits = self._autotrace_paths(value)
                if new != value:
                    updates.append((new, sid))
                    self.counts.update(hits)
                continue
            if sid in output:
                new, hits = (REDACTED, {OUTPUT}) if value not in ("", REDACTED) else (value, set())
            elif _ENV_START.match(value):
                new, hits = REDACTED, {ENV}
            else:
                new, hits = self.scrub.text(value)
            if new != value:
                updates.append((new, sid))
                self.counts.update(hits)
        self.db.executemany("UPDATE StringIds SET value = ? WHERE id = ?", updates)

    def _rewrite(self, table: str, col: str, rule, key: str | None = None) -> None:
        """Apply ``rule`` to every distinct text value of one column (with its row's ``key`` when given)."""
        sel = f'SELECT DISTINCT "{key}", "{col}"' if key else f'SELECT DISTINCT NULL, "{col}"'
        rows = self.db.execute(f'{sel} FROM "{table}" WHERE typeof("{col}") = \'text\'').fetchall()
        for k, value in rows:
            new, hits = rule(k, value) if key else rule(value)
            if new == value:
                continue
            where = f'"{col}" = ?' + (f' AND "{key}" IS ?' if key else "")
            n = self.db.execute(f'UPDATE "{table}" SET "{col}" = ? WHERE {where}',
                                (new, value, k) if key else (new, value)).rowcount
            for cat in hits:
                self.counts[cat] += n
