#!/usr/bin/env bash
# `gpu-slicer advise --prometheus` against a real Prometheus (Debian's `prometheus`, which
# hack/install-deps.sh installs): two days of usage of 8 H100s on 2 nodes, each held by one
# pod of a small inference workload (peak 5.5 GiB, 5-15 % busy), written once as
# dcgm-exporter's series and once as gpu-slicer's, backfilled with `promtool tsdb
# create-blocks-from openmetrics`, served by `prometheus` on a free port, and read by
# `advise` for each metric family. Checks: the PromQL runs on a real engine, both families
# give the same plan (8 GPUs -> 2, the lower bound), no grant below a peak.
# Usage: hack/advise-e2e.sh [path to gpu-slicer] (default: target/debug/gpu-slicer, built).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/prometheus.sh
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build -q --bin gpu-slicer
  bin=${CARGO_TARGET_DIR:-target}/debug/gpu-slicer
fi
for tool in prometheus promtool python3; do
  command -v "$tool" >/dev/null || { echo "advise-e2e: $tool not found (hack/install-deps.sh)" >&2; exit 1; }
done
wd=$(mktemp -d /tmp/gs-advise-e2e.XXXXXX)
prom_pid=
cleanup() { [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$wd"; }
trap cleanup EXIT

end=$(( $(date +%s) / 60 * 60 - 3600 ))
python3 - "$wd" "$end" <<'PY'
import sys
wd, end = sys.argv[1], int(sys.argv[2])
start, step = end - 2 * 86400, 120
gpus = [(f"GPU-e0000000-0000-4000-8000-00000000000{i}", f"node-{i // 4}") for i in range(8)]
suffixes = ["bcdfg", "hjklm", "npqrs", "tvwxz", "bbccd", "ffggh", "jjkkl", "mmnnp"]
pod = {u: f"chat-7d9f8b6c5d-{suffixes[i]}" for i, (u, _) in enumerate(gpus)}
def used(k): return 4000 + (k * 37 % 1600)   # MiB, peak 5599
def util(k): return 5 + (k * 13 % 11)        # percent, 5..15
ticks = range(start, end + 1, step)
def family(out, name, series):
    out.append(f"# TYPE {name} gauge")
    for labels, f in series:
        for k, t in enumerate(ticks):
            out.append(f"{name}{{{labels}}} {f(k)} {t}")
dcgm = []
def dl(u, n): return f'UUID="{u}",modelName="NVIDIA H100 80GB HBM3",Hostname="{n}",namespace="serving",pod="{pod[u]}",container="server"'
family(dcgm, "DCGM_FI_DEV_FB_FREE", [(dl(u, n), lambda k: 81559 - used(k)) for u, n in gpus])
family(dcgm, "DCGM_FI_DEV_FB_USED", [(dl(u, n), used) for u, n in gpus])
family(dcgm, "DCGM_FI_DEV_GPU_UTIL", [(dl(u, n), util) for u, n in gpus])
own = []
family(own, "gpu_slicer_device_memory_total_bytes", [(f'uuid="{u}",kind="gpu",node="{n}"', lambda k: 81559 << 20) for u, n in gpus])
family(own, "gpu_slicer_device_utilization_ratio", [(f'uuid="{u}"', lambda k: util(k) / 100) for u, n in gpus])
family(own, "gpu_slicer_pod_device_allocation", [(f'namespace="serving",pod="{pod[u]}",container="server",resource="nvidia.com/gpu",device="{u}"', lambda k: 1) for u, n in gpus])
family(own, "gpu_slicer_share_memory_used_bytes", [(f'namespace="serving",pod="{pod[u]}",container="server",resource="nvidia.com/gpu"', lambda k: used(k) << 20) for u, n in gpus])
for name, lines in (("dcgm", dcgm), ("own", own)):
    with open(f"{wd}/{name}.om", "w") as f:
        f.write("\n".join(lines + ["# EOF"]) + "\n")
PY
for f in dcgm own; do
  promtool tsdb create-blocks-from openmetrics "$wd/$f.om" "$wd/data" >/dev/null
done
start_prometheus "$wd" 150
for metrics in dcgm gpu-slicer; do
  "$bin" advise --prometheus "http://127.0.0.1:$port" --metrics "$metrics" --window 2d --at "$end" \
    --summary-json "$wd/$metrics.json" --output "$wd/plan-$metrics" >"$wd/$metrics.txt"
done
python3 - "$wd" <<'PY'
import json, sys
wd = sys.argv[1]
out = {}
for m in ("dcgm", "gpu-slicer"):
    s = json.load(open(f"{wd}/{m}.json"))
    assert s["gpusBefore"] == 8, (m, s["gpusBefore"])
    assert s["gpusAfter"] == 2 == s["lowerBound"], (m, s["gpusAfter"], s["lowerBound"])
    (w,) = s["workloads"]
    assert w["name"] == "chat" and w["class"] == "shared", (m, w)
    assert w["peakMemoryBytes"] == 5599 << 20, (m, w["peakMemoryBytes"])
    assert w["grantMemoryBytes"] >= w["peakMemoryBytes"], (m, w)
    out[m] = (s["gpusAfter"], w["share"], s["pools"])
assert out["dcgm"] == out["gpu-slicer"], out
print(f"advise-e2e: real Prometheus, dcgm-exporter and gpu-slicer metrics: 8 GPUs -> 2 (bound 2), share {out['dcgm'][1]}")
PY
diff -r "$wd/plan-dcgm" "$wd/plan-gpu-slicer" >/dev/null || { echo "advise-e2e: the two families' plans differ" >&2; exit 1; }
