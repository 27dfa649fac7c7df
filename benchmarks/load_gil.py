#!/usr/bin/env python3
"""What loading a model costs the serving process's other threads (issue 38), measured so that it
does not depend on how fast or busy the machine is: the time the loading thread holds the GIL.

A ticker thread sleeps 1 ms in a loop and records how late it wakes: a wake-up later than the
sleep needs the GIL, so its lateness is (to within the OS's timer slack, measured idle first) time
another thread held the GIL. While it ticks, a model loads through the path ``serve`` uses
(``serve.models.multi.Served._make``: pre-flight, llama.cpp load, template, engine start). Each late tick
is charged to where the loading thread stands when the ticker gets the GIL back (its innermost
localinfer frame), which says which parts of a load are Python holding the GIL. Also: the loading
thread's CPU time, the whole process's CPU time (more than the loader's: llama.cpp's own threads),
and the most threads alive. Before each load the ticker runs as long with nothing loading: on a
busy machine it wakes late for want of a CPU too, and that lateness is no GIL's.

    .venv/bin/python benchmarks/load_gil.py                 # gemma (the test package's), 3 loads
    .venv/bin/python benchmarks/load_gil.py --loads 5 -t 1
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
SLEEP_S = 0.001


class Ticker(threading.Thread):
    """Sleeps 1 ms again and again; sums how late it wakes, charged to the watched thread's frame."""

    def __init__(self, slack_s: float) -> None:
        super().__init__(daemon=True)
        self.slack_s, self.watch = slack_s, None
        self.total = self.longest = 0.0
        self.ticks = 0
        self.where: collections.Counter[str] = collections.Counter()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t0 = time.perf_counter()
            time.sleep(SLEEP_S)
            late = time.perf_counter() - t0 - SLEEP_S - self.slack_s
            self.ticks += 1
            if late > 0:
                self.total += late
                self.longest = max(self.longest, late)
                if late > 0.0005 and self.watch is not None:
                    self.where[_place(sys._current_frames().get(self.watch))] += late


def _place(frame) -> str:
    """The innermost localinfer frame (and the frame itself when it is elsewhere)."""
    inner, ours = frame, None
    while frame is not None:
        if "localinfer" in frame.f_code.co_filename and ours is None:
            ours = frame
        frame = frame.f_back
    if inner is None:
        return "(not running Python)"
    name = lambda f: f"{Path(f.f_code.co_filename).stem}.{f.f_code.co_name}:{f.f_lineno}"  # noqa: E731
    return name(ours) if ours is inner or ours is None else f"{name(ours)} <- {name(inner)}"


class CTime:
    """The loading thread's CPU time inside llama.cpp's C functions (ctypes lets the GIL go around
    each), less the Python log callbacks they call back (which take it again): the loader's CPU
    time less this is the CPU time it held the GIL for - a count that no busy machine inflates."""

    def __init__(self) -> None:
        self.loader: int | None = None
        self.c_cpu = self.callback_cpu = 0.0
        self.calls = 0
        self.by_name: collections.Counter[str] = collections.Counter()  # C function -> CPU time in it

    def install(self) -> None:
        import ctypes

        from localinfer.engine import backend

        module = backend.llama_cpp
        for name in dir(module):
            f = getattr(module, name)
            if isinstance(f, ctypes._CFuncPtr):
                setattr(module, name, self._timed(f, callback=False, name=name))
        backend.LlamaLog._on_log = self._timed(backend.LlamaLog._on_log, callback=True, name="log callback")  # before the first load makes it

    def _timed(self, f, *, callback: bool, name: str):
        def timed(*args):
            if threading.get_ident() != self.loader:
                return f(*args)
            t0 = time.thread_time()
            try:
                return f(*args)
            finally:
                spent = time.thread_time() - t0
                self.by_name[name] += spent
                if callback:
                    self.callback_cpu += spent
                else:
                    self.c_cpu += spent
                    self.calls += 1

        return timed


class Decoder(threading.Thread):
    """A model decoding on its own thread (greedy, no end): when each token came, wall and CPU time."""

    def __init__(self, model) -> None:
        super().__init__(daemon=True)
        self.model, self.done, self.marks = model, threading.Event(), []

    def run(self) -> None:
        from localinfer.engine.types import GenerationStats
        from localinfer.request.sampling import SamplingOptions

        while not self.done.is_set():
            prompt = self.model.tokenize("Once upon a time, in a land far away,")
            for _ in self.model.generate(prompt, SamplingOptions(temperature=0.0), GenerationStats(), max_tokens=3000, ignore_eos=True):
                self.marks.append((time.perf_counter(), time.thread_time()))
                if self.done.is_set():
                    return

    def rates(self, start: float, end: float) -> list[tuple[float, float]]:
        """(wall, CPU) seconds per token before ``start`` and between ``start`` and ``end``."""
        out = []
        for lo, hi in ((0.0, start), (start, end)):
            m = [x for x in self.marks if lo <= x[0] <= hi][1:]
            out.append(((m[-1][0] - m[0][0]) / (len(m) - 1), (m[-1][1] - m[0][1]) / (len(m) - 1)))
        return out


def slack() -> float:
    """How late a 1 ms sleep wakes with nothing else running (the OS's timer slack)."""
    lates = []
    for _ in range(300):
        t0 = time.perf_counter()
        time.sleep(SLEEP_S)
        lates.append(time.perf_counter() - t0 - SLEEP_S)
    return statistics.median(lates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--threads", "-t", type=int, default=2)
    parser.add_argument("--model", default="gemma", choices=("gemma", "smol"))
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--beside", action="store_true",
                        help="smol decodes (-t 1, on its own thread) while each load runs: its wall and CPU time per token, "
                             "before the load and during it")  # fmt: skip
    parser.add_argument("--no-repack", action="store_true", help="load without repacking the weights (--cpu-repack off)")
    args = parser.parse_args()
    import models

    home = Path(tempfile.mkdtemp(prefix="load-gil-"))
    os.environ.update(LOCALINFER_HOME=str(home), HF_HUB_OFFLINE="1")
    path = models.gemma_path() if args.model == "gemma" else models.smollm2_path()
    subprocess.run([sys.executable, "-m", "localinfer", "pull", str(path), "--name", args.model], check=True, capture_output=True)

    import psutil

    from localinfer.engine.types import LoadOptions
    from localinfer.serve.config import ServeConfig
    from localinfer.serve.models.multi import Served
    from localinfer.serve.models.pool import Want

    served = Served(ServeConfig(parallel=2, no_log=True), LoadOptions(n_threads=args.threads, n_threads_batch=args.threads,
                                                                       cpu_repack=False if args.no_repack else None))
    served.hub = type("Hub", (), {"flush": staticmethod(lambda: None)})()
    found, resolved = served.resolve(args.model)
    want = Want(key=str(resolved.path), options={}, sequences=2, ctx_per_seq=1024)
    proc = psutil.Process()
    ctime = CTime()
    ctime.install()
    print(f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs); timer slack {slack() * 1e6:.0f} us; -t {args.threads}")
    rows, idle, decodes = [], [], []
    beside = None
    if args.beside:
        from localinfer.generate import loading
        from localinfer.store import resolve_model

        subprocess.run([sys.executable, "-m", "localinfer", "pull", str(models.smollm2_path()), "--name", "smol"], check=True, capture_output=True)
        beside = loading.load(resolve_model("smol", offline=True, auto_pull=False), LoadOptions(n_ctx=4096, n_threads=1, n_threads_batch=1)).model
    for i in range(args.loads + 1):  # the first load also imports and starts the backend: reported apart
        if rows:  # the same ticker as long as the last load, nothing loading: the machine's own lateness
            quiet = Ticker(slack())
            quiet.start()
            time.sleep(rows[-1][0])
            quiet.done.set()
            quiet.join()
            idle.append(quiet.total)
        ticker = Ticker(slack())
        out: dict[str, float] = {}
        peak = [0]

        ctime.c_cpu = ctime.callback_cpu = 0.0
        if i == 1:
            ctime.by_name.clear()

        def load() -> None:
            ctime.loader = threading.get_ident()
            c0 = time.thread_time()
            out["model"] = served._make(resolved, found, want)
            out["thread_cpu"] = time.thread_time() - c0

        loader = threading.Thread(target=load)
        decoder = Decoder(beside) if beside is not None and i > 0 else None
        if decoder is not None:
            decoder.start()
            time.sleep(1.0)
            t_start = time.perf_counter()
        ticker.start()
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
        loader.start()
        ticker.watch = loader.ident
        while loader.is_alive():
            peak[0] = max(peak[0], proc.num_threads())
            time.sleep(0.01)
        wall, cpu = time.perf_counter() - t0, sum(proc.cpu_times()[:2]) - cpu0
        ticker.done.set()
        ticker.join()
        if decoder is not None:
            t_end = time.perf_counter()
            time.sleep(0.3)
            decoder.done.set()
            decoder.join()
            decodes.append(decoder.rates(t_start, t_end))
        python = out["thread_cpu"] - ctime.c_cpu + ctime.callback_cpu
        label = "first (imports)" if i == 0 else f"load {i}"
        print(f"{label:16} wall {wall:6.3f} s  loader CPU {out['thread_cpu']:6.3f} s  process CPU {cpu:6.3f} s  "
              f"Python (CPU) {python * 1e3:6.1f} ms, of it log callbacks {ctime.callback_cpu * 1e3:5.1f} ms; "
              f"ticker: GIL held {ticker.total * 1e3:7.1f} ms ({ticker.total / wall:5.1%} of the load), longest {ticker.longest * 1e3:5.1f} ms, "
              f"threads <= {peak[0]}" + (f"; idle as long: {idle[-1] * 1e3:.1f} ms late" if i else ""))  # fmt: skip
        if decoder is not None:
            b, d = decodes[-1]
            print(f"  beside it, smol: per token before the load {b[0] * 1e3:5.1f} ms wall, {b[1] * 1e3:5.1f} ms CPU; "
                  f"during {d[0] * 1e3:5.1f} ms wall, {d[1] * 1e3:5.1f} ms CPU (tok/s ratio {b[0] / d[0]:.2f}, CPU per token ratio {d[1] / b[1]:.2f})")  # fmt: skip
        out["model"].stop()
        rows.append((wall, out["thread_cpu"], cpu, ticker.total, ticker.longest, peak[0], ticker.where, python, ctime.callback_cpu))
    where: collections.Counter[str] = collections.Counter()
    for row in rows[1:]:
        where.update(row[6])
    n = max(1, len(rows) - 1)
    print(f"\nmedian of {n} loads: wall {statistics.median(r[0] for r in rows[1:]):.3f} s, "
          f"loader CPU {statistics.median(r[1] for r in rows[1:]):.3f} s, Python holding the GIL (CPU) "
          f"{statistics.median(r[7] for r in rows[1:]) * 1e3:.1f} ms, "
          f"GIL held {statistics.median(r[3] for r in rows[1:]) * 1e3:.1f} ms, longest {statistics.median(r[4] for r in rows[1:]) * 1e3:.1f} ms; "
          f"idle as long {statistics.median(idle) * 1e3:.1f} ms late")  # fmt: skip
    if decodes:
        print(f"smol beside the loads: median tok/s during / before {statistics.median(b[0] / d[0] for b, d in decodes):.2f}, "
              f"CPU per token during / before {statistics.median(d[1] / b[1] for b, d in decodes):.2f}")  # fmt: skip
    print("where the loader stood when a late tick got the GIL back (ms per load):")
    for place, late in where.most_common(args.top):
        print(f"  {late / n * 1e3:7.1f}  {place}")
    print("the loader's CPU time in llama.cpp's C functions (ms per load, all loads but the first):")
    for place, spent in ctime.by_name.most_common(4):
        print(f"  {spent / n * 1e3:7.1f}  {place}")
    print("the first load (imports, the backend's start, first template compile):")
    for place, late in rows[0][6].most_common(args.top):
        print(f"  {late * 1e3:7.1f}  {place}")
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
