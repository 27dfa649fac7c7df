#!/usr/bin/env python3
"""CPU time (user + sys) of whole processes, A/B interleaved: what a loaded machine disturbs least.

Each argument is NAME=SHELL COMMAND; every round runs each once, the order reversed every other
round; reported: the median CPU time and wall time of each, and its per-round ratio to the first.
``--preload``: the commands are `localinfer run` argument lists, run up to the model's load only
(the process prints its CPU time there and exits): our start-up without llama.cpp's load and decode.

    M=.../SmolLM2-135M-Instruct.Q4_1.gguf; R="run --raw -m $M -t 1 -c 4096 -n 16 --temperature 0 --seed 42 -p Hi"
    .venv/bin/python benchmarks/startup_cpu_ab.py --rounds 20 \\
        "native=llama-completion -m $M -p Hi -n 16 -t 1 -tb 1 -c 4096 -no-cnv --temp 0 --seed 42 --no-warmup --repack" \\
        "base=PYTHONPATH=/tmp/base/src .venv/bin/python -m localinfer $R" "mine=PYTHONPATH=src .venv/bin/python -m localinfer $R"
    .venv/bin/python benchmarks/startup_cpu_ab.py --preload --rounds 30 "base=/tmp/base/src:$R" "mine=src:$R"
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

_HOOK = """import os, resource, sys
import localinfer.engine.model as em
def init(self, *a, **k):
    r = resource.getrusage(resource.RUSAGE_SELF)
    sys.stderr.write(f"PRELOAD {(r.ru_utime + r.ru_stime) * 1000:.2f}\\n"); sys.stderr.flush(); os._exit(0)
em.Model.__init__ = init
sys.argv = ["localinfer", *sys.argv[1:]]
import localinfer.cli.main as m
m.entry()
"""


def one(cmd: str, preload: bool) -> tuple[float, float]:
    """(CPU ms, wall ms) of one run."""
    if preload:
        src, args = cmd.split(":", 1)
        env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
        out = subprocess.run([sys.executable, "-c", _HOOK, *shlex.split(args)], capture_output=True, text=True, env=env)
        if "PRELOAD " not in out.stderr:
            raise SystemExit(f"{cmd}: {out.stderr[-2000:]}")
        return float(out.stderr.split("PRELOAD ")[1].split()[0]), 0.0
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1000, (t1 - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--preload", action="store_true")
    ap.add_argument("commands", nargs="+", help="NAME=COMMAND (with --preload: NAME=SRC_DIR:RUN ARGS)")
    args = ap.parse_args()
    cmds = [c.split("=", 1) for c in args.commands]
    cpu: dict[str, list[float]] = {n: [] for n, _ in cmds}
    wall: dict[str, list[float]] = {n: [] for n, _ in cmds}
    load0 = os.getloadavg()[0]
    for i in range(args.rounds):
        for name, cmd in cmds if i % 2 == 0 else cmds[::-1]:
            c, w = one(cmd, args.preload)
            cpu[name].append(c)
            wall[name].append(w)
    base = cmds[0][0]
    print(f"# {args.rounds} interleaved rounds, load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at the end")
    for name, _ in cmds:
        ratio = statistics.median(a / b for a, b in zip(cpu[name], cpu[base]))
        diff = statistics.median(a - b for a, b in zip(cpu[name], cpu[base]))
        print(f"{name:<10} CPU median {statistics.median(cpu[name]):7.1f} ms (min {min(cpu[name]):6.1f})"
              f"{'' if args.preload else f', wall median {statistics.median(wall[name]):7.1f} ms'}; vs {base}: "
              f"per-round ratio median {ratio:.3f}, difference median {diff:+.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
