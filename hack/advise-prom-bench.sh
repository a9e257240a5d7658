#!/usr/bin/env bash
# `advise --prometheus` at 10 000 GPUs (hack/bench.sh with BENCH_ADVISE_PROM=1; minutes and a
# few GiB of /tmp): 7 days of gpu-slicer's series for GPUS GPUs (default 10000; half H100,
# half A100 80GB, 8 per node, one pod each: a small inference workload per 8 pods, memory
# and utilisation waves) at one sample per STEP seconds (default 900), backfilled with
# `promtool tsdb create-blocks-from openmetrics` one aligned 2-hour file at a time (promtool
# reads its whole input once per block, so one file for the week would be read 84 times),
# served by Debian's `prometheus`. Prints FIGURE| lines: the wall time and peak RSS of
# `advise --prometheus --window 7d` (plan, report and summary written), and the backfill's.
# Usage: hack/advise-prom-bench.sh [path to gpu-slicer] (default: target/release/gpu-slicer, built).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/prometheus.sh
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build -q --release --bin gpu-slicer
  bin=${CARGO_TARGET_DIR:-target}/release/gpu-slicer
fi
for tool in prometheus promtool python3; do
  command -v "$tool" >/dev/null || { echo "advise-prom-bench: $tool not found (hack/install-deps.sh)" >&2; exit 1; }
done
gpus=${GPUS:-10000}
step=${STEP:-900}
wd=$(mktemp -d /tmp/gs-advise-prom.XXXXXX)
prom_pid=
cleanup() { [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$wd"; }
trap cleanup EXIT

end=$(( $(date +%s) / 7200 * 7200 - 7200 ))
t0=$(date +%s.%N)
python3 - "$wd" "$end" "$gpus" "$step" <<'PY'
import sys
wd, end, n, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
start = end - 7 * 86400
ticks = list(range(start, end, step))
models = [(81559, "h"), (81920, "a")]
gpus = []
for i in range(n):
    mib, m = models[0] if i < n // 2 else models[1]
    u = f"GPU-be4c0000-0000-4000-8000-{i:012x}"
    w = i // 8
    pod = f"infer-{w:05d}-7d9f8b6c5d-{'bcdfghjklmnpqrstvwxz'[i % 20]}{'bcdfghjklmnpqrstvwxz'[(i // 20) % 20]}xzw"
    gpus.append((u, f"node-{m}{i // 8:05d}", mib, pod, w))
def mem(g, k):  # MiB
    return 2000 + (g[4] % 13) * 700 + (k * 37 + g[4]) % 900
def util(g, k):  # percent
    return 5 + (g[4] % 7) * 3 + (k * 13 + g[4]) % 11
families = [
    ("gpu_slicer_device_memory_total_bytes", lambda g: f'uuid="{g[0]}",kind="gpu",node="{g[1]}"', lambda g, k: g[2] << 20),
    ("gpu_slicer_device_utilization_ratio", lambda g: f'uuid="{g[0]}",node="{g[1]}"', lambda g, k: util(g, k) / 100),
    ("gpu_slicer_pod_device_allocation", lambda g: f'namespace="serving",pod="{g[3]}",container="server",resource="nvidia.com/gpu",device="{g[0]}",node="{g[1]}"', lambda g, k: 1),
    ("gpu_slicer_share_memory_used_bytes", lambda g: f'namespace="serving",pod="{g[3]}",container="server",resource="nvidia.com/gpu",node="{g[1]}"', lambda g, k: mem(g, k) << 20),
]
window = 7200
files = 0
for lo in range(start, end, window):
    ks = [(k, t) for k, t in enumerate(ticks) if lo <= t < lo + window]
    if not ks:
        continue
    with open(f"{wd}/om-{lo}.txt", "w") as f:
        for name, labels, value in families:
            f.write(f"# TYPE {name} gauge\n")
            for g in gpus:
                prefix = f"{name}{{{labels(g)}}} "
                f.write("".join(f"{prefix}{value(g, k)} {t}\n" for k, t in ks))
        f.write("# EOF\n")
    files += 1
print(f"advise-prom-bench: {n} GPUs, {len(ticks)} samples per series, {4 * n} series, {files} files", file=sys.stderr)
PY
t1=$(date +%s.%N)
for f in "$wd"/om-*.txt; do
  promtool tsdb create-blocks-from openmetrics -q "$f" "$wd/data" >/dev/null
  rm -f "$f"
done
t2=$(date +%s.%N)
start_prometheus "$wd" 600
# A Prometheus that has run a while has compacted its 2-hour blocks: wait for its start-up
# compactions to end (the number of loaded blocks steady for 10 s) before timing advise.
t3=$(date +%s.%N)
python3 - "$port" <<'PY'
import re, sys, time, urllib.request
last, since = None, time.time()
while time.time() - since < 10:
    text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
    m = re.search(r"^prometheus_tsdb_blocks_loaded (\S+)$", text, re.M)
    n = m and m.group(1)
    if n != last:
        last, since = n, time.time()
    time.sleep(1)
print(f"advise-prom-bench: {last} blocks after compaction", file=sys.stderr)
PY
t4=$(date +%s.%N)
# Wall time and peak RSS of the advise process (python's rusage of its one child: no
# /usr/bin/time needed).
RUST_LOG=gpu_slicer=debug python3 - "$wd/time" "${BENCH_ADVISE_LOG:-$wd/advise.log}" "$bin" advise \
  --prometheus "http://127.0.0.1:$port" --metrics gpu-slicer --window 7d --at "$end" \
  --query-timeout 600s --summary-json "$wd/summary.json" --output "$wd/plan" \
  --report "$wd/report.html" <<'PY'
import resource, subprocess, sys, time
out, log, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
t = time.monotonic()
with open(log, "w") as err:
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err).returncode
wall = time.monotonic() - t
if rc != 0:
    sys.exit(f"advise-prom-bench: advise exited {rc}: {open(log).read()[-2000:]}")
with open(out, "w") as f:
    f.write(f"{wall:.2f} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\n")
PY
read -r wall rss_kib <"$wd/time"
python3 - "$wd/summary.json" "$gpus" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["gpusBefore"] == int(sys.argv[2]), s["gpusBefore"]
print(f"advise-prom-bench: {s['gpusBefore']} GPUs -> {s['gpusAfter']} (bound {s['lowerBound']}), {len(s['workloads'])} workloads", file=sys.stderr)
PY
blocks=$(find "$wd/data" -maxdepth 1 -name '01*' -type d | wc -l)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v e="$t4" -v n="$gpus" -v s="$step" -v w="$wall" -v r="$rss_kib" -v k="$blocks" 'BEGIN {
  printf "FIGURE|advise --prometheus, %d GPUs x 7 days (1 sample / %d s): wall / peak RSS|%.2f s / %.0f MiB\n", n, s, w, r / 1024
  printf "FIGURE|  its backfill: openmetrics written / promtool / start-up compaction (%d blocks)|%.0f s / %.0f s / %.0f s\n", k, b - a, c - b, e - d
  printf "METHOD|advise-prom-bench: Debian prometheus 2.42 on the same box, series backfilled by promtool in 2-hour blocks (not compacted), advise writing plan, report and summary; wall and ru_maxrss from python\n"
}'
# Where the time goes: each query's time (the log line of the next query, or of the advice).
python3 - "${BENCH_ADVISE_LOG:-$wd/advise.log}" "$bin" <<'PY'
import datetime, re, sys
stamps = []
for line in open(sys.argv[1]):
    m = re.match(r"(\S+Z) DEBUG .*?(?:query=(.*)|advice ready)", line)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        stamps.append((t, m.group(2)))
for (t, q), (u, _) in zip(stamps, stamps[1:]):
    if q:
        print(f"METHOD|advise-prom-bench query {u - t:.2f} s: {q}")
print(f"METHOD|advise-prom-bench binary: {sys.argv[2]}")
PY
