#!/usr/bin/env bash
# A one-node Kubernetes on this machine, as plain processes (no systemd, no Docker), with
# fake GPUs and gpu-slicer deployed from deploy/ as users deploy it.
#
#   hack/cluster.sh up       build what is missing, start everything, deploy the agent
#   hack/cluster.sh down     stop everything and leave nothing behind
#   hack/cluster.sh status   what runs, where its log is
#   hack/cluster.sh env      `export` lines: eval "$(hack/cluster.sh env)" then use kubectl
#   hack/cluster.sh deploy   (re)deploy the agent in $CLUSTER_MODE; removes the other mode's
#   hack/cluster.sh restart COMPONENT   stop one (SIGTERM, SIGKILL after 20 s) and start it again
#
# Start order: etcd (embedded, hack/cluster/kube), kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd, kubelet, then the agent (`kubectl apply -k` of a test overlay
# over deploy/ or deploy/dra/, rendered by hack/cluster/overlay.py into the state dir).
# Kubernetes v1.37 and the container runtime are built from the Go modules under
# hack/cluster/ by hack/cluster/build.sh into target/cluster/bin.
#
# Environment:
#   CLUSTER_DIR    the state directory (default /var/lib/gpu-slicer-cluster): etcd, PKI,
#                  logs, kubelet root, containerd root/state, CDI specs, the fake driver root
#   CLUSTER_MODE   dra (default), device-plugin (deploy/) or label-configs
#                  (deploy/label-configs/): how `up` and `deploy` run the agent
#   GPU_SLICER_BIN the gpu-slicer binary baked into the agent image (default: a dev build)
#
# Network: the bridge gsc0 (10.244.0.1/16) is the only pod network; pods have no DNS, no
# route off the machine (ip_forward stays off, no masquerade), the service range
# 10.96.0.0/16 is blackholed (there is no kube-proxy) and the API server listens on the
# bridge address only. Runs as root.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
. "$REPO/hack/env.sh"

ROOT=${CLUSTER_DIR:-/var/lib/gpu-slicer-cluster}
MODE=${CLUSTER_MODE:-dra}
BIN=${CLUSTER_BIN:-$REPO/target/cluster/bin}
NODE=gpu-node-0
BRIDGE=gsc0
GW=10.244.0.1
POD_CIDR=10.244.0.0/16
SVC_CIDR=10.96.0.0/16
API_PORT=6443
ETCD=127.0.0.1:12379
ETCD_PEER=127.0.0.1:12380
KUBE_VERSION=v1.37.2
AGENT_NS=gpu-slicer
TEST_IMAGE=localhost/gpu-slicer-test:latest
PAUSE_IMAGE=localhost/gpu-slicer-pause:1
CTRD_SOCK=$ROOT/containerd/containerd.sock
# Host paths outside $ROOT that the kubelet and containerd use whatever they are told
# (their own constants); `up` notes which did not exist and `down` removes only those.
# The kubelet's root is the default /var/lib/kubelet, as on a real node: its device manager
# serves /var/lib/kubelet/device-plugins whatever --root-dir says, and a DRA driver's socket
# is registered by the path the driver sees. `up` refuses a machine that has one already.
KUBELET_ROOT=/var/lib/kubelet
HOST_PATHS=(/var/log/containers /var/lib/cni /run/containerd /var/run/netns "$KUBELET_ROOT")

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }
# Bad input exits 2, before anything is touched (and before the root check).
usage() { log "$*"; exit 2; }
case $MODE in dra | device-plugin | label-configs) ;; *) usage "CLUSTER_MODE must be dra, device-plugin or label-configs, not '$MODE'" ;; esac
case ${1:-} in
up | down | status | env | deploy) ;;
restart)
  case ${2:-} in
  etcd | kube-apiserver | kube-controller-manager | kube-scheduler | containerd | kubelet) ;;
  *) usage "restart: name one of etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet, not '${2:-}'" ;;
  esac
  ;;
*) usage "usage: hack/cluster.sh up|down|status|env|deploy|restart COMPONENT" ;;
esac
[ "$(id -u)" = 0 ] || die "must run as root (mounts, the bridge, containerd)"

pidfile() { echo "$ROOT/run/$1.pid"; }
running() { # name
  local p
  p=$(cat "$(pidfile "$1")" 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null
}
# spawn NAME CMD...: a daemon in its own session, its output in logs/NAME.log.
spawn() {
  local name=$1
  shift
  if running "$name"; then return 0; fi
  mkdir -p "$ROOT/run" "$ROOT/logs"
  setsid "$@" >>"$ROOT/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$(pidfile "$name")"
  log "started $name (pid $!, log $ROOT/logs/$name.log)"
}
# wait_for WHAT SECONDS CMD...: poll CMD every 0.5 s.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  die "$what not ready after ${secs}s (logs: $ROOT/logs/)"
}
kc() { kubectl --kubeconfig "$ROOT/pki/admin.kubeconfig" "$@"; }

token() { awk -F, -v u="$1" '$2 == u {print $1}' "$ROOT/pki/tokens.csv"; }
kubeconfig() { # file user
  local t
  t=$(token "$2")
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://$GW:$API_PORT", certificate-authority: "$ROOT/pki/apiserver.crt"}
users:
- name: "$2"
  user: {token: "$t"}
contexts:
- name: local
  context: {cluster: local, user: "$2"}
current-context: local
EOF
  chmod 600 "$1"
}

host_setup() {
  mkdir -p "$ROOT"/{run,logs,pki,etcd,kubelet,cdi,cni/net.d,cni/bin,cni/ipam,containerd,runc,pod-logs}
  if [ ! -f "$ROOT/preexisting" ]; then
    for p in "${HOST_PATHS[@]}"; do [ -e "$p" ] && echo "$p"; done >"$ROOT/preexisting" || true
    ls /var/run/netns 2>/dev/null | sed 's|^|/var/run/netns/|' >>"$ROOT/preexisting" || true
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h" ] && find "$h" -mindepth 1 -maxdepth 1 -type d
    done >"$ROOT/cgroups-before" 2>/dev/null || true
  fi
  if [ -e "$KUBELET_ROOT" ] && ! grep -qx "$KUBELET_ROOT" "$ROOT/made" 2>/dev/null; then
    die "$KUBELET_ROOT exists and this cluster did not make it (another kubelet's?): not sharing it"
  fi
  mkdir -p "$KUBELET_ROOT"
  echo "$KUBELET_ROOT" >"$ROOT/made"
  # The kubelet's root needs shared mount propagation; only that directory gets it.
  if ! mountpoint -q "$KUBELET_ROOT"; then
    mount --bind "$KUBELET_ROOT" "$KUBELET_ROOT"
    mount --make-rshared "$KUBELET_ROOT"
  fi
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$GW/16" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  ip route show type blackhole | grep -q "^blackhole $SVC_CIDR" || ip route add blackhole "$SVC_CIDR"
  for b in bridge host-local loopback; do ln -sf "$BIN/$b" "$ROOT/cni/bin/$b"; done
  cat >"$ROOT/cni/net.d/10-gpu-slicer.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "gpu-slicer-cluster",
  "plugins": [{
    "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "dataDir": "$ROOT/cni/ipam",
             "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GW"}]]}
  }]
}
EOF
  # Identities: one static token each (kube-apiserver --token-auth-file).
  if [ ! -f "$ROOT/pki/tokens.csv" ]; then
    umask 077
    {
      echo "$(openssl rand -hex 16),admin,admin,\"system:masters\""
      echo "$(openssl rand -hex 16),system:node:$NODE,node,\"system:nodes\""
      echo "$(openssl rand -hex 16),system:kube-scheduler,scheduler,"
      echo "$(openssl rand -hex 16),system:kube-controller-manager,controller-manager,"
    } >"$ROOT/pki/tokens.csv"
    openssl genrsa -out "$ROOT/pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$ROOT/pki/sa.key" -pubout -out "$ROOT/pki/sa.pub" 2>/dev/null
    umask 022
  fi
}

start_etcd() {
  spawn etcd "$BIN/kube" etcd --data-dir "$ROOT/etcd" --listen "$ETCD" --listen-peer "$ETCD_PEER"
  wait_for etcd 60 curl -fsS "http://$ETCD/health"
}

start_apiserver() {
  spawn kube-apiserver "$BIN/kube" apiserver \
    --etcd-servers="http://$ETCD" \
    --bind-address="$GW" --advertise-address="$GW" --secure-port="$API_PORT" \
    --cert-dir="$ROOT/pki" \
    --token-auth-file="$ROOT/pki/tokens.csv" \
    --service-account-key-file="$ROOT/pki/sa.pub" \
    --service-account-signing-key-file="$ROOT/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --service-cluster-ip-range="$SVC_CIDR" \
    --endpoint-reconciler-type=none \
    --kubelet-preferred-address-types=InternalIP \
    --profiling=false
  wait_for kube-apiserver 90 curl -fsS --cacert "$ROOT/pki/apiserver.crt" "https://$GW:$API_PORT/readyz"
  kubeconfig "$ROOT/pki/admin.kubeconfig" admin
  kubeconfig "$ROOT/pki/node.kubeconfig" "system:node:$NODE"
  kubeconfig "$ROOT/pki/scheduler.kubeconfig" system:kube-scheduler
  kubeconfig "$ROOT/pki/controller-manager.kubeconfig" system:kube-controller-manager
}

start_control_plane() {
  spawn kube-controller-manager "$BIN/kube" controller-manager \
    --kubeconfig="$ROOT/pki/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$ROOT/pki/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$ROOT/pki/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 \
    --leader-elect=false \
    --use-service-account-credentials \
    --service-account-private-key-file="$ROOT/pki/sa.key" \
    --root-ca-file="$ROOT/pki/apiserver.crt" \
    --profiling=false
  cat >"$ROOT/pki/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "$ROOT/pki/scheduler.kubeconfig"}
leaderElection: {leaderElect: false}
EOF
  spawn kube-scheduler "$BIN/kube" scheduler --config="$ROOT/pki/scheduler.yaml" \
    --authentication-kubeconfig="$ROOT/pki/scheduler.kubeconfig" \
    --authorization-kubeconfig="$ROOT/pki/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --profiling=false
  # The serviceaccount controller makes `default` in each namespace; pods wait for it.
  wait_for "default service account" 60 kc -n default get serviceaccount default
}

start_containerd() {
  cat >"$ROOT/containerd/config.toml" <<EOF
version = 4
root = "$ROOT/containerd/root"
state = "$ROOT/containerd/state"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri"]
[plugins.'io.containerd.server.v1.grpc']
  address = "$CTRD_SOCK"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "$CTRD_SOCK.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$ROOT/containerd/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["$ROOT/cdi"]
  # No CAP_SYS_RESOURCE here: negative oom_score_adj writes would fail.
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$BIN/runc"
        Root = "$ROOT/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$ROOT/cni/bin"]
    conf_dir = "$ROOT/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
EOF
  spawn containerd env PATH="$BIN:$PATH" "$BIN/containerd" --config "$ROOT/containerd/config.toml"
  wait_for containerd 30 "$BIN/ctr" --address "$CTRD_SOCK" version
}

# import_images: pause and test image (hack/cluster/images.sh), the agent image
# (hack/e2e-image.sh, with the same gpu-slicer binary the tests use), into containerd's
# k8s.io namespace.
import_images() {
  local have
  have=$("$BIN/ctr" --address "$CTRD_SOCK" -n k8s.io images ls -q 2>/dev/null || true)
  local agent
  agent=$(awk '$1 == "image:" {print $2}' <(kubectl kustomize "$REPO/deploy") | sort -u | head -1)
  # The archives outlive `down` (target/cluster/images); each is remade when what it is
  # made of is newer.
  local img=$REPO/target/cluster/images bin
  bin=$(gpu_slicer)
  mkdir -p "$img"
  if [ ! -f "$img/test.tar" ] || [ "$BIN/pause" -nt "$img/pause.tar" ] || [ "$(dirname "$bin")/fake-nvidia-smi" -nt "$img/test.tar" ]; then
    "$REPO/hack/cluster/images.sh" "$img" "$PAUSE_IMAGE" "$TEST_IMAGE" "$BIN/pause"
  fi
  if ! grep -qx "$PAUSE_IMAGE" <<<"$have" || ! grep -qx "$TEST_IMAGE" <<<"$have"; then
    ctr_q images import "$img/pause.tar"
    ctr_q images import "$img/test.tar"
  fi
  if [ ! -f "$img/agent.tar" ] || [ "$bin" -nt "$img/agent.tar" ] || [ "$REPO/Containerfile" -nt "$img/agent.tar" ]; then
    log "building the agent image $agent (hack/e2e-image.sh)"
    IMAGE_OCI_ARCHIVE="$img/agent.tar" GPU_SLICER_BIN="$bin" \
      "$REPO/hack/e2e-image.sh" >"$ROOT/logs/agent-image.log" 2>&1 ||
      die "agent image build failed: $ROOT/logs/agent-image.log"
    have=""
  fi
  if ! grep -qx "$agent" <<<"$have"; then
    ctr_q images import "$img/agent.tar"
    AGENT_IMAGE_NEW=1
  fi
}

ctr_q() { "$BIN/ctr" --address "$CTRD_SOCK" -n k8s.io "$@" >/dev/null 2>&1 || die "ctr $* failed"; }

start_kubelet() {
  cat >"$ROOT/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "$GW"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# Test-only: the API server's calls (logs, exec) are not authenticated.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
# This machine: cgroup v1, no systemd, no swap accounting, small disk.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
containerRuntimeEndpoint: "unix://$CTRD_SOCK"
podLogsDir: "$ROOT/pod-logs"
# No DNS in pods: nothing resolves, nothing leaves the machine by name.
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
EOF
  spawn kubelet "$BIN/kube" kubelet \
    --config="$ROOT/kubelet/config.yaml" \
    --kubeconfig="$ROOT/pki/node.kubeconfig" \
    --root-dir="$KUBELET_ROOT" --cert-dir="$ROOT/kubelet/pki" \
    --hostname-override="$NODE" --node-ip="$GW" \
    --node-labels=nvidia.com/gpu.present=true,gpu-slicer.io/gpu=true
  wait_for "node $NODE Ready" 120 node_ready
}
node_ready() {
  [ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# The fake driver: NVML, CUDA and nvidia-smi under a driver root, device nodes (c 1:3)
# inside it, the node description beside them (hack/cluster/node.yaml).
fake_gpus() {
  local fdr=$ROOT/driver-root version
  [ -f "$fdr/.ready" ] && return 0
  rm -rf "$fdr"
  version=$(sed -n 's/^driverVersion: "\(.*\)"$/\1/p' "$REPO/hack/cluster/node.yaml")
  "$REPO/hack/fake-driver-root.sh" "$fdr" "$version" >"$ROOT/logs/fake-driver-root.log" 2>&1 ||
    die "fake driver root failed: $ROOT/logs/fake-driver-root.log"
  "$(gpu_slicer)" cdi generate --backend "sim:$REPO/hack/cluster/node.yaml" --output - 2>/dev/null |
    sed -n 's/^ *- path: \(\/dev\/.*\)$/\1/p' | sort -u | while read -r p; do
    [ "$p" = /dev/nvidia-uvm-tools ] && continue
    mkdir -p "$(dirname "$fdr$p")"
    [ -e "$fdr$p" ] || mknod "$fdr$p" c 1 3
  done
  # The driver's MIG capability minors (NVML does not report them), in a proc root of
  # their own: the agent reads <proc-root>/driver/nvidia-caps/mig-minors.
  mkdir -p "$ROOT/fake-proc/driver/nvidia-caps"
  awk 'BEGIN {
    print "config 1"; print "monitor 2"
    for (g = 0; g < 8; g++) for (gi = 0; gi < 15; gi++) {
      m = 3 + g * 15 * 9 + gi * 9
      printf "gpu%d/gi%d/access %d\n", g, gi, m
      for (ci = 0; ci < 8; ci++) printf "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, m + 1 + ci
    }
  }' >"$ROOT/fake-proc/driver/nvidia-caps/mig-minors"
  # Every capability node the driver lists, as nvidia-modprobe makes them on a MIG node:
  # an instance made on demand is only usable (and only visible to the fake NVML) with its
  # nodes present.
  mkdir -p "$fdr/dev/nvidia-caps"
  awk '{print $2}' "$ROOT/fake-proc/driver/nvidia-caps/mig-minors" | while read -r m; do
    [ -e "$fdr/dev/nvidia-caps/nvidia-cap$m" ] || mknod "$fdr/dev/nvidia-caps/nvidia-cap$m" c 1 3
  done
  mkdir -p "$ROOT/fake-gpu"
  cp "$REPO/hack/cluster/node.yaml" "$ROOT/fake-gpu/node.yaml"
  : >"$ROOT/fake-gpu/limits.json"
  touch "$fdr/.ready"
}
gpu_slicer() {
  if [ -n "${GPU_SLICER_BIN:-}" ]; then echo "$GPU_SLICER_BIN"; return; fi
  [ -x "$REPO/target/debug/gpu-slicer" ] || (cd "$REPO" && cargo build --quiet --bin gpu-slicer)
  echo "$REPO/target/debug/gpu-slicer"
}

deploy_agent() {
  local other
  python3 "$REPO/hack/cluster/overlay.py" --repo "$REPO" --root "$ROOT" --out "$ROOT/overlay" --api "https://$GW:$API_PORT"
  other=$(kc -n "$AGENT_NS" get daemonset gpu-slicer -o jsonpath='{.metadata.annotations.gpu-slicer\.io/cluster-mode}' 2>/dev/null || true)
  if [ -n "$other" ] && [ "$other" != "$MODE" ]; then
    # Only the DaemonSet: the namespace, its config and the RBAC stay for the new mode's
    # apply (deleting the namespace would leave it Terminating under the next apply).
    log "removing the $other agent"
    kc -n "$AGENT_NS" delete daemonset gpu-slicer --wait=true >/dev/null
    kc -n "$AGENT_NS" wait --for=delete pod -l app.kubernetes.io/name=gpu-slicer --timeout=60s >/dev/null 2>&1 || true
  fi
  kc apply -k "$ROOT/overlay/$MODE" >"$ROOT/logs/deploy-$MODE.log"
  # Same tag, new binary (a rebuilt image): pods already running keep the old one otherwise.
  if [ "${AGENT_IMAGE_NEW:-0}" = 1 ]; then
    kc -n "$AGENT_NS" rollout restart daemonset/gpu-slicer >/dev/null
  fi
  kc -n "$AGENT_NS" rollout status daemonset/gpu-slicer --timeout=120s >/dev/null ||
    die "the agent did not become ready: kubectl -n $AGENT_NS describe pods; logs in $ROOT/logs"
  log "agent running in $MODE mode"
}

up() {
  command -v kubectl >/dev/null || die "kubectl missing (hack/install-deps.sh)"
  "$REPO/hack/cluster/build.sh"
  host_setup
  start_etcd
  start_apiserver
  start_control_plane
  start_containerd
  fake_gpus
  import_images
  start_kubelet
  deploy_agent
  log "up: eval \"\$(hack/cluster.sh env)\"; kubectl get nodes"
}

# stop NAME: SIGTERM, up to 20 s, then SIGKILL.
stop() {
  local p i
  p=$(cat "$(pidfile "$1")" 2>/dev/null) || return 0
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$p" 2>/dev/null || true
  fi
  rm -f "$(pidfile "$1")"
}

down() {
  [ -d "$ROOT" ] || { log "down: nothing at $ROOT"; return 0; }
  stop kubelet
  # Containers first, while containerd can still stop them; then whatever is left of
  # them (shims, pause, workloads) by the state dir their command lines name.
  if running containerd; then
    for ns in k8s.io; do
      for t in $("$BIN/ctr" --address "$CTRD_SOCK" -n "$ns" tasks ls -q 2>/dev/null); do
        "$BIN/ctr" --address "$CTRD_SOCK" -n "$ns" tasks kill -s KILL "$t" >/dev/null 2>&1 || true
      done
    done
  fi
  stop containerd
  stop kube-scheduler
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
  local pids
  pids=$(pgrep -f "containerd-shim-runc-v2 .*$ROOT|$ROOT/" || true)
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  # Every process still in a cgroup the cluster made.
  cgroups_new | while read -r cg; do
    cat "$cg/cgroup.procs" 2>/dev/null
  done | sort -u | xargs -r kill -KILL 2>/dev/null || true
  sleep 0.2
  # Mounts under the state dir and the network namespaces the pods had, deepest first.
  awk '{print $5}' /proc/self/mountinfo | grep -E "^($ROOT/|$ROOT\$|$KUBELET_ROOT/|$KUBELET_ROOT\$|/run/netns/cni-|/var/run/netns/cni-)" |
    sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  cgroups_new | sort -r | while read -r cg; do
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  ip route del blackhole "$SVC_CIDR" 2>/dev/null || true
  if [ -f "$ROOT/preexisting" ]; then
    for p in "${HOST_PATHS[@]}"; do
      grep -qx "$p" "$ROOT/preexisting" || rm -rf "$p"
    done
    for n in /var/run/netns/*; do
      [ -e "$n" ] || continue
      grep -qx "$n" "$ROOT/preexisting" || rm -f "$n"
    done
  fi
  rm -rf "$ROOT"
  log "down: stopped, unmounted, $BRIDGE and the blackhole route removed, $ROOT deleted"
}
cgroups_new() {
  [ -f "$ROOT/cgroups-before" ] || return 0
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] && find "$h" -mindepth 1 -maxdepth 1 -type d
  done 2>/dev/null | grep -vxF -f "$ROOT/cgroups-before" || true
}

status() {
  [ -d "$ROOT" ] || { echo "no cluster at $ROOT"; return 1; }
  local n rc=0
  for n in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet; do
    if running "$n"; then
      printf '%-24s running  pid %-8s log %s\n' "$n" "$(cat "$(pidfile "$n")")" "$ROOT/logs/$n.log"
    else
      printf '%-24s stopped               log %s\n' "$n" "$ROOT/logs/$n.log"
      rc=1
    fi
  done
  if running kube-apiserver; then
    kc get node "$NODE" --no-headers 2>/dev/null | awk '{print "node " $1 ": " $2}'
    kc -n "$AGENT_NS" get pods -l app.kubernetes.io/name=gpu-slicer --no-headers 2>/dev/null |
      awk '{print "agent pod " $1 ": " $3}'
  fi
  return $rc
}

env_lines() {
  cat <<EOF
export KUBECONFIG=$ROOT/pki/admin.kubeconfig
export NODE_NAME=$NODE
export CLUSTER_DIR=$ROOT
export CLUSTER_CDI_DIR=$ROOT/cdi
export CLUSTER_KUBELET_DIR=$KUBELET_ROOT
export CLUSTER_BIN=$BIN
export CONTAINERD_ADDRESS=$CTRD_SOCK
EOF
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
env) env_lines ;;
deploy) deploy_agent ;;
restart)
  stop "$2"
  up
  ;;
esac
