"""The usage history: one row per request (run, chat turn, batch request, bench result) in SQLite.

Lives in ``paths.data_dir()/history.db``. Writing happens after every request, so it is cheap
(one short transaction, WAL mode, no fsync per commit) and never breaks the command: a locked,
read-only or corrupt database gives one warning, through the caller's ``warn`` (the history never
prints), and the command goes on. Several processes may write at once (WAL + a busy timeout). No prompt or answer text is stored unless
``LOCALINFER_LOG_TEXT=1``; ``--no-log`` or ``LOCALINFER_NO_LOG=1`` turn recording off.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer import paths

if TYPE_CHECKING:
    import sqlite3


DB_NAME = "history.db"
SCHEMA_VERSION = 2  # 2: the endpoint column (NULL: a local request)
BUSY_TIMEOUT_MS = 3000
_TRUE = ("1", "true", "yes", "on")

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    command TEXT NOT NULL,
    model TEXT,
    model_sha256 TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    prompt_eval_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    ttft_ms REAL,
    prefill_tps REAL,
    decode_tps REAL,
    load_ms REAL,
    total_ms REAL,
    finish_reason TEXT,
    exit_status INTEGER NOT NULL DEFAULT 0,
    prompt_text TEXT,
    answer_text TEXT,
    extra TEXT,
    endpoint TEXT
)""",
    "CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts)",
)


@dataclass(frozen=True)
class UsageRecord:
    """One request as the history keeps it (times in ms, rates in tokens/s; docs/metrics.md)."""

    command: str  # run | chat | batch | bench
    model: str | None
    model_sha256: str | None = None
    prompt_tokens: int = 0
    prompt_eval_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None
    prefill_tps: float | None = None
    decode_tps: float | None = None
    load_ms: float | None = None
    total_ms: float | None = None
    finish_reason: str | None = None
    exit_status: int = 0
    prompt_text: str | None = None  # only with LOCALINFER_LOG_TEXT=1
    answer_text: str | None = None  # only with LOCALINFER_LOG_TEXT=1
    extra: dict[str, Any] | None = None  # e.g. bench: test name, threads, repetitions
    endpoint: str | None = None  # the server's base URL (--endpoint); None: run here
    ts: float = field(default_factory=time.time)  # seconds since the epoch (UTC)


_COLUMNS = tuple(f.name for f in fields(UsageRecord))


def db_path() -> Path:
    return paths.data_dir() / DB_NAME


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def logging_enabled(no_log: bool = False) -> bool:
    """Whether to record requests: not with ``--no-log`` or ``LOCALINFER_NO_LOG=1``."""
    return not no_log and not _truthy("LOCALINFER_NO_LOG")


def text_logging_enabled() -> bool:
    """Prompt and answer text are kept only when the user opts in (``LOCALINFER_LOG_TEXT=1``)."""
    return _truthy("LOCALINFER_LOG_TEXT")


def _connect(path: Path, *, create: bool) -> sqlite3.Connection:
    import sqlite3

    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000.0, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def _ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the table once (WAL mode is persistent; the version check makes later opens one read)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:
            for statement in _SCHEMA:
                conn.execute(statement)
            if version == 1:  # rows written before --endpoint existed were all local: endpoint NULL
                conn.execute("ALTER TABLE requests ADD COLUMN endpoint TEXT")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _row(record: UsageRecord) -> tuple:
    values = asdict(record)
    values["extra"] = json.dumps(values["extra"], separators=(",", ":")) if values["extra"] else None
    return tuple(values[c] for c in _COLUMNS)


def append(records: UsageRecord | Iterable[UsageRecord], *, warn: Callable[[str], None] | None = None) -> bool:
    """Add records in one transaction. Any failure is one call of ``warn`` (the caller shows it; None:
    nobody) and returns False, never an exception."""
    import sqlite3

    batch = [records] if isinstance(records, UsageRecord) else list(records)
    if not batch:
        return True
    path = db_path()
    rows = [_row(r) for r in batch]
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000.0
    while True:
        try:
            _insert(path, rows)
            return True
        except sqlite3.OperationalError as exc:
            # A busy error SQLite does not wait for itself (e.g. while another process sets up WAL).
            if ("locked" in str(exc) or "busy" in str(exc)) and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            error: Exception = exc
        except (sqlite3.Error, OSError, ValueError) as exc:
            error = exc
        if warn is not None:
            warn(f"could not record this request in the usage history ({path}): {error}")
        return False


def _insert(path: Path, rows: list[tuple]) -> None:
    conn = _connect(path, create=True)
    try:
        _ensure_schema(conn)
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, cheap commits
        placeholders = ", ".join("?" for _ in _COLUMNS)
        conn.execute("BEGIN IMMEDIATE")  # take the write lock first: the busy timeout applies to it
        try:
            conn.executemany(f"INSERT INTO requests ({', '.join(_COLUMNS)}) VALUES ({placeholders})", rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def exit_status_of(exc: BaseException | None) -> int:
    """The exit code the CLI will report for this exception (0 when there was none)."""
    if exc is None:
        return 0
    code = getattr(exc, "exit_code", None)  # typer.Exit / click exceptions
    if isinstance(code, int):
        return code
    if isinstance(exc, BrokenPipeError):
        return 141
    from localinfer.errors import exit_code_for

    return int(exit_code_for(exc))


def load_records(
    *, since: float | None = None, model: str | None = None, command: str | None = None, path: Path | None = None
) -> list[UsageRecord]:
    """Records in time order, filtered; an absent database is an empty history."""
    import sqlite3

    path = path or db_path()
    if not path.is_file():
        return []
    where, params = [], []
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if model:
        where.append("(model = ? OR model_sha256 = ?)")
        params.extend([model, model])
    if command:
        where.append("command = ?")
        params.append(command)
    clauses = (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY ts, id"
    try:
        conn = _connect(path, create=False)
        try:
            present = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
            # read without writing: a schema-1 history (no command wrote to it since) has no endpoint
            columns = [c if c in present or not present else f"NULL AS {c}" for c in _COLUMNS]
            rows = conn.execute(f"SELECT {', '.join(columns)} FROM requests{clauses}", params).fetchall()
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise _history_error(path, exc) from None
    except sqlite3.DatabaseError as exc:
        raise _history_error(path, exc) from None
    out = []
    for row in rows:
        values = dict(zip(_COLUMNS, row))
        if values["extra"]:
            try:
                values["extra"] = json.loads(values["extra"])
            except ValueError:
                values["extra"] = None
        out.append(UsageRecord(**values))
    return out


def _history_error(path: Path, exc: Exception) -> Exception:
    from localinfer.errors import LocalInferError

    return LocalInferError(
        f"cannot read the usage history {path}: {exc}",
        hint="if the file is damaged, move it away (a new history starts with the next request)",
    )
