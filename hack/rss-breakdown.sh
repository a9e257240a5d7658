#!/usr/bin/env bash
# Where the idle `run` daemon's resident memory goes: the same start as hack/bench.sh's RSS
# figure (sim:mixed-a100, time-slicing, HTTP and ledger on), then
#  1. /proc/<pid>/smaps summed by mapping: the binary's own pages, each shared library, the
#     brk heap, anonymous mappings (thread stacks, allocator arenas) and the main stack;
#  2. a heap profile of the same start under valgrind massif (the peak, the tree kept for
#     ms_print), when valgrind is installed.
# Usage: hack/rss-breakdown.sh [--dra] [binary]   (default target/release/gpu-slicer, built if
# absent). --dra starts `run --dra` instead, its kubeconfig pointing at a closed local port (the
# slice publisher waits in its retry backoff), for the DRA mode's cost against plain `run`.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/idle-run.sh
dra=()
if [ "${1:-}" = --dra ]; then
  dra=(--dra)
  shift
fi
bin=${1:-target/release/gpu-slicer}
if [ "$bin" = target/release/gpu-slicer ] && [ ! -x "$bin" ]; then
  cargo build --release --bin gpu-slicer -q
fi
wd=$(mktemp -d)
trap 'rm -rf "$wd"' EXIT
if [ ${#dra[@]} -gt 0 ]; then
  cat >"$wd/kubeconfig" <<'YAML'
apiVersion: v1
kind: Config
clusters: [{name: closed, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: closed, context: {cluster: closed, user: none}}]
current-context: closed
YAML
  dra=(--dra --node-name node-a --kubeconfig "$wd/kubeconfig"
    --kubelet-registry-dir "$wd/registry" --kubelet-plugins-dir "$wd/plugins")
fi

idle_run "$bin" "$wd" ${dra[@]+"${dra[@]}"}
sleep 1
echo "== $bin ${dra[*]:0:1}: VmRSS $(awk '/VmRSS/ {print $2}' /proc/$pid/status) KiB," \
  "threads $(awk '/Threads/ {print $2}' /proc/$pid/status)"
awk -v exe="$(readlink -f "$bin")" '
  /^[0-9a-f]+-[0-9a-f]+ / {
    path = $6
    if (path == exe) cat = "binary (text, rodata, data)"
    else if (path ~ /\.so/) { n = split(path, p, "/"); cat = "lib " p[n] }
    else if (path == "[heap]") cat = "[heap] (brk)"
    else if (path == "[stack]") cat = "[stack] (main thread)"
    else if (path == "") cat = "anonymous (thread stacks, mmap arenas)"
    else cat = path
    next
  }
  /^Rss:/ { rss[cat] += $2 }
  /^Anonymous:/ { anon[cat] += $2 }
  END {
    for (c in rss) if (rss[c] > 0) printf "%8d KiB  (anon %6d)  %s\n", rss[c], anon[c], c
  }' "/proc/$pid/smaps" | sort -rn
kill -TERM "$pid"
wait "$pid" || true

if ! command -v valgrind >/dev/null; then
  echo "valgrind not installed: no heap profile" >&2
  exit 0
fi
IDLE_RUN_PREFIX="valgrind --tool=massif --massif-out-file=$wd/massif.out --threshold=2 --depth=30" \
  idle_run "$bin" "$wd" ${dra[@]+"${dra[@]}"}
sleep 1
kill -TERM "$pid"
wait "$pid" || true
cp "$wd/massif.out" "${MASSIF_OUT:-/tmp/gpu-slicer-massif.out}"
# The largest snapshot's total (live heap plus allocator overhead); the allocation tree is
# left in MASSIF_OUT for `ms_print`.
ms_print "$wd/massif.out" | awk '
  /^ *[0-9]+ +[0-9,]+ +[0-9,]+ +[0-9,]+ +[0-9,]+ +[0-9,]+$/ {
    gsub(",", "", $3); if ($3 + 0 > peak) { peak = $3 + 0; heap = $4; extra = $5 }
  }
  END { printf "== heap (massif): peak %d B (useful %s B, allocator overhead %s B)\n", peak, heap, extra }'
echo "   full tree: ms_print ${MASSIF_OUT:-/tmp/gpu-slicer-massif.out}"
