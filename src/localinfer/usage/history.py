"""The usage history: one row per request (run, chat turn, batch request, bench result) in SQLite.

Lives in ``paths.data_dir()/history.db``. Writing happens after every request, so it is cheap
(one short transaction, WAL mode, no fsync per commit) and never breaks the command: a locked,
read-only or corrupt database gives one warning on stderr and the command goes on. Several
processes may write at once (WAL + a busy timeout). No prompt or answer text is stored unless
``LOCALINFER_LOG_TEXT=1``; ``--no-log`` or ``LOCALINFER_NO_LOG=1`` turn recording off.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer import paths

if TYPE_CHECKING:
    import sqlite3

    from localinfer.generate import Result
    from localinfer.store import ResolvedModel

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
    """One request as the history keeps it (times in ms, rates in tokens/s; README "Metrics")."""

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


def _warn(message: str) -> None:
    try:
        from localinfer.render.stats import warn

        warn(message)
    except Exception:  # noqa: BLE001 - the history must never break the command
        pass


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
    """Add records in one transaction. Any failure is a warning (returns False), never an exception."""
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
        (warn or _warn)(f"could not record this request in the usage history ({path}): {error}")
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


def record_from_result(
    command: str,
    result: Result | None,
    resolved: ResolvedModel | None,
    *,
    exit_status: int = 0,
    prompt_text: str | None = None,
    finish_reason: str | None = None,
    extra: dict[str, Any] | None = None,
) -> UsageRecord:
    """A record for one request from the core's Result (None: it failed before producing one)."""
    keep_text = text_logging_enabled()
    name = result.model if result is not None else (resolved.name if resolved is not None else None)
    sha = resolved.sha256 if resolved is not None else None
    if result is None:
        return UsageRecord(
            command=command,
            model=name,
            model_sha256=sha,
            finish_reason=finish_reason,
            exit_status=exit_status,
            prompt_text=prompt_text if keep_text else None,
            extra=extra,
        )
    s = result.stats
    return UsageRecord(
        command=command,
        model=name,
        model_sha256=sha,
        prompt_tokens=s.prompt_tokens,
        prompt_eval_tokens=s.evaluated_tokens,
        cached_tokens=s.cached_tokens,
        completion_tokens=s.completion_tokens,
        ttft_ms=_ms(result.ttft_s),
        prefill_tps=s.prefill_tps,
        decode_tps=s.decode_tps,
        load_ms=_ms(result.load_s) if result.load_s else None,
        total_ms=_ms(result.total_s),
        finish_reason=finish_reason or s.finish_reason,
        exit_status=exit_status,
        prompt_text=prompt_text if keep_text else None,
        answer_text=result.text if keep_text else None,
        extra=extra,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


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


@dataclass
class Recorder:
    """Filled in by a command as it goes; written when the command's ``with`` block ends."""

    command: str
    enabled: bool
    model: ResolvedModel | None = None  # set once a model is involved: only then is anything recorded
    result: Result | None = None
    prompt_text: str | None = None
    extra: dict[str, Any] | None = None


@contextlib.contextmanager
def recording(command: str, *, no_log: bool = False) -> Iterator[Recorder]:
    """Record the request when the block ends, successful or not (failed runs keep their exit status).

    Use inside the command's ``handle_errors()`` so it sees the original exception.
    """
    rec = Recorder(command=command, enabled=logging_enabled(no_log))
    exc_seen: BaseException | None = None
    try:
        yield rec
    except BaseException as exc:
        exc_seen = exc
        raise
    finally:
        if rec.enabled and rec.model is not None:
            status = exit_status_of(exc_seen)
            reason = None
            if exc_seen is not None and rec.result is None:
                reason = "interrupted" if isinstance(exc_seen, KeyboardInterrupt) else "error"
            try:
                append(
                    record_from_result(
                        command,
                        rec.result,
                        rec.model,
                        exit_status=status,
                        prompt_text=rec.prompt_text,
                        finish_reason=reason,
                        extra=rec.extra,
                    )
                )
            except Exception as exc:  # noqa: BLE001 - never let the history break the command
                _warn(f"could not record this request in the usage history: {exc}")


class RequestLog:
    """Records for a command that answers many requests (batch): one row per output record,
    written in one transaction every ``flush_every`` rows or ``flush_s`` seconds, and at the end.

    ``flush()`` in the command's ``finally`` also records a failed job (exit status != 0) when an
    exception is on its way out; ``wrap(write)`` passes each output record on and logs it.
    """

    def __init__(self, command: str, model: ResolvedModel, *, no_log: bool = False, extra: dict[str, Any] | None = None,
                 flush_every: int = 64, flush_s: float = 5.0) -> None:
        self.command, self.model, self.extra = command, model, extra
        self.enabled = logging_enabled(no_log)
        self.flush_every, self.flush_s = flush_every, flush_s
        self._pending: list[UsageRecord] = []
        self._last_flush = time.monotonic()
        self._count = 0

    def wrap(self, write: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        def logged(record: dict[str, Any]) -> None:
            write(record)
            self.add_json(record)

        return logged

    def add_json(self, record: dict[str, Any]) -> None:
        """One request's output record (``BatchResult.to_json()``): an answer or an error."""
        if not self.enabled:
            return
        try:
            self._pending.append(self._from_json(record))
        except (KeyError, TypeError, ValueError):  # an unexpected shape must not break the job
            return
        self._count += 1
        if len(self._pending) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_s:
            self._write()

    def _from_json(self, d: dict[str, Any]) -> UsageRecord:
        sha = self.model.sha256
        if d.get("error") is not None:
            extra = {**(self.extra or {}), "error": d["error"] if text_logging_enabled() else True}
            return UsageRecord(command=self.command, model=self.model.name, model_sha256=sha, exit_status=1, finish_reason="error", extra=extra)
        usage, t = d.get("usage") or {}, d.get("timings") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        prefill_ms = t.get("prefill_ms")
        return UsageRecord(
            command=self.command,
            model=self.model.name,
            model_sha256=sha,
            prompt_tokens=prompt,
            prompt_eval_tokens=prompt,
            completion_tokens=int(usage.get("completion_tokens") or 0),
            ttft_ms=t.get("ttft_ms"),
            prefill_tps=prompt / (prefill_ms / 1000.0) if prefill_ms and prompt else None,
            decode_tps=t.get("decode_tokens_per_s"),
            total_ms=t.get("total_ms"),
            finish_reason=d.get("finish_reason"),
            answer_text=d.get("text") if text_logging_enabled() else None,
            extra=self.extra,
        )

    def _write(self) -> None:
        batch, self._pending = self._pending, []
        self._last_flush = time.monotonic()
        if batch:
            append(batch)

    def flush(self) -> None:
        """Write what is pending; if the job is failing (called from ``finally``), record that too."""
        if not self.enabled:
            return
        exc = sys.exc_info()[1]
        if exc is not None:
            self._pending.append(
                UsageRecord(
                    command=self.command, model=self.model.name, model_sha256=self.model.sha256,
                    exit_status=exit_status_of(exc),
                    finish_reason="interrupted" if isinstance(exc, KeyboardInterrupt) else "error",
                    extra={**(self.extra or {}), "job": True},
                )
            )
        try:
            self._write()
        except Exception as err:  # noqa: BLE001 - never let the history break the command
            _warn(f"could not record these requests in the usage history: {err}")


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
