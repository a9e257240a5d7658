#!/usr/bin/env bash
# Print every figure the issues ask for, then one figure table: CDI generation scaling,
# device-plugin RPC latencies / restart / start, the scaling curve (1x, 4x, 16x dgx-h100:
# devices advertised vs Allocate, GetPreferredAllocation and CDI spec time), reload and health
# latency, the DRA driver (benches/dra.rs: ResourceSlice build + JSON for dgx-h100 and
# mixed-a100, the NodePrepareResources handler without the API, and NodePrepareResources end
# to end through the kubelet and API-server emulators), and idle RSS (anonymous and
# file-backed apart) and threads of `run`, and of `run --dra` against `gpu-slicer emulate` as
# its API server (slices published, its watch open). Latencies are percentiles over thousands of
# calls; the scaling figures are medians over 3 rounds on fresh daemons; RSS is the median of
# 5 starts. Usage sampling cost: CPU time per sampling round (utime+stime from
# /proc/<pid>/stat over 10 s at --usage-interval 100ms, minus the same daemon with sampling
# off) and RSS, on dgx-h100 with 32 GPU processes whose cgroup files sit in a fake proc root.
# The end-to-end figures (benches/socket.rs) run the built daemon on `--backend nvml` with the fake
# libnvidia-ml (dgx-h100, 64 replicas per GPU = 512 devices, usage sampling off) against a Rust
# client on one current-thread runtime over the real unix socket: process start -> first Register,
# a no-op RPC, Allocate of 1 and 4 replicas, GetPreferredAllocation, "own cost" = p50(Allocate) -
# p50(no-op), the daemon's CPU per call (schedstat over a batch), XID written to the fake's event
# file -> first Unhealthy ListAndWatch frame, and the in-process figures beside them.
# Topology (benches/topology.rs): in-process GetPreferredAllocation on 8 and 16 GPUs for sizes
# 1, 2, 3, 4, 8, and topology discovery on the fake NVML with and without a per-call delay.
# BENCH_BASELINE=<another gpu-slicer build> (e.g. main's, built in release) makes the socket bench
# measure that build too, alternating with this one start by start and run by run, and print
# the issue-24 table with both columns and their ratio; BENCH_RUNS=<n> sets the runs per build.
# BENCH_NVIDIA=<nvidia-device-plugin binary> (NVIDIA's k8s-device-plugin, built apart from this
# project, never vendored) adds it as a further column of the same alternating run, on the same
# fake NVML, node and time-slicing config (root: it runs in a private mount namespace so its fixed
# plugin directory can be bound to the bench's).
# BENCH_CALLGRIND=<dir> cargo bench --bench socket: instruction profiles of the start path to the
# first Register, of Allocate (1 and 4 replicas), a no-op RPC and XID rounds, under callgrind.
# BENCH_QUICK=1 runs fewer calls, only the socket bench's end-to-end figures and the idle RSS
# (3 starts), and skips the usage-sampling runs (about a minute instead of several).
# BENCH_CLUSTER=1 (or =cold) adds the cluster tier's build, up, down, RSS and disk figures
# (hack/cluster/bench.sh; root). BENCH_ADVISE_PROM=1 (10 000 GPUs) or =<n> GPUs adds
# `advise --prometheus` on a week backfilled into a real Prometheus (hack/advise-prom-bench.sh;
# minutes to hours, GiB of /tmp: see its figures in docs/src/advise.md). Each bench's
# method lines (METHOD|) are printed under the table.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/idle-run.sh

wd=$(mktemp -d /tmp/gs-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$wd"' EXIT

benches=(cdi plugin socket reload health scaling usage topology dra dra_claims advise)
starts=5
if [ -n "${BENCH_QUICK:-}" ]; then
  benches=(socket topology dra)
  starts=3
fi
for bench in "${benches[@]}"; do
  cargo bench -q --bench "$bench" | tee -a "$wd/figures.log"
done
cargo build --release --bin gpu-slicer -q
# `emulate` (the API server of the DRA start below) is test support, left out of the release
# binary: a debug build with the testkit feature runs it; only the agent's figures are taken.
cargo build --features testkit --bin gpu-slicer -q

mkdir -p "$wd/dp" "$wd/cdi"
# "VmRSS RssAnon RssFile Threads" of a pid, in KiB (threads a count).
memory_of() { awk '/^(VmRSS|RssAnon|RssFile|Threads):/ {printf "%s ", $2} END {print ""}' "/proc/$1/status"; }
samples=()
stops=()
for _ in $(seq "$starts"); do
  # As deployed: HTTP endpoint on and the ledger running (hack/idle-run.sh).
  idle_run target/release/gpu-slicer "$wd"
  sleep 1
  samples+=("$(memory_of "$pid")")
  t0=$(date +%s%N)
  kill -TERM "$pid"
  wait "$pid" || true
  stops+=("$(( ($(date +%s%N) - t0) / 1000000 ))")
done
mid=$(( (starts + 1) / 2 ))
read -r median anon file threads < <(printf '%s\n' "${samples[@]}" | sort -n | sed -n "${mid}p")

# The same start in DRA mode, `gpu-slicer emulate` as its API server (fed from a FIFO that
# stays open until `quit`).
mkfifo "$wd/emu.in"
exec 8<>"$wd/emu.in"
target/debug/gpu-slicer emulate --dir "$wd/emu" <"$wd/emu.in" >"$wd/emu.out" 2>&1 &
emu_pid=$!
for _ in $(seq 200); do [ -s "$wd/emu.out" ] && break; sleep 0.05; done
dra_args=(--dra --node-name node-a --kubeconfig "$wd/emu/kubeconfig"
  --kubelet-registry-dir "$wd/registry" --kubelet-plugins-dir "$wd/plugins")
dra_samples=()
for _ in $(seq "$starts"); do
  idle_run target/release/gpu-slicer "$wd" "${dra_args[@]}"
  sleep 1
  dra_samples+=("$(memory_of "$pid")")
  kill -TERM "$pid"
  wait "$pid" || true
done
echo quit >&8
exec 8>&-
wait "$emu_pid" || true
read -r dra_median dra_anon dra_file dra_threads < <(printf '%s\n' "${dra_samples[@]}" | sort -n | sed -n "${mid}p")
{
  echo "FIGURE|idle run RSS (sim:mixed-a100, median of $starts starts)|${median} KiB (anon ${anon}, file ${file})"
  echo "FIGURE|idle run threads|${threads}"
  echo "FIGURE|idle run --dra RSS, slices published to the API emulator (median of $starts)|${dra_median} KiB (anon ${dra_anon}, file ${dra_file}): $((dra_median - median)) KiB more (anon $((dra_anon - anon)), file $((dra_file - file)))"
  echo "FIGURE|idle run --dra threads|${dra_threads} ($((dra_threads - threads)) more)"
  echo "METHOD|idle RSS: VmRSS, RssAnon, RssFile and Threads from /proc/<pid>/status 1 s after the start is idle (hack/idle-run.sh: sim:mixed-a100, time-slicing, HTTP and ledger on); run --dra the same with its kubeconfig on \`gpu-slicer emulate\` (another process), the median start by VmRSS"
  echo "FIGURE|SIGTERM -> exit of idle run (median of $starts)|$(printf '%s\n' "${stops[@]}" | sort -n | sed -n "${mid}p") ms"
  echo "FIGURE|release binary size|$(stat -c %s target/release/gpu-slicer) bytes"
} >>"$wd/figures.log"

# Usage sampling: dgx-h100 with 4 processes per GPU (cgroup files shaped like a kubelet's).
usage_node=$wd/usage-node.yaml
[ -n "${BENCH_QUICK:-}" ] || {
  sed -n '/^gpus:/,$p' hack/nodes/dgx-h100.yaml | sed '/^events:/,$d'
  echo "usage:"
  echo "  devices:"
  for g in 0 1 2 3 4 5 6 7; do
    echo "    GPU-4a1f3c2e-8b7d-4e6f-9a0b-1c2d3e4f500$g:"
    echo "      utilizationPercent: 40"
    echo "      processes:"
    for p in 0 1 2 3; do
      pid=$((1000 + g * 10 + p))
      echo "      - {pid: $pid, memoryMiB: 1024}"
      mkdir -p "$wd/proc/$pid"
      printf '0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope\n' \
        "0000000$g-0000-4000-8000-00000000000$p" "$(printf '%064d' "$pid")" >"$wd/proc/$pid/cgroup"
    done
  done
} >"$usage_node"
printf 'sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n' >"$wd/usage-config.yaml"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
usage_run() { # $1: --usage-interval; prints "ticks-over-10s rss-KiB"
  rm -rf "$wd/udp" && mkdir -p "$wd/udp"
  target/release/gpu-slicer run --backend "sim:$usage_node" --config "$wd/usage-config.yaml" \
    --device-plugin-dir "$wd/udp" --cdi-dir "$wd/cdi" --state-dir "" --http-listen 127.0.0.1:0 \
    --pod-resources-socket "" --proc-root "$wd/proc" --usage-interval "$1" >"$wd/usage.log" 2>&1 &
  local pid=$!
  sleep 2
  local t0
  t0=$(cpu_ticks "$pid")
  sleep 10
  echo "$(( $(cpu_ticks "$pid") - t0 )) $(awk '/VmRSS/ {print $2}' "/proc/$pid/status")"
  kill -TERM "$pid"
  wait "$pid" || true
}
if [ -z "${BENCH_QUICK:-}" ]; then
read -r on_ticks on_rss < <(usage_run 100ms)
read -r off_ticks off_rss < <(usage_run 0)
hz=$(getconf CLK_TCK)
{
  echo "FIGURE|usage sampling CPU per round (sim dgx-h100, 32 processes; 100 rounds in 10 s)|$(awk -v a="$on_ticks" -v b="$off_ticks" -v hz="$hz" 'BEGIN { printf "%.2f ms", (a - b) * 1000 / hz / 100 }')"
  echo "FIGURE|run RSS with usage sampling on / off|${on_rss} KiB / ${off_rss} KiB"
} >>"$wd/figures.log"
fi

# The cluster tier (opt-in: root, minutes): BENCH_CLUSTER=1 (warm Go caches) or =cold.
if [ -n "${BENCH_CLUSTER:-}" ]; then
  hack/cluster/bench.sh | tee -a "$wd/figures.log"
fi

# advise on a real Prometheus at fleet scale (opt-in: long).
if [ -n "${BENCH_ADVISE_PROM:-}" ]; then
  advise_gpus=$BENCH_ADVISE_PROM
  [ "$advise_gpus" = 1 ] && advise_gpus=10000
  GPUS=$advise_gpus hack/advise-prom-bench.sh | tee -a "$wd/figures.log"
fi

cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
echo
echo "== gpu-slicer figures: $(nproc) CPUs visible ($cpu), $(uname -sr) =="
grep '^FIGURE|' "$wd/figures.log" | cut -d'|' -f2- | awk -F'|' '{ printf "%-62s %s\n", $1, $2 }'
echo
echo "== method =="
grep '^METHOD|' "$wd/figures.log" | cut -d'|' -f2- | sed 's/^/- /'
