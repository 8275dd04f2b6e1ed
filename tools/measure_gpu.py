#!/usr/bin/env python3
"""Measures a NodeEmu GPU profile on this machine's GPU.

Writes the tables NodeEmu prices kernels, copies and host costs with (the same files and columns
as configs/gpus/h100_sxm5/) and device.json, their provenance. Then:

    nodeemu calibrate OUT --out configs/gpus/<name>    # checks them, writes the profile

Method (the calibration README's): device time from CUDA events after warm-up, the median of
repeats. Small kernels are timed as CUDA-graph replays of 2 to 20 back-to-back calls divided by
the count, so host launch gaps are not in them (each kernel's own start-up is); inputs rotate
between two buffer sets so that not all of them sit in L2. The attention backward is autograd's
backward timed with events over 3 calls. Host costs are host time of eager PyTorch calls.

`--device cpu --quick` runs the same code paths on CPU tensors with tiny sizes (no events or
graphs: wall-clock timing stands in), so the pipeline can be tested on a machine without a GPU.
Its numbers are not a measurement of anything NodeEmu emulates.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

METHOD = ("Device time from CUDA events after warm-up, the median of repeats. Small kernels (GEMMs, "
          "grouped GEMMs, memory-bound kernels, the attention forward, the graph rows of pcie.csv) "
          "are timed as CUDA-graph replays of 2 to 20 back-to-back calls divided by the count; "
          "inputs rotate between two buffer sets. The attention backward is autograd's backward "
          "timed with events over 3 calls. Event rows of pcie.csv time one eager copy each. Host "
          "costs are host time of eager PyTorch calls. SM contention: single-block spinning "
          "kernels (torch.cuda._sleep) on their own streams hold SMs while a GEMM stream runs.")


# --------------------------------------------------------------------------- timing


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
        """Median seconds per call of fn(i) for i in range(count), replayed back to back."""
        count = max(2, count)
        if not self.cuda:
            return self.events(lambda: [fn(i) for i in range(count)]) / count
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


class Tables:
    """Writes each table as its rows arrive, so an interrupted run keeps what it measured."""

    def __init__(self, out):
        self.out = out
        os.makedirs(out, exist_ok=True)

    def write(self, name, header, rows):
        path = os.path.join(self.out, name)
        with open(path + ".tmp", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(header)
            w.writerows(rows)
        os.replace(path + ".tmp", path)
        print("wrote %s (%d rows)" % (path, len(rows)), flush=True)


# --------------------------------------------------------------------------- tables


def fits(bytes_needed, cfg):
    return bytes_needed <= cfg.budget_bytes


def gemm_tables(t, cfg, tables):
    dt = cfg.dtype
    dev = cfg.device
    rows = []
    grid = cfg.gemm_grid
    for layout, (ms, ns, ks) in grid.items():
        for m in ms:
            for n in ns:
                for k in ks:
                    if not fits(2 * 2 * (m * k + n * k + m * n), cfg):
                        continue
                    # Two input sets, so that consecutive calls do not hit in L2 alone.
                    if layout == "NT":  # X[m,k] . W[n,k]^T: a linear layer's forward
                        sets = [(torch.randn(m, k, dtype=dt, device=dev),
                                 torch.randn(n, k, dtype=dt, device=dev)) for _ in range(2)]
                        call = lambda i, s=sets: torch.mm(s[i % 2][0], s[i % 2][1].t())
                    elif layout == "NN":  # dY[m,k] . W[k,n]: its dgrad
                        sets = [(torch.randn(m, k, dtype=dt, device=dev),
                                 torch.randn(k, n, dtype=dt, device=dev)) for _ in range(2)]
                        call = lambda i, s=sets: torch.mm(s[i % 2][0], s[i % 2][1])
                    else:  # TN: dY[k,m]^T . X[k,n]: its wgrad
                        sets = [(torch.randn(k, m, dtype=dt, device=dev),
                                 torch.randn(k, n, dtype=dt, device=dev)) for _ in range(2)]
                        call = lambda i, s=sets: torch.mm(s[i % 2][0].t(), s[i % 2][1])
                    guess = 2.0 * m * n * k / cfg.peak_flops
                    s = t.graph(call, calls_for(guess))
                    rows.append([layout, m, n, k, fmt(s), "%.4g" % (2.0 * m * n * k / s / 1e12)])
                    del sets
    tables.write("gemm_bf16.csv", ["layout", "m", "n", "k", "seconds", "tflops"], rows)

    rows = []
    for m, n, k in cfg.fp32_shapes:
        a = torch.randn(m, k, dtype=torch.float32, device=dev)
        b = torch.randn(n, k, dtype=torch.float32, device=dev)
        s = t.events(lambda: torch.mm(a, b.t()))
        rows.append(["float32", m, n, k, fmt(s), "%.4g" % (2.0 * m * n * k / s / 1e12), "events"])
    tables.write("gemm_other.csv", ["dtype", "m", "n", "k", "seconds", "tflops", "timing"], rows)


def grouped_mm(x, w, rows):
    """The experts' forward: one grouped kernel where PyTorch has one, else a loop of GEMMs."""
    if hasattr(torch, "_grouped_mm") and x.is_cuda:
        offs = torch.cumsum(torch.tensor(rows, dtype=torch.int32, device=x.device), 0,
                            dtype=torch.int32)
        return torch._grouped_mm(x, w, offs=offs)
    return loop_mm(x, w, rows)


def loop_mm(x, w, rows):
    out, at = [], 0
    for g, r in enumerate(rows):
        out.append(torch.mm(x[at:at + r], w[g]))
        at += r
    return torch.cat(out)


def grouped_tables(t, cfg, tables):
    dt, dev = cfg.dtype, cfg.device
    rows = []
    for shape, n, k in cfg.grouped_families:
        for g in cfg.grouped_groups:
            for r in cfg.grouped_rows:
                total = g * r
                if not fits(2 * (2 * g * k * n + 2 * total * (k + n)), cfg):
                    continue
                # Weights [k, n] per expert, stored column-major (as torch._grouped_mm's 2d x 3d
                # form takes them): a transposed view of [g, n, k].
                sets = [(torch.randn(total, k, dtype=dt, device=dev),
                         torch.randn(g, n, k, dtype=dt, device=dev).transpose(-2, -1))
                        for _ in range(2)]
                split = [r] * g
                call = lambda i, s=sets, sp=split: grouped_mm(s[i % 2][0], s[i % 2][1], sp)
                try:
                    s = t.graph(call, calls_for(2.0 * total * n * k / cfg.peak_flops))
                except RuntimeError as e:  # a shape the kernel does not take: no row
                    print("skipped grouped %s g=%d r=%d: %s" % (shape, g, r, e), file=sys.stderr)
                    continue
                rows.append([shape, g, r, n, k, fmt(s), "%.4g" % (2.0 * total * n * k / s / 1e12)])
                del sets
    tables.write("grouped_gemm_bf16.csv",
                 ["shape", "groups", "rows_per_group", "n", "k", "seconds", "tflops"], rows)

    rows = []
    for g, r, n, k in cfg.loop_shapes:
        x = torch.randn(g * r, k, dtype=dt, device=dev)
        w = torch.randn(g, n, k, dtype=dt, device=dev).transpose(-2, -1)
        for impl, fn in (("torch._grouped_mm", grouped_mm), ("loop_mm", loop_mm)):
            s = t.graph(lambda i, f=fn: f(x, w, [r] * g), 2)
            rows.append([impl, g, r, n, k, fmt(s), "%.4g" % (2.0 * g * r * n * k / s / 1e12)])
    tables.write("grouped_gemm_vs_loop.csv",
                 ["impl", "groups", "rows_per_group", "n", "k", "seconds", "tflops"], rows)


def attention(q, k, v, backend):
    """Causal attention through SDPA with the asked backend, or the math where there is none."""
    if q.is_cuda and hasattr(torch.nn, "attention"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kind = SDPBackend.CUDNN_ATTENTION if backend == "cudnn" else SDPBackend.FLASH_ATTENTION
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(kind):
            if q.shape[1] == k.shape[1]:
                return sdpa(q, k, v, is_causal=True)
            try:
                return sdpa(q, k, v, is_causal=True, enable_gqa=True)
            except (RuntimeError, TypeError):
                # A backend (or PyTorch) without native GQA: K and V repeated to the query heads,
                # as Transformer Engine does for such backends.
                rep = q.shape[1] // k.shape[1]
                return sdpa(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1),
                            is_causal=True)
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = q.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)


def attention_table(t, cfg, tables):
    dt, dev = cfg.dtype, cfg.device
    rows = []
    for backend in ("cudnn", "flash"):
        for shape, hq, hkv, dqk, dv in cfg.attention_shapes:
            for seq in cfg.attention_seqs:
                # q, k, v and the output with their gradients; the CPU's math keeps the scores
                need = 2 * 2 * 3 * seq * (hq + hkv) * (dqk + dv)
                if dev != "cuda":
                    need += 3 * 4 * hq * seq * seq
                if not fits(need, cfg):
                    continue
                try:
                    sets = [(torch.randn(1, hq, seq, dqk, dtype=dt, device=dev),
                             torch.randn(1, hkv, seq, dqk, dtype=dt, device=dev),
                             torch.randn(1, hkv, seq, dv, dtype=dt, device=dev))
                            for _ in range(2)]
                    flops = 2.0 * hq * seq * seq * (dqk + dv) * 0.5
                    fwd = t.graph(lambda i, s=sets, b=backend: attention(*s[i % 2], b),
                                  calls_for(flops / cfg.peak_flops))
                    q, k, v = (x.clone().requires_grad_(True) for x in sets[0])
                    out = attention(q, k, v, backend)
                    grad = torch.randn_like(out)
                    # autograd's backward, event-timed over 3 calls (not in a graph)
                    bwd = t.events(lambda: [out.backward(grad, retain_graph=True)
                                            for _ in range(3)]) / 3
                except RuntimeError as e:  # a backend that does not take this shape: no row
                    print("skipped attention %s %s seq %d: %s" % (backend, shape, seq, e),
                          file=sys.stderr)
                    continue
                rows.append([backend, shape, hq, hkv, dqk, dv, seq, 1, fmt(fwd), fmt(bwd),
                             "%.4g" % (flops / fwd / 1e12), "%.4g" % (2.5 * flops / bwd / 1e12)])
    tables.write("attention_bf16.csv",
                 ["backend", "shape", "q_heads", "kv_heads", "d_qk", "d_v", "seq", "causal",
                  "fwd_seconds", "bwd_seconds", "fwd_tflops", "bwd_tflops"], rows)


def rmsnorm(x, w):
    if hasattr(torch.nn.functional, "rms_norm"):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def memory_table(t, cfg, tables):
    dt, dev = cfg.dtype, cfg.device
    rows = []
    for size in cfg.copy_bytes:
        if not fits(4 * size, cfg):
            continue
        n = size // 2
        sets = [(torch.empty(n, dtype=dt, device=dev), torch.randn(n, dtype=dt, device=dev))
                for _ in range(2)]
        s = t.graph(lambda i, s=sets: s[i % 2][0].copy_(s[i % 2][1]), calls_for(size / 1e12))
        rows.append(["d2d_copy", "", 2 * size, fmt(s), "%.4g" % (2 * size / s / 1e9)])
        s = t.graph(lambda i, s=sets: torch.add(s[i % 2][1], 1.0), calls_for(size / 1e12))
        rows.append(["elementwise_add_scalar", "", 2 * size, fmt(s), "%.4g" % (2 * size / s / 1e9)])
    h, topk, ffn, experts = 2048, 8, 768, 128
    for tokens in cfg.token_counts:
        x = [torch.randn(tokens, h, dtype=dt, device=dev) for _ in range(2)]
        w = torch.ones(h, dtype=dt, device=dev)
        s = t.graph(lambda i: rmsnorm(x[i % 2], w), calls_for(tokens * h * 4 / 1e12))
        b = 2 * tokens * h * 2
        rows.append(["rmsnorm_h2048", tokens, b, fmt(s), "%.4g" % (b / s / 1e9)])
        idx = torch.randint(0, tokens, (tokens * topk,), device=dev)
        s = t.graph(lambda i: x[i % 2].index_select(0, idx), calls_for(tokens * topk * h * 4 / 1e12))
        b = 2 * tokens * topk * h * 2
        rows.append(["permute_gather_top8_h2048", tokens, b, fmt(s), "%.4g" % (b / s / 1e9)])
        a = [torch.randn(tokens * topk, 2 * ffn, dtype=dt, device=dev) for _ in range(2)]
        s = t.graph(lambda i: torch.nn.functional.silu(a[i % 2][:, :ffn]) * a[i % 2][:, ffn:],
                    calls_for(tokens * topk * ffn * 6 / 1e12))
        rows.append(["swiglu_768_top8", tokens, tokens * topk * 3 * ffn * 2, fmt(s), ""])
        logits = [torch.randn(tokens, experts, dtype=torch.float32, device=dev) for _ in range(2)]
        s = t.graph(lambda i: torch.topk(torch.softmax(logits[i % 2], dim=-1), topk, dim=-1),
                    calls_for(tokens * experts * 8 / 1e12))
        rows.append(["router_softmax_top8_of128", tokens, "", fmt(s), ""])
    # One series after another, each in increasing size (NodeEmu checks the order).
    order = ["d2d_copy", "elementwise_add_scalar", "rmsnorm_h2048", "permute_gather_top8_h2048",
             "swiglu_768_top8", "router_softmax_top8_of128"]
    rows.sort(key=lambda r: order.index(r[0]))
    tables.write("memory_bound.csv", ["op", "tokens", "bytes_moved", "seconds", "gb_s"], rows)


def host_buffer(n, pinned, cfg):
    b = torch.empty(n, dtype=torch.uint8)
    return b.pin_memory() if pinned and cfg.device == "cuda" else b


def pcie_table(t, cfg, tables):
    dev = cfg.device
    rows = []
    for direction in ("h2d", "d2h"):
        for memory in ("pinned", "pageable"):
            for size in cfg.pcie_bytes:
                if not fits(2 * size, cfg):
                    continue
                host = host_buffer(size, memory == "pinned", cfg)
                gpu = torch.empty(size, dtype=torch.uint8, device=dev)
                if direction == "h2d":
                    s = t.events(lambda: gpu.copy_(host, non_blocking=memory == "pinned"))
                else:
                    s = t.events(lambda: host.copy_(gpu, non_blocking=memory == "pinned"))
                rows.append([direction, memory, size, fmt(s), "%.4g" % (size / s / 1e9), "events"])
    for direction in ("h2d", "d2h"):
        for size in cfg.pcie_graph_bytes:
            hosts = [host_buffer(size, True, cfg) for _ in range(2)]
            gpus = [torch.empty(size, dtype=torch.uint8, device=dev) for _ in range(2)]
            if direction == "h2d":
                call = lambda i: gpus[i % 2].copy_(hosts[i % 2], non_blocking=True)
            else:
                call = lambda i: hosts[i % 2].copy_(gpus[i % 2], non_blocking=True)
            s = t.graph(call, 8)
            rows.append([direction, "pinned", size, fmt(s), "%.4g" % (size / s / 1e9), "graph"])
    # Both directions at once: half the bytes each way on two streams.
    size = cfg.concurrent_bytes
    half = size // 2
    hin, hout = host_buffer(half, True, cfg), host_buffer(half, True, cfg)
    gin, gout = (torch.empty(half, dtype=torch.uint8, device=dev) for _ in range(2))
    if cfg.device == "cuda":
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

        def both():
            with torch.cuda.stream(s1):
                gin.copy_(hin, non_blocking=True)
            with torch.cuda.stream(s2):
                hout.copy_(gout, non_blocking=True)
            torch.cuda.current_stream().wait_stream(s1)
            torch.cuda.current_stream().wait_stream(s2)
    else:
        def both():
            gin.copy_(hin)
            hout.copy_(gout)
    s = t.events(both)
    rows.append(["h2d+d2h_concurrent", "pinned", size, fmt(s), "%.4g" % (size / s / 1e9), "events"])
    tables.write("pcie.csv", ["direction", "host_memory", "bytes", "seconds", "gb_s", "timing"],
                 rows)


def host_cost_table(t, cfg, tables):
    dev = cfg.device
    x = torch.zeros(16, device=dev)
    n = cfg.host_calls
    rows = [["torch_add_host_per_launch", fmt(t.host(lambda: x.add_(1), n), 3)]]
    rows.append(["torch_add_device_per_kernel_backtoback",
                 fmt(t.events(lambda: [x.add_(1) for _ in range(n)]) / n, 3)])
    if cfg.device == "cuda":
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        rows.append(["graph_replay_per_kernel", fmt(t.host(g.replay, 1) / n, 3)])
        ev = torch.cuda.Event()
        rows.append(["event_record_host", fmt(t.host(ev.record, n), 3)])
        stream = torch.cuda.current_stream()
        rows.append(["stream_wait_event_host", fmt(t.host(lambda: stream.wait_event(ev), n), 3)])
        sync = torch.cuda.synchronize
    else:
        # No graphs, events or streams on the CPU: the nearest Python-level calls stand in.
        rows.append(["graph_replay_per_kernel", fmt(t.host(lambda: None, n), 3)])
        rows.append(["event_record_host", fmt(t.host(lambda: time.perf_counter(), n), 3)])
        rows.append(["stream_wait_event_host", fmt(t.host(lambda: None, n), 3)])
        sync = lambda: None

    def roundtrip():
        x.add_(1)
        sync()
    rows.append(["launch_plus_sync_roundtrip", fmt(t.host(roundtrip, n), 3)])
    rows.append(["sync_idle", fmt(t.host(sync, n), 3)])
    counts = torch.zeros(128, dtype=torch.int64, device=dev)
    rows.append(["small_d2h_host_sync_128_int64", fmt(t.host(counts.tolist, n), 3)])
    tables.write("host_costs.csv", ["what", "seconds"], rows)


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
    for held in cfg.sms_held:
        if cfg.device == "cuda":
            cycles = int(alone * 1.5 * sleep_cycles_per_second(t))
            s = gemm_beside_sleepers(t, gemms, held, cycles)
        else:
            threads = torch.get_num_threads()
            torch.set_num_threads(max(1, threads - round(threads * held / cfg.sms)))
            s = t.events(gemms)
            torch.set_num_threads(threads)
        rows.append(["gemm_with_sms_held", held, fmt(s), "%.4g" % (s / alone)])
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


def gemm_beside_sleepers(t, gemms, held, cycles):
    """The GEMMs' own time while `held` single-block spinning kernels, each on its own stream and
    launched first, hold `held` SMs for longer than the GEMMs run."""
    streams = [torch.cuda.Stream() for _ in range(held)]
    times = []
    for i in range(t.warmup + t.repeats):
        torch.cuda.synchronize()
        for st in streams:
            with torch.cuda.stream(st):
                torch.cuda._sleep(cycles)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
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
        import threading
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


# --------------------------------------------------------------------------- configuration


class Config:
    def __init__(self, args):
        self.device = args.device
        self.quick = args.quick
        cuda = args.device == "cuda"
        self.dtype = torch.bfloat16
        self.peak_flops = 700e12 if cuda else 50e9
        self.budget_bytes = (args.memory_gib if args.memory_gib else (60 if cuda else 1)) * 2**30
        if args.quick:
            small = [16, 32]
            self.gemm_grid = {"NT": (small, small, [16, 32, 64]), "NN": (small, small, small),
                              "TN": (small, small, small)}
            self.fp32_shapes = [(32, 8, 16), (64, 64, 64)]
            self.grouped_families = [("qwen3_fc1", 32, 64), ("qwen3_fc2", 64, 16),
                                     ("dsv3_fc1", 64, 32)]
            self.grouped_groups = [1, 2, 4]
            self.grouped_rows = [16, 32, 128]
            self.loop_shapes = [(2, 32, 32, 64)]
            self.attention_shapes = [("qwen3", 4, 1, 16, 16), ("mha16", 2, 2, 16, 16)]
            self.attention_seqs = [32, 64, 128]
            self.copy_bytes = [4096, 65536, 1 << 20]
            self.token_counts = [16, 64]
            self.pcie_bytes = [4096, 1 << 20]
            self.pcie_graph_bytes = [4096, 65536]
            self.concurrent_bytes = 1 << 20
            self.host_calls = 20
            self.contention_gemm = (64, 64, 64, 4)
            self.sms = os.cpu_count() or 1
            self.sms_held = sorted({max(1, self.sms // 4), max(1, self.sms // 2)})
            self.copy_contention_bytes = 1 << 20
            self.copy_reps = 4
        else:
            ms = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
            nk = [256, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 12288,
                  16384]
            big = [1024, 2048, 4096, 8192]
            self.gemm_grid = {"NT": (ms, nk, nk), "NN": ([1024, 4096, 16384], big, big),
                              "TN": ([1024, 4096, 16384], big, big)}
            self.fp32_shapes = [(4096, 128, 2048), (4096, 4096, 4096)]
            self.grouped_families = [("qwen3_fc1", 1536, 2048), ("qwen3_fc2", 2048, 768),
                                     ("dsv3_fc1", 4096, 7168), ("dsv3_fc2", 7168, 2048),
                                     ("mixtral_fc1", 28672, 4096), ("mixtral_fc2", 4096, 14336)]
            self.grouped_groups = [1, 2, 4, 8, 16, 32, 64]
            self.grouped_rows = [16, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
            self.loop_shapes = [(g, r, n, k) for g in (8, 32) for r in (1024, 4096)
                                for n, k in ((1536, 2048), (2048, 768))]
            self.attention_shapes = [("qwen3", 32, 4, 128, 128), ("qwen3_tp2", 16, 2, 128, 128),
                                     ("mixtral", 32, 8, 128, 128),
                                     ("dsv3_mla", 128, 128, 192, 128),
                                     ("mha16", 16, 16, 128, 128)]
            self.attention_seqs = [1024, 2048, 4096, 8192, 16384]
            self.copy_bytes = [1 << p for p in range(15, 32, 2)]
            self.token_counts = [512 << p for p in range(7)]
            self.pcie_bytes = [65536, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
            self.pcie_graph_bytes = [4096, 65536, 262144, 1 << 20, 4 << 20]
            self.concurrent_bytes = 512 << 20
            self.host_calls = 200
            self.contention_gemm = (8192, 8192, 2048, 40)
            self.sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 1
            self.sms_held = [8, 16, 24, 32, 48, self.sms // 2]
            self.copy_contention_bytes = 512 << 20
            self.copy_reps = 10


def nvidia_smi(query):
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def host_cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_json(cfg, args):
    d = {"device": cfg.device, "quick": cfg.quick, "torch": torch.__version__,
         "measured": datetime.date.today().isoformat(), "host_cpu": host_cpu(),
         "method": METHOD if cfg.device == "cuda" else
                   "CPU stand-in (--device cpu): wall-clock timing of the same calls on CPU "
                   "tensors; no events, graphs or streams. A pipeline check, not a measurement."}
    if cfg.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        d.update({"gpu": p.name, "sms": p.multi_processor_count,
                  "memory_gib": round(p.total_memory / 2**30, 1),
                  "l2_mb": round(getattr(p, "L2_cache_size", 0) / 1e6, 1),
                  "cuda": torch.version.cuda,
                  "sm_clock_mhz": nvidia_smi("clocks.max.sm"),
                  "power_limit_w": nvidia_smi("power.limit")})
    else:
        d.update({"gpu": "CPU stand-in (%s)" % host_cpu(), "sms": cfg.sms,
                  "memory_gib": None, "l2_mb": None, "cuda": None,
                  "sm_clock_mhz": None, "power_limit_w": None,
                  "attention_backends": "math on the CPU: the cudnn and flash rows run the same "
                                        "kernel"})
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the tables and device.json")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes: checks the pipeline, measures nothing worth a profile")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (median)")
    ap.add_argument("--memory-gib", type=float, default=None,
                    help="skip shapes needing more device memory than this")
    ap.add_argument("--tables", default="all",
                    help="comma list of: gemm,grouped,attention,memory,pcie,host,contention")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("measure_gpu.py: error: no CUDA device; run on the GPU box, or use --device cpu "
              "--quick to check the pipeline", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    cfg = Config(args)
    t = Timer(args.device, args.repeats or (3 if args.quick else 10), 1 if args.quick else 3)
    tables = Tables(args.out)
    with open(os.path.join(args.out, "device.json"), "w") as f:
        json.dump(device_json(cfg, args), f, indent=1)
    wanted = set(args.tables.split(",")) if args.tables != "all" else None
    steps = [("gemm", gemm_tables), ("grouped", grouped_tables), ("attention", attention_table),
             ("memory", memory_table), ("pcie", pcie_table), ("host", host_cost_table),
             ("contention", contention_tables)]
    for name, fn in steps:
        if wanted is None or name in wanted:
            print("measuring %s ..." % name, flush=True)
            fn(t, cfg, tables)
    print("done: now run  nodeemu calibrate %s --out configs/gpus/<name>" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
