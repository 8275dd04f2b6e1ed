#!/usr/bin/env python3
"""Measures a NodeEmu GPU profile on this machine's GPU.

Writes the tables NodeEmu prices kernels, copies and host costs with (the same files and columns
as configs/gpus/h100_sxm5/) and device.json, their provenance. Then:

    nodeemu calibrate OUT --out configs/gpus/<name>    # checks them, writes the profile

Method (the calibration README's): device time from CUDA events after warm-up, the median of
repeats. Small kernels are timed as CUDA-graph replays of 2 to 20 back-to-back calls divided by
the count, so host launch gaps are not in them (each kernel's own start-up is); inputs rotate
between two buffer sets so that not all of them sit in L2. Host costs are host time of eager
PyTorch calls. One departure, on purpose: the attention backward is the graph-replayed forward
and backward less the graph-replayed forward (device time, as NodeEmu's clock wants it), where
the README timed autograd's eager backward with events over 3 calls, which at short sequences
measures the host (`--attention-backward events` gives the README's method).

`--device cpu --quick` runs the same code paths on CPU tensors with tiny sizes (no events or
graphs: wall-clock timing stands in), so the pipeline can be tested on a machine without a GPU.
Its numbers are not a measurement of anything NodeEmu emulates.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

import torch

# The tables live in tools/gpu_measure/ beside this script (Python puts a script's own folder on
# sys.path first).
from gpu_measure.compute_tables import (attention_table, gemm_tables, grouped_kernel,
                                        grouped_tables, memory_table)
from gpu_measure.contention_tables import contention_tables
from gpu_measure.host_op_tables import host_op_table
from gpu_measure.timing import MeasureError, Tables, Timer
from gpu_measure.transfer_tables import host_cost_table, pcie_table

METHOD = ("Device time from CUDA events after warm-up, the median of repeats. Small kernels (GEMMs, "
          "grouped GEMMs, memory-bound kernels, the attention forward, the graph rows of pcie.csv) "
          "are timed as CUDA-graph replays of 2 to 20 back-to-back calls divided by the count; "
          "inputs rotate between two buffer sets. Event rows of pcie.csv time one eager copy each. Host "
          "costs are host time of eager PyTorch calls. RMSNorm, SwiGLU and the router are eager "
          "PyTorch kernels, not fused ones. SM contention: single-block spinning kernels "
          "(torch.cuda._sleep) on their own streams hold up to that many SMs while a GEMM stream "
          "runs (two blocks may share an SM: a lower bound on the slowdown).")

# How attention_bf16.csv's bwd_seconds were taken (device.json: attention_backward).
ATTENTION_BACKWARD = {
    "graph": "device time: forward and backward replayed from a CUDA graph, less the forward",
    "events": "autograd's eager backward timed with events over 3 calls (host time included at "
              "short sequences)",
}


# --------------------------------------------------------------------------- configuration


class Config:
    def __init__(self, args):
        self.device = args.device
        self.quick = args.quick
        self.attention_backward = args.attention_backward
        self.event_timed_backward = []  # attention rows whose backward could not be captured
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
            self.sms = max(2, os.cpu_count() or 1)  # one "SM" held, one left to the GEMM
            held = [max(1, self.sms // 4), max(1, self.sms // 2)]
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
            held = [8, 16, 24, 32, 48, self.sms // 2]
            self.copy_contention_bytes = 512 << 20
            self.copy_reps = 10
        # Increasing and each below the SM count (NodeEmu reads the curve in order; holding every
        # SM would leave the GEMM none). A GPU with fewer SMs than the fixed steps drops them.
        self.sms_held = sorted({h for h in held if 0 < h < self.sms})


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
         "grouped_kernel": grouped_kernel(cfg.device),
         "attention_backward": ATTENTION_BACKWARD[cfg.attention_backward],
         "method": METHOD if cfg.device == "cuda" else
                   "CPU stand-in (--device cpu): wall-clock timing of the same calls on CPU "
                   "tensors; no events, graphs or streams. A pipeline check, not a measurement."}
    if cfg.event_timed_backward:
        d["attention_backward_by_events"] = cfg.event_timed_backward
    if cfg.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        d.update({"gpu": p.name, "sms": p.multi_processor_count,
                  "memory_gib": round(p.total_memory / 2**30, 1),
                  "l2_mb": round(getattr(p, "L2_cache_size", 0) / 1e6, 1),
                  "cuda": torch.version.cuda,
                  "compute_capability": "%d.%d" % (p.major, p.minor),
                  "sm_clock_mhz": nvidia_smi("clocks.max.sm"),
                  "power_limit_w": nvidia_smi("power.limit")})
    else:
        d.update({"gpu": "CPU stand-in (%s)" % host_cpu(), "sms": cfg.sms,
                  "memory_gib": None, "l2_mb": None, "cuda": None, "compute_capability": None,
                  "sm_clock_mhz": None, "power_limit_w": None,
                  "attention_backends": "math on the CPU: the cudnn and flash rows run the same "
                                        "kernel"})
    return d


STEPS = [("gemm", gemm_tables), ("grouped", grouped_tables), ("attention", attention_table),
         ("memory", memory_table), ("pcie", pcie_table), ("host", host_cost_table),
         ("host_ops", host_op_table),
         ("contention", contention_tables)]


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line naming the option, not argparse's usage block."""

    def error(self, message):
        self.exit(2, "%s: error: %s (see --help)\n" % (self.prog, message))


def write_device_json(cfg, args):
    """Written first, so that an interrupted run keeps its provenance, and again at the end."""
    path = os.path.join(args.out, "device.json")
    with open(path + ".tmp", "w") as f:
        json.dump(device_json(cfg, args), f, indent=1)
    os.replace(path + ".tmp", path)


def main():
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the tables and device.json")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes: checks the pipeline, measures nothing worth a profile")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (median)")
    ap.add_argument("--memory-gib", type=float, default=None,
                    help="skip shapes needing more device memory than this")
    ap.add_argument("--attention-backward", choices=["graph", "events"], default="graph",
                    help="graph: forward+backward replayed from a CUDA graph less the forward "
                         "(device time); events: autograd's eager backward timed with events, "
                         "the calibration README's method")
    ap.add_argument("--tables", default="all",
                    help="comma list of: " + ",".join(name for name, _ in STEPS))
    args = ap.parse_args()
    known = [name for name, _ in STEPS]
    wanted = known if args.tables == "all" else args.tables.split(",")
    unknown = [w for w in wanted if w not in known]
    if unknown:
        ap.error("--tables: unknown table '%s'; choose from %s" % (unknown[0], ",".join(known)))
    # host_ops alone is worth running on a CPU: it measures the framework's own share per
    # operation (Python, dispatcher, autograd), which NodeEmu's host model is split by.
    if args.device == "cpu" and not args.quick and wanted != ["host_ops"]:
        ap.error("--device cpu needs --quick (or --tables host_ops alone): the full sizes would "
                 "take days on a CPU, and a CPU run measures nothing else worth a profile")
    if args.repeats is not None and args.repeats < 1:
        ap.error("--repeats: must be at least 1")
    if args.memory_gib is not None and args.memory_gib <= 0:
        ap.error("--memory-gib: must be > 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("measure_gpu.py: error: no CUDA device; run on the GPU box, or use --device cpu "
              "--quick to check the pipeline", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    cfg = Config(args)
    t = Timer(args.device, args.repeats or (3 if args.quick else 10), 1 if args.quick else 3)
    tables = Tables(args.out)
    write_device_json(cfg, args)
    try:
        for name, fn in STEPS:
            if name in wanted:
                print("measuring %s ..." % name, flush=True)
                fn(t, cfg, tables)
    except MeasureError as e:
        print("measure_gpu.py: error: %s" % e, file=sys.stderr)
        return 1
    write_device_json(cfg, args)  # again: what the tables' measurement found out on the way
    print("done: now run  nodeemu calibrate %s --out configs/gpus/<name>" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
