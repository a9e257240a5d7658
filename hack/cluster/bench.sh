#!/usr/bin/env bash
# The cluster tier's figures (issue 30), as FIGURE| lines for hack/bench.sh: the Go build
# (warm: Go's caches as they are; BENCH_CLUSTER=cold: a fresh GOCACHE in a temp dir, modules
# still from GOMODCACHE), `hack/cluster.sh up` and `down`, the cluster's RSS once up (its
# processes summed; shared pages counted twice, so an upper bound), and the disk it uses.
# Needs root and a machine without a kubelet; takes 1-2 min warm, 10-35 min cold.
set -euo pipefail
cd "$(dirname "$0")/../.."
ms() { date +%s%3N; }
gocache=$(go env GOCACHE)
if [ "${BENCH_CLUSTER:-}" = cold ]; then
  gocache=$(mktemp -d /tmp/gs-gocache.XXXXXX)
  trap 'rm -rf "$gocache"' EXIT
fi
t0=$(ms)
GOCACHE=$gocache hack/cluster/build.sh --force >/dev/null
echo "FIGURE|cluster build, $([ "${BENCH_CLUSTER:-1}" = cold ] && echo cold || echo warm) (kube + runtime, hack/cluster/build.sh --force)|$((($(ms) - t0) / 1000)) s"
t0=$(ms)
hack/cluster.sh up >/dev/null 2>&1
echo "FIGURE|hack/cluster.sh up (node Ready, agent rolled out, DRA)|$((($(ms) - t0) / 1000)) s"
root=${CLUSTER_DIR:-/var/lib/gpu-slicer-cluster}
rss=$(ps -eo rss=,args= | awk -v d="$root" '$0 ~ d || / kube (apiserver|etcd|scheduler|controller-manager|kubelet)/ || /containerd-shim|gpu-slicer run/ {s += $1} END {print s + 0}')
echo "FIGURE|cluster RSS once up (processes summed, upper bound)|$((rss / 1024)) MiB"
t0=$(ms)
hack/cluster.sh down >/dev/null 2>&1
echo "FIGURE|hack/cluster.sh down|$((($(ms) - t0) / 1000)) s"
echo "FIGURE|cluster disk: binaries / GOMODCACHE / GOCACHE|$(du -sh target/cluster/bin | cut -f1) / $(du -sh "$(go env GOMODCACHE)" | cut -f1) / $(du -sh "$gocache" | cut -f1)"
echo "METHOD|cluster: one run of each step (wall clock); BENCH_CLUSTER=cold builds with an empty GOCACHE"
