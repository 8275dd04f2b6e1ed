#!/usr/bin/env python3
"""Compares two measurements of the same GPU, table by table.

    tools/compare_gpu_tables.py configs/gpus/h200_sxm bench/data/h200_sxm_2026-11-28

Rows are matched on their shape columns; for each timed column it prints the absolute relative
difference of the second folder's figure from the first's (median, 90th percentile by nearest
rank, max). This is the spread of two runs, two machines or two days: the floor under which no
model of the tables can be said to predict the GPU better (bench/README.md, "Repeatability").
"""

import argparse
import csv
import os
import statistics
import sys

# table: (the columns that name a row, the timed columns compared)
TABLES = {
    "gemm_bf16.csv": (["layout", "m", "n", "k"], ["seconds"]),
    "grouped_gemm_bf16.csv": (["shape", "groups", "rows_per_group", "n", "k"], ["seconds"]),
    "attention_bf16.csv": (["backend", "shape", "seq", "causal"], ["fwd_seconds", "bwd_seconds"]),
    "memory_bound.csv": (["op", "tokens", "bytes_moved"], ["seconds"]),
    "pcie.csv": (["direction", "host_memory", "bytes", "timing"], ["seconds"]),
    "host_costs.csv": (["what"], ["seconds"]),
    "sm_contention.csv": (["case", "sms_held_by_other_kernel"], ["slowdown"]),
    "overlap_contention.csv": (["case"], ["slowdown"]),
    "gemm_other.csv": (["dtype", "m", "n", "k", "timing"], ["seconds"]),
    "grouped_gemm_vs_loop.csv": (["impl", "groups", "rows_per_group", "n", "k"], ["seconds"]),
}


def rows(folder, table, key):
    path = os.path.join(folder, table)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in key if c not in (reader.fieldnames or [])]
        if missing:
            sys.exit(f"{path}: no column {missing[0]}: not a NodeEmu GPU table")
        return {tuple(r[c] for c in key): r for r in reader}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", help="a profile or measured folder (the reference)")
    ap.add_argument("second", help="another measurement of the same GPU")
    args = ap.parse_args()
    print(f"{'table':26s} {'column':12s} {'rows':>5s} {'median':>8s} {'p90':>8s} {'max':>8s}")
    for table, (key, columns) in TABLES.items():
        if not all(os.path.exists(os.path.join(d, table)) for d in (args.first, args.second)):
            continue
        a, b = rows(args.first, table, key), rows(args.second, table, key)
        common = [k for k in a if k in b]
        for column in columns:
            diffs = sorted(abs(float(b[k][column]) / float(a[k][column]) - 1) for k in common
                           if float(a[k][column]) > 0)
            if not diffs:
                continue
            p90 = diffs[min(len(diffs) - 1, max(0, -(-9 * len(diffs) // 10) - 1))]
            print(f"{table:26s} {column:12s} {len(diffs):5d} {100 * statistics.median(diffs):7.2f}% "
                  f"{100 * p90:7.2f}% {100 * diffs[-1]:7.1f}%")


if __name__ == "__main__":
    main()
