#!/usr/bin/env bash
# The fleet check of `gpu-slicer advise` (issue 32 item 6; docs/src/advise.md, "Proof on a
# fleet"): 64 GPUs of two models on 8 real agents (`gpu-slicer run --backend sim:…`, each
# with `gpu-slicer emulate --kubelet` as its kubelet), scraped every second by a real
# Prometheus (Debian's `prometheus`) along with a generated dcgm-exporter exposition of the
# same GPUs; `advise --prometheus` on a minute of usage, the plan applied (pool configs
# written, agents reloaded, pods on their new shares), the same usage replayed, and the
# three conditions checked from what Prometheus recorded (hack/advise-fleet.py).
# Usage: hack/advise-fleet.sh [path to gpu-slicer] (default: target/debug/gpu-slicer, built).
# FLEET_TICKS=N: seconds of usage per phase (default 60). FLEET_KEEP=1 keeps the work dir.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build -q --bin gpu-slicer
  bin=${CARGO_TARGET_DIR:-target}/debug/gpu-slicer
fi
for tool in prometheus python3; do
  command -v "$tool" >/dev/null || { echo "advise-fleet: $tool not found (hack/install-deps.sh)" >&2; exit 1; }
done
python3 -c 'import yaml' 2>/dev/null || { echo "advise-fleet: python3-yaml not found (hack/install-deps.sh)" >&2; exit 1; }
wd=$(mktemp -d /tmp/gs-fleet.XXXXXX)
if [ "${FLEET_KEEP:-0}" = 1 ]; then
  echo "advise-fleet: work dir $wd (kept)"
else
  trap 'rm -rf "$wd"' EXIT
fi
python3 hack/advise-fleet.py "$(realpath "$bin")" "$wd"
