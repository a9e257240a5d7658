#!/usr/bin/env bash
# gpu-slicer on a real one-node Kubernetes v1.37 (hack/cluster.sh): the real kube-apiserver,
# kube-scheduler, kube-controller-manager, kubelet and containerd, fake GPUs, the agent
# deployed with `kubectl apply -k` of deploy/dra/ (DRA mode) and then deploy/ (device plugin).
# Each scenario prints PASS or FAIL with its name; a RESULT line ends the run; exit 1 when
# any failed. On failure every component's log is kept under target/cluster-logs/<time>/.
#
#   hack/e2e-cluster.sh          up, every scenario, down
#   hack/e2e-cluster.sh --keep   leave the cluster up afterwards (eval "$(hack/cluster.sh env)")
#   SCENARIOS=regex              run only the scenarios whose name matches
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
keep=0
[ "${1:-}" = --keep ] && keep=1
export CLUSTER_DIR=${CLUSTER_DIR:-/var/lib/gpu-slicer-cluster}
ONLY=${SCENARIOS:-.}
pass=0
fail=0
skipped=0
failed=()
ok() { pass=$((pass + 1)); echo "PASS $1"; }
ko() {
  fail=$((fail + 1))
  failed+=("$1")
  echo "FAIL $1: $2"
}
want() { [[ $1 =~ $ONLY ]] || { skipped=$((skipped + 1)); return 1; }; }

finish() {
  local rc=$?
  [ -z "${MEM_SAMPLER:-}" ] || kill "$MEM_SAMPLER" 2>/dev/null || true
  if [ -f "$REPO/target/cluster-peak-mem" ]; then
    read -r peak rss <"$REPO/target/cluster-peak-mem"
    echo "peak memory: $((peak / 1024)) MiB used above the machine's baseline; cluster processes' RSS at most $((rss / 1024)) MiB"
  fi
  if [ "$fail" -gt 0 ] || [ "$rc" -ne 0 ]; then
    local keepdir
    keepdir=$REPO/target/cluster-logs/$(date +%Y%m%d-%H%M%S)
    mkdir -p "$keepdir"
    cp -r "$CLUSTER_DIR/logs/." "$keepdir/" 2>/dev/null || true
    if [ -f "$CLUSTER_DIR/pki/admin.kubeconfig" ]; then
      k get events -A --sort-by=.lastTimestamp >"$keepdir/events.txt" 2>&1 || true
      k get pods -A -o wide >"$keepdir/pods.txt" 2>&1 || true
      k get resourceslices -o yaml >"$keepdir/resourceslices.yaml" 2>&1 || true
      k get resourceclaims -A -o yaml >"$keepdir/resourceclaims.yaml" 2>&1 || true
      for p in $(k -n gpu-slicer get pods -o name 2>/dev/null); do
        k -n gpu-slicer logs "$p" --all-containers >"$keepdir/agent-${p#pod/}.log" 2>&1 || true
        k -n gpu-slicer logs "$p" --all-containers --previous >"$keepdir/agent-${p#pod/}.previous.log" 2>&1 || true
      done
    fi
    echo "logs kept in $keepdir"
  fi
  [ "$keep" = 1 ] || hack/cluster.sh down >/dev/null 2>&1 || true
}
trap finish EXIT

# Peak memory of the tier: the machine's used memory (MemTotal - MemAvailable) sampled every
# second, above what it was before `up`; and the cluster processes' own RSS at their peak.
used_kib() { awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2} END {print t - a}' /proc/meminfo; }
mem_base=$(used_kib)
(
  peak=0 rss_peak=0
  while sleep 1; do
    u=$(($(used_kib) - mem_base))
    [ "$u" -gt "$peak" ] && peak=$u
    r=$(ps -eo rss=,args= | awk -v d="$CLUSTER_DIR" '$0 ~ d || / kube (apiserver|etcd|scheduler|controller-manager|kubelet)/ || /containerd-shim|gpu-slicer run/ {s += $1} END {print s + 0}')
    [ "$r" -gt "$rss_peak" ] && rss_peak=$r
    echo "$peak $rss_peak" >"$REPO/target/cluster-peak-mem"
  done
) &
MEM_SAMPLER=$!
t0=$(date +%s)
if ! CLUSTER_MODE=dra hack/cluster.sh up; then
  ko "cluster up" "hack/cluster.sh up failed"
  echo "RESULT: $pass passed, $fail failed"
  exit 1
fi
echo "cluster up in $(($(date +%s) - t0))s"
eval "$(hack/cluster.sh env)"
k() { kubectl --kubeconfig "$CLUSTER_DIR/pki/admin.kubeconfig" "$@"; }
BIN=${GPU_SLICER_BIN:-$REPO/target/debug/gpu-slicer}
NODE_FILE=$REPO/hack/cluster/node.yaml
uuid() { sed -n "/^  - index: $1\$/,/uuid:/s/^ *uuid: //p" "$NODE_FILE" | head -1; }
G2=$(uuid 2)
G3=$(uuid 3)
G4=$(uuid 4)
NS=e2e
k create namespace "$NS" >/dev/null 2>&1 || true

# pod NAME [--res RESOURCE N]... [--claim TEMPLATE]...: a test pod (nvidia-smi -L, then sleep) on
# the test image, with the fake NVML's inputs (read-only) and no token, DNS or retries.
pod() {
  local name=$1 limits="" claims="" refs="" cmd='nvidia-smi -L; nvidia-smi; sleep 3600'
  shift
  while [ $# -gt 0 ]; do
    case $1 in
    --res) limits+="        $2: \"$3\"\n"; shift 2 ;;
    --claim)
      claims+="  - name: $2\n    resourceClaimTemplateName: $2\n"
      refs+="      - name: $2\n"
      shift
      ;;
    esac
    shift
  done
  {
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: %s}\nspec:\n' "$name" "$NS"
    printf '  restartPolicy: Never\n  automountServiceAccountToken: false\n  enableServiceLinks: false\n'
    printf '  terminationGracePeriodSeconds: 1\n'
    [ -n "$claims" ] && printf '  resourceClaims:\n%b' "$claims"
    printf '  volumes:\n  - name: fake-gpu\n    hostPath: {path: %s/fake-gpu, type: Directory}\n' "$CLUSTER_DIR"
    printf '  - name: fake-state\n    hostPath: {path: %s/fake-events, type: DirectoryOrCreate}\n' "$CLUSTER_DIR"
    printf '  containers:\n  - name: main\n    image: localhost/gpu-slicer-test:latest\n    imagePullPolicy: Never\n'
    printf '    command: ["sh", "-c", %s]\n' "$(printf '%s' "$cmd" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')"
    printf '    env:\n    - {name: FAKE_NVML_NODE, value: /run/fake-gpu/node.yaml}\n'
    printf '    - {name: FAKE_GPU_DEV_ROOT, value: /}\n    - {name: FAKE_NVML_LIMITS_FILE, value: /run/fake-gpu/limits.json}\n'
    # The driver's MIG state, as every process on a node sees one driver (read-only here).
    printf '    - {name: FAKE_NVML_STATE, value: /run/fake-state/mig-state.json}\n'
    printf '    volumeMounts:\n    - {name: fake-gpu, mountPath: /run/fake-gpu, readOnly: true}\n'
    printf '    - {name: fake-state, mountPath: /run/fake-state, readOnly: true}\n'
    if [ -n "$limits$refs" ]; then
      printf '    resources:\n'
      [ -n "$limits" ] && printf '      limits:\n%b' "$limits"
      [ -n "$refs" ] && printf '      claims:\n%b' "$refs"
    fi
  } | k apply -f - >/dev/null
}
phase_of() { k -n "$NS" get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
# wait_running NAME [SECONDS]: Running with its first output written.
wait_running() {
  local i
  for ((i = 0; i < ${2:-90} * 2; i++)); do
    case $(phase_of "$1") in
    Running) k -n "$NS" logs "$1" 2>/dev/null | grep -q . && return 0 ;;
    Failed | Succeeded) return 1 ;;
    esac
    sleep 0.5
  done
  return 1
}
# wait_pending_reason NAME REGEX: the scheduler's PodScheduled=False message matches.
wait_pending_reason() {
  local i msg
  for ((i = 0; i < 120; i++)); do
    msg=$(k -n "$NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}' 2>/dev/null)
    [[ $msg =~ $2 ]] && { echo "$msg"; return 0; }
    sleep 0.5
  done
  echo "phase $(phase_of "$1"), PodScheduled: ${msg:-none}"
  return 1
}
gpus_seen() { k -n "$NS" logs "$1" 2>/dev/null | grep -oE '(GPU|MIG)-[0-9a-f-]{36}' | sort -u | tr '\n' ' '; }
# nvidia-smi -L lists a MIG device under its parent GPU's line: the MIG UUIDs alone.
migs_seen() { gpus_seen "$1" | tr ' ' '\n' | grep '^MIG-' | tr '\n' ' '; }
why() { echo "phase $(phase_of "$1"); $(k -n "$NS" describe pod "$1" 2>&1 | sed -n '/^Events:/,$p' | tail -5 | tr -s ' ' | tr '\n' ';') logs: $(k -n "$NS" logs "$1" 2>&1 | head -8 | tr '\n' ';')"; }
delete_pods() { k -n "$NS" delete pod "$@" --wait=true --timeout=60s >/dev/null 2>&1 || true; }
alloc() { k get node "$NODE_NAME" -o jsonpath="{.status.allocatable['${1//./\\.}']}"; }
agent_pod() { k -n gpu-slicer get pods -l app.kubernetes.io/name=gpu-slicer -o jsonpath='{.items[0].metadata.name}'; }

# ============================== DRA mode ==============================

slices_json() { k get resourceslices -o json; }
dra_devices() { slices_json | python3 -c 'import json,sys; print(sum(len(s["spec"].get("devices",[])) for s in json.load(sys.stdin)["items"] if s["spec"]["driver"]=="gpu-slicer.io"))'; }
if want "dra: the API server accepts the slices and classes"; then
  # The config running is deploy/dra/config.yaml as shipped (overlay.py keeps it).
  expect=$("$BIN" dra slices --backend "sim:$NODE_FILE" --node-name "$NODE_NAME" \
    --config <(k -n gpu-slicer get configmap gpu-slicer-config -o jsonpath='{.data.config\.yaml}') 2>/dev/null |
    python3 -c 'import sys,yaml; print(sum(len(o["spec"].get("devices",[])) for o in yaml.safe_load_all(sys.stdin) if o and o.get("kind")=="ResourceSlice"))')
  got=0
  for i in $(seq 1 60); do
    got=$(dra_devices 2>/dev/null || echo 0)
    [ "$got" = "$expect" ] && break
    sleep 1
  done
  classes=$(k get deviceclasses -o name | tr '\n' ' ')
  if [ -n "$expect" ] && [ "$got" = "$expect" ] && [[ $classes == *gpu.gpu-slicer.io* ]]; then
    ok "dra: the API server accepts the slices and classes ($got devices; $classes)"
  else
    ko "dra: the API server accepts the slices and classes" "devices published $got, expected $expect; classes [$classes]"
  fi
fi

# The real deploy/dra/examples, all at once, on the node deploy/dra's own config makes: every
# pod is scheduled and runs with what it asked for. The test overlay changes only what this
# cluster needs of a pod (the test image, as nothing is pulled here, and the fake driver's
# inputs); claims, selectors and commands are the examples' own.
if want "dra: every example of deploy/dra/examples runs as it says"; then
  EXD=$CLUSTER_DIR/examples
  mkdir -p "$EXD"
  cat >"$EXD/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$REPO/deploy/dra/examples" "$EXD")
patches:
- target: {kind: Pod}
  patch: |
    apiVersion: v1
    kind: Pod
    metadata: {name: any}
    spec:
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: 1
      volumes:
      - {name: fake-gpu, hostPath: {path: $CLUSTER_DIR/fake-gpu, type: Directory}}
      - {name: fake-state, hostPath: {path: $CLUSTER_DIR/fake-events, type: DirectoryOrCreate}}
      containers:
      - name: cuda
        image: localhost/gpu-slicer-test:latest
        imagePullPolicy: Never
        env:
        - {name: FAKE_NVML_NODE, value: /run/fake-gpu/node.yaml}
        - {name: FAKE_GPU_DEV_ROOT, value: /}
        - {name: FAKE_NVML_LIMITS_FILE, value: /run/fake-gpu/limits.json}
        - {name: FAKE_NVML_STATE, value: /run/fake-state/mig-state.json}
        volumeMounts:
        - {name: fake-gpu, mountPath: /run/fake-gpu, readOnly: true}
        - {name: fake-state, mountPath: /run/fake-state, readOnly: true}
EOF
  ek() { k -n gpu-demo "$@"; }
  expods=$(k kustomize "$REPO/deploy/dra/examples" | python3 -c 'import sys,yaml; print(" ".join(o["metadata"]["name"] for o in yaml.safe_load_all(sys.stdin) if o and o["kind"]=="Pod"))')
  if ! out=$(k apply -k "$EXD" 2>&1); then
    ko "dra: every example of deploy/dra/examples runs as it says" "apply: $out"
  else
    # Each runs its nvidia-smi and exits: Succeeded with its output, or a reason.
    bad=()
    for p in $expods; do
      ph=""
      for ((i = 0; i < 240; i++)); do
        ph=$(ek get pod "$p" -o jsonpath='{.status.phase}' 2>/dev/null)
        [[ $ph == Succeeded || $ph == Failed ]] && break
        sleep 0.5
      done
      [ "$ph" = Succeeded ] || bad+=("$p: ${ph:-no phase} $(ek get pod "$p" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}') $(ek describe pod "$p" 2>&1 | sed -n '/^Events:/,$p' | tail -3 | tr -s ' ' | tr '\n' ';')")
    done
    uuids() { ek logs "$1" 2>/dev/null | grep -oE "${2:-GPU}-[0-9a-f-]{36}" | sort -u | tr '\n' ' '; }
    G0=$(uuid 0)
    whole=$(uuids whole-gpu) two=$(uuids two-gpus) ext=$(uuids extended-resource)
    premade=$(uuids mig-1g10gb MIG) made=$(uuids mig-on-demand MIG) made_on=$(uuids mig-on-demand)
    share=$(uuids share-10gi-25pct) share_log=$(ek logs share-10gi-25pct 2>&1)
    # Whole GPUs: one, two and one, none of them GPU 4 (shared) or GPU 0 (MIG on demand).
    for v in "whole-gpu:1:$whole" "two-gpus:2:$two" "extended-resource:1:$ext"; do
      IFS=: read -r p n seen <<<"$v"
      [ "$(wc -w <<<"$seen")" = "$n" ] && [[ $seen != *"$G4"* && $seen != *"$G0"* ]] || bad+=("$p saw [$seen], want $n whole GPU(s)")
    done
    [ "$(wc -w <<<"$premade")" = 1 ] || bad+=("mig-1g10gb saw MIG devices [$premade], want one")
    # The on-demand slice: one MIG device under GPU 0, made for the claim (none of the node
    # file's MIG devices; its claim went with the finished pod).
    [ "$(wc -w <<<"$made")" = 1 ] && [[ $made_on == *"$G0"* ]] && ! grep -q "${made% }" "$NODE_FILE" ||
      bad+=("mig-on-demand saw [$made] under [$made_on]")
    # The share: GPU 4, its memory bound to the 10 GiB asked for (the fake NVML's view of it).
    [ "$share" = "$G4 " ] && grep -q 'total 10737418240' <<<"$share_log" ||
      bad+=("share-10gi-25pct saw [$share]; memory: $(grep -m2 -i total <<<"$share_log" | tr -s ' ' | tr '\n' ';')")
    if [ ${#bad[@]} = 0 ]; then
      ok "dra: every example of deploy/dra/examples runs as it says ($(wc -w <<<"$expods") pods; whole $whole; pair $two; extended $ext; MIG $premade; on demand $made; share on GPU 4 with $(grep -m1 -oE 'total [0-9]+' <<<"$share_log"))"
    else
      ko "dra: every example of deploy/dra/examples runs as it says" "$(printf '%s | ' "${bad[@]}")"
    fi
  fi
  k delete -k "$EXD" --wait=true --timeout=90s >/dev/null 2>&1 || true
fi

# template NAME CLASS [--cel EXPR] [--count N] [--match ATTR] [--memory Q]
template() {
  local name=$1 class=$2 cel="" count=1 match="" mem=""
  shift 2
  while [ $# -gt 0 ]; do
    case $1 in
    --cel) cel=$2 ;; --count) count=$2 ;; --match) match=$2 ;; --memory) mem=$2 ;;
    esac
    shift 2
  done
  {
    printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: %s, namespace: %s}\n' "$name" "$NS"
    printf 'spec:\n  spec:\n    devices:\n      requests:\n      - name: r\n        exactly:\n'
    printf '          deviceClassName: %s\n          allocationMode: ExactCount\n          count: %s\n' "$class" "$count"
    [ -n "$cel" ] && printf '          selectors:\n          - cel:\n              expression: %s\n' "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$cel")"
    [ -n "$mem" ] && printf '          capacity:\n            requests:\n              memory: %s\n' "$mem"
    [ -n "$match" ] && printf '      constraints:\n      - requests: ["r"]\n        matchAttribute: %s\n' "$match"
  } | k apply -f - >/dev/null
}
claim_of() { k -n "$NS" get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
claim_devices() { k -n "$NS" get resourceclaim "$1" -o jsonpath='{range .status.allocation.devices.results[*]}{.device}{" "}{end}'; }

if want "dra: a whole GPU chosen by a CEL selector"; then
  template whole gpu.gpu-slicer.io --cel "device.attributes['gpu-slicer.io'].productName.startsWith('NVIDIA A100') && !device.allowMultipleAllocations"
  pod dra-whole --claim whole
  if wait_running dra-whole; then
    seen=$(gpus_seen dra-whole)
    c=$(claim_of dra-whole)
    devs=$(claim_devices "$c")
    [ "$(wc -w <<<"$seen")" = 1 ] && [[ $seen == GPU-* ]] && [ "$(wc -w <<<"$devs")" = 1 ] &&
      ok "dra: a whole GPU chosen by a CEL selector ($devs -> $seen)" ||
      ko "dra: a whole GPU chosen by a CEL selector" "allocated [$devs], pod saw [$seen]"
  else
    ko "dra: a whole GPU chosen by a CEL selector" "$(why dra-whole)"
  fi
fi

if want "dra: a MIG 1g.10gb"; then
  template mig mig.gpu-slicer.io --cel "device.attributes['gpu-slicer.io'].profile == '1g.10gb' && !device.attributes['gpu-slicer.io'].onDemand"
  pod dra-mig --claim mig
  if wait_running dra-mig; then
    seen=$(migs_seen dra-mig)
    devs=$(claim_devices "$(claim_of dra-mig)")
    [ "$(wc -w <<<"$seen")" = 1 ] && [ "$(gpus_seen dra-mig | wc -w)" = 2 ] && [[ $devs == *1g10gb* ]] &&
      ok "dra: a MIG 1g.10gb ($devs -> $seen)" ||
      ko "dra: a MIG 1g.10gb" "allocated [$devs], pod saw [$seen]"
  else
    ko "dra: a MIG 1g.10gb" "$(why dra-mig)"
  fi
fi

if want "dra: two GPUs matched on nvlinkDomain"; then
  template nvl-pair gpu.gpu-slicer.io --count 2 --match gpu-slicer.io/nvlinkDomain \
    --cel "!device.allowMultipleAllocations"
  # dra-whole may hold GPU 2 or 3: the pair needs both, so it goes first when it does.
  delete_pods dra-whole
  pod dra-pair --claim nvl-pair
  if wait_running dra-pair; then
    seen=$(gpus_seen dra-pair)
    want_seen=$(printf '%s\n' "$G2" "$G3" | sort | tr '\n' ' ')
    [ "$seen" = "$want_seen" ] && ok "dra: two GPUs matched on nvlinkDomain (GPUs 2 and 3: $seen)" ||
      ko "dra: two GPUs matched on nvlinkDomain" "pod saw [$seen], want [$want_seen] (allocated $(claim_devices "$(claim_of dra-pair)"))"
  else
    ko "dra: two GPUs matched on nvlinkDomain" "$(why dra-pair)"
  fi
fi

if want "dra: consumable capacity: two 30Gi claims share one GPU, a third waits"; then
  template share30 gpu.gpu-slicer.io --cel "device.allowMultipleAllocations" --memory 30Gi
  pod dra-share-a --claim share30
  pod dra-share-b --claim share30
  if wait_running dra-share-a && wait_running dra-share-b; then
    pod dra-share-c --claim share30
    msg=$(wait_pending_reason dra-share-c 'cannot allocate all claims|resourceclaim')
    da=$(claim_devices "$(claim_of dra-share-a)")
    db=$(claim_devices "$(claim_of dra-share-b)")
    if [ "$da" = "$db" ] && [ "$(gpus_seen dra-share-a)" = "$G4 " ] && [ "$(phase_of dra-share-c)" = Pending ] && [ -n "$msg" ]; then
      ok "dra: consumable capacity: two 30Gi claims share one GPU, a third waits ($da; third: $msg)"
    else
      ko "dra: consumable capacity: two 30Gi claims share one GPU, a third waits" "a on [$da] saw [$(gpus_seen dra-share-a)], b on [$db]; c $(phase_of dra-share-c): $msg"
    fi
  else
    ko "dra: consumable capacity: two 30Gi claims share one GPU, a third waits" "$(why dra-share-a) / $(why dra-share-b)"
  fi
  delete_pods dra-share-a dra-share-b dra-share-c
fi

if want "dra: a MIG device made on demand"; then
  template ondemand mig.gpu-slicer.io --cel "device.attributes['gpu-slicer.io'].profile == '1g.10gb' && device.attributes['gpu-slicer.io'].onDemand"
  pod dra-ondemand --claim ondemand
  if wait_running dra-ondemand; then
    seen=$(migs_seen dra-ondemand)
    devs=$(claim_devices "$(claim_of dra-ondemand)")
    [ "$(wc -w <<<"$seen")" = 1 ] && [ "$(gpus_seen dra-ondemand | wc -w)" = 2 ] &&
      ok "dra: a MIG device made on demand ($devs -> $seen)" ||
      ko "dra: a MIG device made on demand" "allocated [$devs], pod saw [$seen]"
  else
    ko "dra: a MIG device made on demand" "$(why dra-ondemand)"
  fi
fi

if want "dra: a plain nvidia.com/gpu pod through extendedResourceName"; then
  pod dra-extended --res nvidia.com/gpu 1
  if wait_running dra-extended; then
    seen=$(gpus_seen dra-extended)
    [ "$(wc -w <<<"$seen")" = 1 ] && ok "dra: a plain nvidia.com/gpu pod through extendedResourceName (saw $seen)" ||
      ko "dra: a plain nvidia.com/gpu pod through extendedResourceName" "saw [$seen]"
  else
    ko "dra: a plain nvidia.com/gpu pod through extendedResourceName" "$(why dra-extended)"
  fi
fi

if want "dra: status.devices is written"; then
  c=$(claim_of dra-mig)
  st=$(k -n "$NS" get resourceclaim "$c" -o jsonpath='{range .status.devices[*]}{.driver}/{.device}{" "}{end}' 2>/dev/null)
  [[ $st == gpu-slicer.io/* ]] && ok "dra: status.devices is written ($st)" ||
    ko "dra: status.devices is written" "claim $c status.devices [$st]"
fi

if want "dra: deleting a pod unprepares its claim and removes its spec"; then
  c=$(claim_of dra-mig)
  cuid=$(k -n "$NS" get resourceclaim "$c" -o jsonpath='{.metadata.uid}' 2>/dev/null)
  spec_before=$(ls "$CLUSTER_CDI_DIR" | grep -c "$cuid")
  delete_pods dra-mig
  gone=0
  for i in $(seq 1 60); do
    if ! ls "$CLUSTER_CDI_DIR" | grep -q "$cuid" && ! k -n "$NS" get resourceclaim "$c" >/dev/null 2>&1; then gone=1; break; fi
    sleep 0.5
  done
  [ "$spec_before" -ge 1 ] && [ "$gone" = 1 ] &&
    ok "dra: deleting a pod unprepares its claim and removes its spec (claim $c)" ||
    ko "dra: deleting a pod unprepares its claim and removes its spec" "spec files before: $spec_before; after: $(ls "$CLUSTER_CDI_DIR" | grep "$cuid"); claim: $(k -n "$NS" get resourceclaim "$c" -o name 2>&1)"
fi

# ============================== least privilege ==============================
if want "rbac: the agent's token cannot write another node's slice or another driver's"; then
  ap=$(agent_pod)
  apuid=$(k -n gpu-slicer get pod "$ap" -o jsonpath='{.metadata.uid}')
  tok=$(k -n gpu-slicer create token gpu-slicer --bound-object-kind Pod --bound-object-name "$ap" --bound-object-uid "$apuid" --duration 10m)
  as_agent() { kubectl --server "https://10.244.0.1:6443" --certificate-authority "$CLUSTER_DIR/pki/apiserver.crt" --token "$tok" "$@"; }
  slice() { # name node driver
    printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: %s}\nspec:\n  driver: %s\n  nodeName: %s\n  pool: {name: %s, generation: 1, resourceSliceCount: 1}\n  devices: [{name: gpu-x}]\n' "$1" "$3" "$2" "$2"
  }
  other=$(slice rogue-other-node other-node gpu-slicer.io | as_agent create -f - 2>&1)
  driver=$(slice rogue-other-driver "$NODE_NAME" other.example.com | as_agent create -f - 2>&1)
  own=$(as_agent get resourceslices -o name 2>&1 | head -1)
  label=$(as_agent label node "$NODE_NAME" rogue=1 2>&1)
  if [[ $other == *"only the ResourceSlices of the Node"* ]] && [[ $driver == *"only its own driver"* ]] &&
    [[ $own == resourceslice* ]] && [[ $label == *[Ff]orbidden* ]]; then
    ok "rbac: the agent's token cannot write another node's slice or another driver's (policy refused both; node labels forbidden; reads allowed)"
  else
    ko "rbac: the agent's token cannot write another node's slice or another driver's" "other node: $other | other driver: $driver | read: $own | label: $label"
  fi
  k delete resourceslice rogue-other-node rogue-other-driver --ignore-not-found >/dev/null 2>&1
fi

# ============================== faults ==============================
restart() { CLUSTER_MODE=dra hack/cluster.sh restart "$1" >>"$CLUSTER_DIR/logs/restarts.log" 2>&1; }
slice_names() { k get resourceslices -o jsonpath='{range .items[?(@.spec.driver=="gpu-slicer.io")]}{.metadata.name}{"\n"}{end}' | sort; }
if want "fault: kubelet restart"; then
  pod fault-keep --claim whole
  wait_running fault-keep || true
  before_dev=$(gpus_seen fault-keep)
  restarts0=$(k -n "$NS" get pod fault-keep -o jsonpath='{.status.containerStatuses[0].restartCount}')
  uids0=$(k get resourceslices -o jsonpath='{.items[*].metadata.uid}')
  restart kubelet
  n=0
  for i in $(seq 1 60); do
    n=$(dra_devices 2>/dev/null || echo 0)
    [ "$n" -gt 0 ] && [ "$(phase_of fault-keep)" = Running ] && break
    sleep 1
  done
  pod fault-after --claim mig
  if [ "$n" -gt 0 ] && wait_running fault-after && [ "$(phase_of fault-keep)" = Running ] &&
    [ "$(k -n "$NS" get pod fault-keep -o jsonpath='{.status.containerStatuses[0].restartCount}')" = "$restarts0" ]; then
    uids1=$(k get resourceslices -o jsonpath='{.items[*].metadata.uid}')
    how="the same slices"
    [ "$uids0" != "$uids1" ] && how="slices wiped by the kubelet and re-created"
    ok "fault: kubelet restart ($how, $n devices; the running pod kept $before_dev; a new claim prepared)"
  else
    ko "fault: kubelet restart" "devices published $n; fault-keep $(phase_of fault-keep); new pod: $(why fault-after)"
  fi
  delete_pods fault-after
fi

if want "fault: the agent is SIGKILLed while pods come and go"; then
  pod churn-1 --claim mig
  apid=$(pgrep -f "gpu-slicer run" | head -1)
  kill -KILL "$apid" 2>/dev/null
  pod churn-2 --claim mig
  delete_pods churn-1 &
  deleting=$!
  pod churn-3 --claim mig
  wait "$deleting"
  ok_all=1
  for p in churn-2 churn-3; do wait_running "$p" 120 || ok_all=0; done
  devs=$( (for p in churn-2 churn-3 fault-keep; do claim_devices "$(claim_of "$p")"; done) | tr ' ' '\n' | grep . | sort)
  dups=$(uniq -d <<<"$devs")
  restarts=$(k -n gpu-slicer get pods -l app.kubernetes.io/name=gpu-slicer -o jsonpath='{.items[0].status.containerStatuses[0].restartCount}')
  if [ "$ok_all" = 1 ] && [ -z "$dups" ] && [ "$(phase_of fault-keep)" = Running ] && [ "${restarts:-0}" -ge 1 ]; then
    ok "fault: the agent is SIGKILLed while pods come and go (restarted $restarts x; $(wc -l <<<"$devs") devices held, none twice)"
  else
    ko "fault: the agent is SIGKILLed while pods come and go" "running: $ok_all; held [$(tr '\n' ' ' <<<"$devs")] dup [$dups]; agent restarts $restarts; $(why churn-3)"
  fi
  delete_pods churn-2 churn-3
fi

if want "fault: the API server restarts"; then
  before=$(slice_names)
  restart kube-apiserver
  pod api-after --claim mig
  if wait_running api-after 120; then
    after=$(slice_names)
    [ "$before" = "$after" ] && ok "fault: the API server restarts (the agent reconnected; the same $(wc -l <<<"$after") slices, none duplicated; a new claim prepared)" ||
      ko "fault: the API server restarts" "slices before [$(tr '\n' ' ' <<<"$before")] after [$(tr '\n' ' ' <<<"$after")]"
  else
    ko "fault: the API server restarts" "$(why api-after)"
  fi
  delete_pods api-after
fi

delete_pods fault-keep
if want "fault: an XID taints the device, new pods avoid it, and it recovers"; then
  G5=$(uuid 5)
  taints() { slices_json | python3 -c 'import json,sys
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"].get("devices", []):
        if d["name"] == "gpu-5": print(" ".join(t["key"] + ":" + t["effect"] for t in d.get("taints", [])))'; }
  template gpu5 gpu.gpu-slicer.io --cel "device.attributes['gpu-slicer.io'].uuid == '$G5'"
  printf '{"gpu":5,"kind":"xid","xid":79}\n' >"$CLUSTER_DIR/fake-events/.events.tmp"
  mv "$CLUSTER_DIR/fake-events/.events.tmp" "$CLUSTER_DIR/fake-events/events.jsonl"
  tainted=""
  for i in $(seq 1 60); do
    tainted=$(taints)
    [ -n "$tainted" ] && break
    sleep 0.5
  done
  # A pod that can only have GPU 5: unscheduled while the taint is there (the agent's quiet
  # period is 15 s here), scheduled and running once the GPU recovered.
  pod xid-after --claim gpu5
  avoided=0 broke=""
  for i in $(seq 1 120); do
    # The pod's node first, then the taint: a taint still there after the pod was bound was
    # there when it was bound. (Read the other way round, a recovery between the two reads
    # looks like a pod bound onto a tainted GPU.)
    n=$(k -n "$NS" get pod xid-after -o jsonpath='{.spec.nodeName}')
    t=$(taints)
    [ -n "$t" ] && [ -z "$n" ] && avoided=1
    [ -n "$t" ] && [ -n "$n" ] && broke="scheduled onto the tainted GPU"
    [ -z "$t" ] && break
    sleep 0.5
  done
  if [ -n "$tainted" ] && [ "$avoided" = 1 ] && [ -z "$broke" ] && wait_running xid-after 120 &&
    [ "$(gpus_seen xid-after)" = "$G5 " ]; then
    ok "fault: an XID taints the device, new pods avoid it, and it recovers (taint $tainted; a pod needing GPU 5 waited, then ran on it)"
  else
    ko "fault: an XID taints the device, new pods avoid it, and it recovers" "taints [$tainted], now [$(taints)], waited while tainted: $avoided $broke; $(why xid-after)"
  fi
  delete_pods xid-after
fi

# ============================== device-plugin mode ==============================
# DRA first, then this: a node that served nvidia.com/gpu through a device plugin keeps the
# stale resource in its status for the kubelet's grace period (5 min), and the scheduler then
# never sends a plain nvidia.com/gpu pod to the DRA extended-resource path.
# DRA's on-demand MIG (flags.dra.dynamicMig: [0]) destroyed GPU 0's unowned instances, as it
# does on a real node; the device plugin is checked on the node file's layout again, as if
# an administrator had re-partitioned the GPU (the fake driver's MIG state starts afresh).
rm -f "$CLUSTER_DIR/fake-events/mig-state.json"
if ! CLUSTER_MODE=device-plugin hack/cluster.sh deploy; then
  ko "dp: deploy" "CLUSTER_MODE=device-plugin hack/cluster.sh deploy failed"
  echo "RESULT: $pass passed, $fail failed"
  exit 1
fi
if want "dp: kubelet registers every resource of the plan"; then
  expect=$("$BIN" inventory --backend "sim:$NODE_FILE" --config hack/cluster/config-device-plugin.yaml 2>/dev/null |
    awk '/^RESOURCE/ {r = 1; next} r && NF {print $1 "=" $2}' | sort)
  got=""
  for i in $(seq 1 60); do
    got=$(for r in $(cut -d= -f1 <<<"$expect"); do echo "$r=$(alloc "$r")"; done | sort)
    [ "$got" = "$expect" ] && break
    sleep 1
  done
  cap=$(for r in $(cut -d= -f1 <<<"$expect"); do echo "$r=$(k get node "$NODE_NAME" -o jsonpath="{.status.capacity['${r//./\\.}']}")"; done | sort)
  if [ "$got" = "$expect" ] && [ "$cap" = "$expect" ]; then
    ok "dp: kubelet registers every resource of the plan ($(tr '\n' ' ' <<<"$expect"))"
  else
    ko "dp: kubelet registers every resource of the plan" "inventory says [$(tr '\n' ' ' <<<"$expect")], allocatable [$(tr '\n' ' ' <<<"$got")], capacity [$(tr '\n' ' ' <<<"$cap")]"
  fi
fi

if want "dp: a memory-isolated share runs and sees only its GPU"; then
  pod dp-shared --res nvidia.com/gpu.shared 1
  if wait_running dp-shared; then
    seen=$(gpus_seen dp-shared)
    out=$(k -n "$NS" logs dp-shared)
    if [ "$seen" = "$G4 " ] && grep -q "$G4" <<<"$out"; then
      ok "dp: a memory-isolated share runs and sees only its GPU ($G4; $(grep -m1 -i 'total' <<<"$out" | tr -s ' '))"
    else
      ko "dp: a memory-isolated share runs and sees only its GPU" "saw [$seen], want [$G4]; logs: $(head -12 <<<"$out" | tr '\n' ';')"
    fi
  else
    ko "dp: a memory-isolated share runs and sees only its GPU" "$(why dp-shared)"
  fi
fi

if want "dp: a pod asking for more than is free stays Pending"; then
  pod dp-too-many --res nvidia.com/gpu 6
  if msg=$(wait_pending_reason dp-too-many 'Insufficient nvidia.com/gpu'); then
    ok "dp: a pod asking for more than is free stays Pending ($msg)"
  else
    ko "dp: a pod asking for more than is free stays Pending" "$msg"
  fi
  delete_pods dp-too-many
fi

if want "dp: deleting a pod frees its devices"; then
  # All four replicas: the running dp-shared holds one, so this waits; deleting it frees it.
  pod dp-all-shares --res nvidia.com/gpu.shared 4
  before=$(wait_pending_reason dp-all-shares 'Insufficient nvidia.com/gpu.shared')
  delete_pods dp-shared
  if [[ $before == *Insufficient* ]] && wait_running dp-all-shares 60; then
    ok "dp: deleting a pod frees its devices (a 4-replica pod waited, then ran on all of GPU 4)"
  else
    ko "dp: deleting a pod frees its devices" "before: $before; $(why dp-all-shares)"
  fi
  delete_pods dp-all-shares
fi

# ============================== steering by node label ==============================
# deploy/label-configs/: named configs in a ConfigMap, the Node's
# nvidia.com/device-plugin.config label picks one, live.
if want "steering: a node label changes the served resources"; then
  if CLUSTER_MODE=label-configs hack/cluster.sh deploy >/dev/null 2>&1; then
    expect_default=$("$BIN" inventory --backend "sim:$NODE_FILE" --config <(k -n gpu-slicer get configmap gpu-slicer-configs -o jsonpath='{.data.default}') 2>/dev/null |
      awk '/^RESOURCE/ {r = 1; next} r && $1 == "nvidia.com/gpu" {print $2}')
    expect_shared=$("$BIN" inventory --backend "sim:$NODE_FILE" --config <(k -n gpu-slicer get configmap gpu-slicer-configs -o jsonpath='{.data.inference}') 2>/dev/null |
      awk '/^RESOURCE/ {r = 1; next} r && $1 == "nvidia.com/gpu.shared" {print $2}')
    wait_alloc() { # resource value
      local i
      for ((i = 0; i < 120; i++)); do [ "$(alloc "$1")" = "$2" ] && return 0; sleep 0.5; done
      return 1
    }
    state() { k get node "$NODE_NAME" -o jsonpath='{.metadata.labels.gpu-slicer\.io/config\.state}'; }
    if wait_alloc nvidia.com/gpu "$expect_default"; then
      k label node "$NODE_NAME" nvidia.com/device-plugin.config=inference --overwrite >/dev/null
      if wait_alloc nvidia.com/gpu.shared "$expect_shared"; then
        st=""
        for i in $(seq 1 60); do st=$(state); [ -n "$st" ] && break; sleep 0.5; done
        # The agent's own Events on the Node (the kubelet's are there too).
        ev=$(k get events -A --field-selector involvedObject.kind=Node -o jsonpath='{range .items[*]}{.reason}{"\n"}{end}' 2>/dev/null |
          grep -x 'Config[A-Za-z]*' | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')
        if [ -n "$st" ] && [[ $ev == *ConfigApplied* ]]; then
          ok "steering: a node label changes the served resources (default: nvidia.com/gpu=$expect_default; label inference: nvidia.com/gpu.shared=$expect_shared; gpu-slicer.io/config.state=$st; Node events: $ev)"
        else
          ko "steering: a node label changes the served resources" "resources changed, but state label [$st], Node events [$ev]"
        fi
      else
        ko "steering: a node label changes the served resources" "after the label: nvidia.com/gpu.shared=$(alloc nvidia.com/gpu.shared), want $expect_shared"
      fi
      k label node "$NODE_NAME" nvidia.com/device-plugin.config- >/dev/null 2>&1
    else
      ko "steering: a node label changes the served resources" "default config: nvidia.com/gpu=$(alloc nvidia.com/gpu), want $expect_default"
    fi
  else
    ko "steering: a node label changes the served resources" "CLUSTER_MODE=label-configs hack/cluster.sh deploy failed"
  fi
fi

echo "RESULT: $pass passed, $fail failed${skipped:+, $skipped not selected}"
[ "$fail" -eq 0 ]
