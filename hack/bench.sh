#!/usr/bin/env bash
# Print every figure the issues ask for, then one figure table: CDI generation scaling,
# device-plugin RPC latencies / restart / start, the scaling curve (1x, 4x, 16x dgx-h100:
# devices advertised vs Allocate, GetPreferredAllocation and CDI spec time), reload and health
# latency, and idle RSS and threads of `run`. Latencies are percentiles over thousands of
# calls; the scaling figures are medians over 3 rounds on fresh daemons; RSS is the median of
# 5 starts.
# BENCH_QUICK=1 runs fewer calls.
set -euo pipefail
cd "$(dirname "$0")/.."

wd=$(mktemp -d /tmp/gs-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$wd"' EXIT

for bench in cdi plugin reload health scaling; do
  cargo bench -q --bench "$bench" | tee -a "$wd/figures.log"
done
cargo build --release --bin gpu-slicer -q

mkdir -p "$wd/dp" "$wd/cdi"
samples=()
stops=()
threads=0
for _ in 1 2 3 4 5; do
  # As deployed: HTTP endpoint on and the ledger running (its socket absent here, so it
  # retries every interval in the background).
  target/release/gpu-slicer run --backend sim:mixed-a100 --config hack/configs/mixed-timeslicing.yaml \
    --device-plugin-dir "$wd/dp" --cdi-dir "$wd/cdi" --state-dir "$wd/state" --labels-file "$wd/labels" --http-listen 127.0.0.1:0 \
    --pod-resources-socket "$wd/pod-resources.sock" >"$wd/run.log" 2>&1 &
  pid=$!
  # Wait until every socket is bound (the daemon then idles waiting for kubelet.sock).
  for _ in $(seq 100); do
    [ "$(ls "$wd/dp" | wc -l)" -ge 4 ] && break
    sleep 0.05
  done
  sleep 1
  samples+=("$(awk '/VmRSS/ {print $2}' /proc/$pid/status)")
  threads=$(awk '/Threads/ {print $2}' /proc/$pid/status)
  t0=$(date +%s%N)
  kill -TERM "$pid"
  wait "$pid" || true
  stops+=("$(( ($(date +%s%N) - t0) / 1000000 ))")
done
median=$(printf '%s\n' "${samples[@]}" | sort -n | sed -n 3p)
{
  echo "FIGURE|idle run RSS (sim:mixed-a100, median of 5 starts)|${median} KiB"
  echo "FIGURE|idle run threads|${threads}"
  echo "FIGURE|SIGTERM -> exit of idle run (median of 5)|$(printf '%s\n' "${stops[@]}" | sort -n | sed -n 3p) ms"
  echo "FIGURE|release binary size|$(stat -c %s target/release/gpu-slicer) bytes"
} >>"$wd/figures.log"

cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
echo
echo "== gpu-slicer figures: $(nproc) CPUs visible ($cpu), $(uname -sr) =="
grep '^FIGURE|' "$wd/figures.log" | cut -d'|' -f2- | awk -F'|' '{ printf "%-62s %s\n", $1, $2 }'
