"""Contention tables: a GEMM beside kernels that hold SMs, and beside D2D and PCIe copies."""

import ctypes
import statistics
import threading
import time

import torch

from .timing import fmt
from .transfer_tables import host_buffer

# The spinning kernels must outlast the GEMMs by a wide margin: they are launched first, and a
# GEMM that outlives them would run its tail on a free GPU and read as less slowed than it is.
SLEEP_MARGIN = 4.0


def contention_tables(t, cfg, tables):
    dt, dev = cfg.dtype, cfg.device
    m, n, k, reps = cfg.contention_gemm
    a = torch.randn(m, k, dtype=dt, device=dev)
    b = torch.randn(n, k, dtype=dt, device=dev)

    def gemms():
        for _ in range(reps):
            torch.mm(a, b.t())

    alone = t.events(gemms)
    name = "gemm_alone_%dx_%dx%dx%d" % (reps, m, n, k)
    rows = [[name, "", fmt(alone), "1.0"]]
    spinners = SpinningStreams(max(cfg.sms_held)) if cfg.device == "cuda" else None
    for held in cfg.sms_held:
        if cfg.device == "cuda":
            cycles = int(alone * SLEEP_MARGIN * sleep_cycles_per_second(t))
            s = gemm_beside_sleepers(t, gemms, spinners.streams[:held], cycles)
        else:
            threads = torch.get_num_threads()
            torch.set_num_threads(max(1, threads - round(threads * held / cfg.sms)))
            s = t.events(gemms)
            torch.set_num_threads(threads)
        rows.append(["gemm_with_sms_held", held, fmt(s), "%.4g" % (s / alone)])
    if spinners:
        spinners.close()
    tables.write("sm_contention.csv", ["case", "sms_held_by_other_kernel", "seconds", "slowdown"],
                 rows)

    size = cfg.copy_contention_bytes
    src = torch.randn(size // 2, dtype=dt, device=dev)
    dst = torch.empty_like(src)

    def copies():
        for _ in range(cfg.copy_reps):
            dst.copy_(src)

    copies_alone = t.events(copies)
    gemm_with, copies_with = together(t, cfg, gemms, copies)
    hin, hout = host_buffer(size // 2, True, cfg), host_buffer(size // 2, True, cfg)
    gin = torch.empty(size // 2, dtype=torch.uint8, device=dev)
    gout = torch.empty(size // 2, dtype=torch.uint8, device=dev)

    def pcie():
        gin.copy_(hin, non_blocking=True)
        hout.copy_(gout, non_blocking=True)

    gemm_with_pcie, _ = together(t, cfg, gemms, pcie)
    mib = size / (1 << 20)
    # In this order: NodeEmu's calibrate reads the three cases by position.
    rows = [
        ["gemm %dx %dx%dx%d beside %dx %g MiB D2D copies" % (reps, m, n, k, cfg.copy_reps, mib),
         fmt(alone), fmt(gemm_with), "%.4g" % (gemm_with / alone)],
        ["%dx %g MiB D2D copies beside the gemms" % (cfg.copy_reps, mib), fmt(copies_alone),
         fmt(copies_with), "%.4g" % (copies_with / copies_alone)],
        ["gemm %dx %dx%dx%d beside %g MiB H2D + %g MiB D2H pinned" % (reps, m, n, k, mib / 2,
                                                                      mib / 2),
         fmt(alone), fmt(gemm_with_pcie), "%.4g" % (gemm_with_pcie / alone)],
    ]
    tables.write("overlap_contention.csv",
                 ["case", "alone_seconds", "together_seconds", "slowdown"], rows)


def sleep_cycles_per_second(t):
    """How many torch.cuda._sleep cycles make a second on this GPU, timed."""
    cycles = 10_000_000
    return cycles / t.events(lambda: torch.cuda._sleep(cycles))


class SpinningStreams:
    """`count` distinct streams for the spinning kernels. PyTorch's torch.cuda.Stream() hands out
    streams from a pool of 32 per priority (c10 getStreamFromPool), and kernels that share a stream
    run one after another, so the streams are created through cudart instead. cudaStreamCreate
    makes blocking streams, which wait for the legacy default stream: the GEMMs beside them run on
    a pool stream of their own."""

    def __init__(self, count):
        self.handles = []
        for _ in range(count):
            handle = ctypes.c_void_p()
            torch.cuda.check_error(torch.cuda.cudart().cudaStreamCreate(ctypes.addressof(handle)))
            self.handles.append(handle.value)
        self.streams = [torch.cuda.ExternalStream(h) for h in self.handles]
        assert len(set(self.handles)) == count, "cudaStreamCreate returned a stream twice"

    def close(self):
        torch.cuda.synchronize()
        for h in self.handles:
            torch.cuda.check_error(torch.cuda.cudart().cudaStreamDestroy(h))


def gemm_beside_sleepers(t, gemms, streams, cycles):
    """The GEMMs' own time while single-block spinning kernels, one on each of `streams` and
    launched first, spin for longer than the GEMMs run.

    The block scheduler may put two of these one-block kernels on one SM, so they hold at most
    len(streams) SMs: the slowdown measured is a lower bound for that many SMs taken (the H100
    tables were measured the same way)."""
    gemm_stream = torch.cuda.Stream()
    times = []
    for i in range(t.warmup + t.repeats):
        torch.cuda.synchronize()
        for st in streams:
            with torch.cuda.stream(st):
                torch.cuda._sleep(cycles)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(gemm_stream):
            a.record()
            gemms()
            b.record()
        torch.cuda.synchronize()
        if i >= t.warmup:
            times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def together(t, cfg, first, second):
    """Each side's time when both run at once (two streams on a GPU, two threads on the CPU)."""
    if cfg.device != "cuda":
        out = {}

        def run(fn, key):
            t0 = time.perf_counter()
            fn()
            out[key] = time.perf_counter() - t0

        times = {"a": [], "b": []}
        for _ in range(t.repeats):
            th = threading.Thread(target=run, args=(second, "b"))
            th.start()
            run(first, "a")
            th.join()
            times["a"].append(out["a"])
            times["b"].append(out["b"])
        return statistics.median(times["a"]), statistics.median(times["b"])
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    ta, tb = [], []
    for i in range(t.warmup + t.repeats):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            e[0].record()
            first()
            e[1].record()
        with torch.cuda.stream(s2):
            e[2].record()
            second()
            e[3].record()
        torch.cuda.synchronize()
        if i >= t.warmup:
            ta.append(e[0].elapsed_time(e[1]) * 1e-3)
            tb.append(e[2].elapsed_time(e[3]) * 1e-3)
    return statistics.median(ta), statistics.median(tb)
