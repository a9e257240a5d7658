#!/usr/bin/env bash
# Build the local cluster's binaries from their pinned Go modules into target/cluster/bin
# (or $CLUSTER_BIN): `kube` (kube-apiserver, controller-manager, scheduler, kubelet and an
# embedded etcd in one multi-call binary, hack/cluster/kube) and the container runtime
# (containerd, its runc shim, ctr, runc, the CNI plugins bridge/host-local/loopback and the
# pod sandbox's pause process, hack/cluster/runtime). Skips a binary that is newer than its
# module's go.mod, go.sum and sources, so a second `hack/cluster.sh up` costs nothing.
#
# Caches: Go modules in $(go env GOMODCACHE), compiled packages in $(go env GOCACHE); both
# survive `hack/cluster.sh down`.
#
#   hack/cluster/build.sh [--force]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${CLUSTER_BIN:-$repo/target/cluster/bin}
force=0
[ "${1:-}" = --force ] && force=1
command -v go >/dev/null || { echo "cluster build: go not found (hack/install-deps.sh installs it)" >&2; exit 1; }
mkdir -p "$out"

# fresh BIN MODULE_DIR: the binary exists and nothing in its module is newer.
fresh() {
  [ "$force" = 0 ] && [ -x "$1" ] && [ -z "$(find "$2" -newer "$1" -type f -print -quit)" ]
}

kube_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit} $1 == "require" && $2 == "k8s.io/kubernetes" {print $3; exit}' "$here/kube/go.mod")
"$here/sync-replaces.sh" --check
if fresh "$out/kube" "$here/kube"; then
  echo "cluster build: kube $kube_version is up to date"
else
  minor=${kube_version#v1.}
  minor=${minor%%.*}
  t0=$(date +%s)
  echo "cluster build: kube $kube_version (apiserver, controller-manager, scheduler, kubelet, etcd); a cold build takes 10-35 min on 2 cores"
  (cd "$here/kube" && go build -trimpath -o "$out/kube.new" -ldflags "-s -w \
    -X k8s.io/component-base/version.gitVersion=$kube_version \
    -X k8s.io/component-base/version.gitMajor=1 \
    -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean" .)
  mv "$out/kube.new" "$out/kube"
  echo "cluster build: kube built in $(($(date +%s) - t0))s"
fi

runtime_bins=(containerd containerd-shim-runc-v2 ctr runc bridge host-local loopback pause)
stale=0
for b in "${runtime_bins[@]}"; do fresh "$out/$b" "$here/runtime" || stale=1; done
if [ "$stale" = 0 ]; then
  echo "cluster build: container runtime is up to date"
else
  t0=$(date +%s)
  containerd_version=$(awk '$1 == "github.com/containerd/containerd/v2" {print $2; exit}' "$here/runtime/go.mod")
  runc_version=$(awk '$1 == "github.com/opencontainers/runc" {print $2; exit}' "$here/runtime/go.mod")
  echo "cluster build: containerd $containerd_version, runc $runc_version, CNI plugins, pause"
  # runc: cgo for its nsexec; `seccomp` links libseccomp (libseccomp-dev). containerd:
  # no btrfs snapshotter (no libbtrfs headers needed).
  (cd "$here/runtime" && go build -trimpath -tags "seccomp no_btrfs" -o "$out/" -ldflags "-s -w \
    -X github.com/containerd/containerd/v2/version.Version=$containerd_version \
    -X main.version=${runc_version#v}" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr \
    github.com/opencontainers/runc \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/ipam/host-local)
  # The pause process runs as the image's only file: static, no cgo.
  (cd "$here/runtime" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/pause" ./pause)
  for b in "${runtime_bins[@]}"; do touch "$out/$b"; done
  echo "cluster build: runtime built in $(($(date +%s) - t0))s"
fi
