#!/usr/bin/env bash
# Print every figure the issues ask for: CDI generation scaling, device-plugin RPC
# latencies / restart / start (cargo benches), and idle RSS and threads of `run`.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo bench --bench cdi
cargo bench --bench plugin
cargo bench --bench reload
cargo bench --bench health
cargo build --release --bin gpu-slicer -q

wd=$(mktemp -d /tmp/gs-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$wd"' EXIT
mkdir -p "$wd/dp" "$wd/cdi"
samples=()
threads=0
for i in 1 2 3 4 5; do
  target/release/gpu-slicer run --backend sim:mixed-a100 --config hack/configs/mixed-timeslicing.yaml \
    --device-plugin-dir "$wd/dp" --cdi-dir "$wd/cdi" >"$wd/run.log" 2>&1 &
  pid=$!
  # Wait until every socket is bound (the daemon then idles waiting for kubelet.sock).
  for _ in $(seq 100); do
    [ "$(ls "$wd/dp" | wc -l)" -ge 4 ] && break
    sleep 0.05
  done
  sleep 1
  samples+=("$(awk '/VmRSS/ {print $2}' /proc/$pid/status)")
  threads=$(awk '/Threads/ {print $2}' /proc/$pid/status)
  kill -TERM "$pid"
  wait "$pid" || true
done
median=$(printf '%s\n' "${samples[@]}" | sort -n | sed -n 3p)
echo "idle run (sim:mixed-a100, 5 runs): RSS median ${median} KiB, threads ${threads}, binary $(stat -c %s target/release/gpu-slicer) bytes"
