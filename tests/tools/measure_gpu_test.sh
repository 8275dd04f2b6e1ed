#!/usr/bin/env bash
# The calibration pipeline end to end on this machine's CPU: tools/measure_gpu.py --device cpu
# --quick writes the tables, `nodeemu calibrate` turns them into a profile (and prints the
# leave-one-out report), `nodeemu cost` predicts a table with it. Skipped (exit 77) only where no
# python3 with torch is installed: scripts/test installs Debian's python3-torch.
set -euo pipefail
nodeemu=$1
src=$2
py=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch" >/dev/null 2>&1; then
    py=$p
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIPPED: no python3 with torch here (scripts/test installs python3-torch; it could not)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" "$src/tools/measure_gpu.py" --device cpu --quick --out "$tmp/measured"
for t in gemm_bf16 gemm_other grouped_gemm_bf16 attention_bf16 memory_bound pcie host_costs \
         sm_contention overlap_contention; do
  test -s "$tmp/measured/$t.csv" || { echo "FAIL: no $t.csv"; exit 1; }
done
test -s "$tmp/measured/device.json"
grep -q '"attention_backward": "device time' "$tmp/measured/device.json"
# The calibration README's own method for the attention backward, on request.
"$py" "$src/tools/measure_gpu.py" --device cpu --quick --tables attention \
  --attention-backward events --out "$tmp/events" > /dev/null
grep -q '"attention_backward": "autograd' "$tmp/events/device.json"
test -s "$tmp/events/attention_bf16.csv"

"$nodeemu" calibrate "$tmp/measured" --out "$tmp/profile" | tee "$tmp/calibrate.txt"
for t in gemm_bf16 grouped_gemm_bf16 attention_bf16 memory_bound pcie; do
  grep -q "$t.csv" "$tmp/calibrate.txt" || { echo "FAIL: no leave-one-out line for $t"; exit 1; }
done
test -s "$tmp/profile/profile.yaml"
grep -q "measured: true" "$tmp/profile/profile.yaml"
# The unfused paths' series (issue 51): measured here, and the two NodeEmu prices a class with
# mapped onto it, so the profile no longer needs the layer anatomy's rows for them.
for s in index_add_bf16_h2048 index_add_bf16_h7168 index_add_f32_h2048 strided_elementwise_bf16 \
         cat_64_chunks_bf16 masked_select_top8_of128 argsort_top8 cumsum_i64; do
  grep -q "^$s," "$tmp/measured/memory_bound.csv" || { echo "FAIL: no $s series"; exit 1; }
done
grep -q "scatter_add: {series: index_add_bf16_h2048}" "$tmp/profile/profile.yaml"
grep -q "strided: {series: strided_elementwise_bf16}" "$tmp/profile/profile.yaml"
grep -q "pipeline check, not a measurement" "$tmp/profile/README.md"

printf 'layout,m,n,k\nNT,32,32,32\nNT,100,50,70\n' > "$tmp/shapes.csv"
"$nodeemu" cost --gpu "$tmp/profile" "$tmp/shapes.csv" --explain > "$tmp/cost.csv" \
  2> "$tmp/explain.txt"
test "$(head -1 "$tmp/cost.csv")" = "layout,m,n,k,seconds,tflops"
test "$(wc -l < "$tmp/cost.csv")" -eq 3
grep -q "row 2 (line 3): seconds" "$tmp/explain.txt"

# A measurement that does not load is refused with one line, and nothing is left behind.
sed -i 's/^NT,16,16,16,[^,]*/NT,16,16,16,-1/' "$tmp/measured/gemm_bf16.csv"
if "$nodeemu" calibrate "$tmp/measured" --out "$tmp/bad" 2> "$tmp/err.txt"; then
  echo "FAIL: a negative time was accepted"
  exit 1
fi
test "$(wc -l < "$tmp/err.txt")" -eq 1
grep -q "gemm_bf16.csv: row 1 (line 2), column 'seconds': must be > 0" "$tmp/err.txt"
test ! -e "$tmp/bad" && test ! -e "$tmp/bad.tmp-calibrate"

# measure_gpu.py's own refusals: one line naming the option or table, a non-zero exit.
refused() {  # expected message, then the arguments
  local want=$1
  shift
  if "$py" "$src/tools/measure_gpu.py" "$@" 2> "$tmp/py_err.txt" > /dev/null; then
    echo "FAIL: measure_gpu.py $* was accepted"
    exit 1
  fi
  grep -q "$want" "$tmp/py_err.txt" || { echo "FAIL: no '$want' in:"; cat "$tmp/py_err.txt"; exit 1; }
  test "$(wc -l < "$tmp/py_err.txt")" -eq 1 || { echo "FAIL: not one line:"; cat "$tmp/py_err.txt"; exit 1; }
}
refused "unknown table 'gemmm'" --device cpu --quick --tables gemmm --out "$tmp/r1"
refused "device cpu needs --quick" --device cpu --out "$tmp/r2"
refused "gemm_bf16.csv: no rows measured" --device cpu --quick --tables gemm --memory-gib 1e-9 \
  --out "$tmp/r3"
test ! -e "$tmp/r3/gemm_bf16.csv"
# Two measurements compared: a folder against itself differs by nothing; the H200 measured twice
# (bench/README.md, "Repeatability") agrees on GEMMs within a few per cent at the median.
"$py" "$src/tools/compare_gpu_tables.py" "$tmp/measured" "$tmp/measured" > "$tmp/self.txt"
grep -q "^gemm_bf16.csv  *seconds .* 0.00%  *0.00%" "$tmp/self.txt" || { cat "$tmp/self.txt"; exit 1; }
"$py" "$src/tools/compare_gpu_tables.py" "$src/configs/gpus/h200_sxm" \
  "$src/bench/data/h200_sxm_2026-11-28" > "$tmp/repeat.txt"
awk '$1 == "gemm_bf16.csv" { found = 1; if ($3 != 1860 || $4 + 0 > 5) bad = 1 }
     END { exit !(found && !bad) }' "$tmp/repeat.txt" || { cat "$tmp/repeat.txt"; exit 1; }
"$nodeemu" calibrate "$src/bench/data/h200_sxm_2026-11-28" > /dev/null
echo "measure_gpu.py -> nodeemu calibrate -> nodeemu cost, compare_gpu_tables.py: ok"
