"""How measure_gpu.py takes device and host time, and writes its tables."""

import csv
import os
import statistics
import time

import torch


class MeasureError(Exception):
    """A run that cannot give a usable table: measure_gpu.py prints it as one line and exits 1."""


class Timer:
    """Times device work: CUDA events and graphs on a GPU, wall clock on the CPU."""

    def __init__(self, device, repeats, warmup):
        self.device = device
        self.cuda = device == "cuda"
        self.repeats = repeats
        self.warmup = warmup

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def events(self, fn):
        """Median seconds of fn(), each call timed on its own with events."""
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.repeats):
            if self.cuda:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e-3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def graph(self, fn, count):
        """Median seconds per call of fn(i) for i in range(count), replayed back to back.

        fn must be capturable: it may launch kernels on tensors made beforehand, but must not
        make device tensors from host data (no torch.tensor(..., device='cuda') inside)."""
        count = max(2, count)
        if not self.cuda:
            return self.events(lambda: [fn(i) for i in range(count)]) / count
        # Warm-up on a side stream, as capture requires (lazy init, cuBLAS workspaces).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(max(2, self.warmup)):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(count):
                fn(i)
        return self.events(g.replay) / count

    def host(self, fn, count):
        """Host seconds per call of fn(), `count` calls without waiting for the device."""
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.repeats):
            t0 = time.perf_counter()
            for _ in range(count):
                fn()
            times.append((time.perf_counter() - t0) / count)
            self.sync()
        return statistics.median(times)


def calls_for(seconds_guess):
    """2 to 20 calls per graph: enough to hide the replay's own cost for small kernels."""
    if seconds_guess < 20e-6:
        return 20
    if seconds_guess < 200e-6:
        return 8
    return 2


def fmt(v, digits=4):
    return "%.*e" % (digits, v)


def fits(bytes_needed, cfg):
    return bytes_needed <= cfg.budget_bytes


class Tables:
    """Writes each table whole once it is measured (to a temporary name, then renamed), so an
    interrupted run keeps the tables it finished and leaves no half-written one."""

    def __init__(self, out):
        self.out = out
        os.makedirs(out, exist_ok=True)

    def write(self, name, header, rows):
        if not rows:
            # NodeEmu refuses a header-only table; say why here instead of there.
            raise MeasureError("%s: no rows measured (every shape was skipped: raise --memory-gib "
                               "or see the 'skipped' lines above)" % name)
        path = os.path.join(self.out, name)
        with open(path + ".tmp", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(header)
            w.writerows(rows)
        os.replace(path + ".tmp", path)
        print("wrote %s (%d rows)" % (path, len(rows)), flush=True)
