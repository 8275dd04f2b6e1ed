#!/usr/bin/env bash
# NodeEmu's all-to-all against MPI_Alltoall and memcpy on this host, in one run:
#   1. installs the optional MPI packages (scripts/deps.sh: nodeemu_install_bench_extras),
#   2. builds bench_comm and bench_mpi_alltoall into build/bench/,
#   3. runs bench_mpi_alltoall under mpirun with 2 and 8 ranks,
#   4. runs bench_comm with those figures (--mpi_results), which adds mpi_GBps and vs_mpi,
#   5. prints P | per peer | nodeemu GB/s | MPI GB/s | vs_mpi | vs_memcpy from the medians.
#
#   bench/run_comm_vs_mpi.sh [extra bench_comm flags, e.g. --benchmark_filter=ranks:2/]
#
# Environment: JOBS (build parallelism, default nproc), OUT (results folder, default
# build/bench/comm_vs_mpi), MPIRUN_FLAGS (extra mpirun flags, e.g. "--mca btl self,vader").
# Needs python3 for the final table; the raw results stay in $OUT either way.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
nodeemu_install_bench_extras

jobs=${JOBS:-$(nproc)}
out=${OUT:-build/bench/comm_vs_mpi}
if [ ! -f build/CMakeCache.txt ]; then
  cmake --preset default >&2
else
  cmake -S . -B build >/dev/null  # picks up MPI if it was just installed
fi
cmake --build build -j "$jobs" --target bench_comm bench_mpi_alltoall >&2
mkdir -p "$out"

mpirun_flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)
# shellcheck disable=SC2206  # word splitting of the extra flags is wanted
mpirun_flags+=(${MPIRUN_FLAGS:-})
: >"$out/mpi.txt"
for p in 2 8; do
  echo "== MPI_Alltoall, $p ranks: mpirun ${mpirun_flags[*]} -np $p" >&2
  mpirun "${mpirun_flags[@]}" -np "$p" build/bench/bench_mpi_alltoall | tee "$out/mpi_$p.txt" >&2
  cat "$out/mpi_$p.txt" >>"$out/mpi.txt"
done

echo "== bench_comm" >&2
build/bench/bench_comm --mpi_results="$out/mpi.txt" --benchmark_out="$out/comm.json" \
  --benchmark_out_format=json "$@" >&2

python3 - "$out/comm.json" <<'EOF'
import json, re, sys

rows, virt = [], []
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    m = re.search(r"ranks:(\d+)/per_peer:(\d+)", b["name"])
    if not m:
        continue
    p, per = int(m.group(1)), int(m.group(2))
    if b["name"].startswith("BM_AllToAll/") and b.get("aggregate_name") == "median":
        rows.append((p, per, b))
    elif b["name"].startswith("BM_AllToAllVirtual/") and b.get("run_type") == "iteration":
        virt.append((p, per, b))

def size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"

def f(b, k, fmt="{:.2f}"):
    return fmt.format(b[k]) if k in b else "-"

print("\nall_to_all, algorithm bandwidth per rank ((P-1)*bytes/time), medians of 5 repetitions")
print("| P | per peer | nodeemu GB/s | MPI GB/s | vs_mpi | vs_memcpy | memcpy GB/s | in-run GB/s |")
print("|---|---|---|---|---|---|---|---|")
for p, per, b in sorted(rows, key=lambda r: (r[0], r[1])):
    print(f"| {p} | {size(per)} | {f(b, 'alg_GBps')} | {f(b, 'mpi_GBps')} | {f(b, 'vs_mpi')} "
          f"| {f(b, 'vs_memcpy')} | {f(b, 'memcpy_GBps')} | {f(b, 'in_run_GBps')} |")
if virt:
    print("\nvirtual time on dgx_h100 (meta mode): algorithm bandwidth per rank")
    print("| P | per peer | virtual us | virtual GB/s |")
    print("|---|---|---|---|")
    for p, per, b in sorted(virt, key=lambda r: (r[0], r[1])):
        print(f"| {p} | {size(per)} | {f(b, 'virtual_us', '{:.1f}')} | {f(b, 'virtual_GBps', '{:.1f}')} |")
EOF
