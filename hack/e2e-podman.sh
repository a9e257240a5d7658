#!/usr/bin/env bash
# End-to-end: gpu-slicer's CDI spec for the sim node `mixed-a100`, loaded by a real Podman
# (4.3.1 on Debian 12), must give a container exactly the device nodes of the device it asked
# for and NVIDIA_VISIBLE_DEVICES=void, and a broken spec must be stopped by `cdi validate`.
# Shares: `--device gpu-slicer.io/gpu=3-share-3` runs gpu-slicer's memory-limit hook on the
# host (against the fake libnvidia-ml), which must find that container's cgroup and set 3/4
# of GPU 3's memory; a hook that fails must keep the container from starting.
#
# Runs as root (CI: Debian 12 after `apt-get install -y podman runc busybox-static`).
# Idempotent and self-cleaning: all state lives in a temp dir; the spec directories Podman
# reads are bind-mounted inside a private mount namespace, so the host's /etc/cdi and
# /run/cdi never see our files. Recipe: ../shared/notes/podman.md.
#   GPU_SLICER_BIN=path  use this binary instead of building target/debug/gpu-slicer
#   FAKE_NVML_LIB=path   use this fake libnvidia-ml instead of building target/debug/libnvidia_ml.so
set -u
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "e2e-podman: must run as root (podman, mknod, mount namespaces)" >&2
  exit 1
fi

missing=()
for p in podman runc busybox-static; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { echo "e2e-podman: cannot install ${missing[*]}" >&2; exit 1; }
fi

BIN=${GPU_SLICER_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --quiet --bin gpu-slicer || exit 1
  BIN=$PWD/target/debug/gpu-slicer
fi
FAKE_LIB=${FAKE_NVML_LIB:-}
if [ -z "$FAKE_LIB" ]; then
  cargo build --quiet -p fake-nvml || exit 1
  FAKE_LIB=$PWD/target/debug/libnvidia_ml.so
fi
# The runtime runs CDI hooks by absolute host path.
BIN=$(readlink -f "$BIN")
FAKE_LIB=$(readlink -f "$FAKE_LIB")
NODE_FILE=$PWD/hack/nodes/mixed-a100.yaml

WD=$(mktemp -d /tmp/gpu-slicer-e2e.XXXXXX)
made_dirs=()
cleanup() {
  rm -rf "$WD"
  # Remove only the (empty) mount points we created; never anything else in them.
  for d in "${made_dirs[@]}"; do rmdir "$d" 2>/dev/null; done
}
trap cleanup EXIT

# Podman reads only /etc/cdi and /var/run/cdi (= /run/cdi); they must exist as mount points.
for d in /etc/cdi /run/cdi; do
  if [ ! -d "$d" ]; then mkdir -p "$d" && made_dirs+=("$d"); fi
done

mkdir -p "$WD/tmp" "$WD/cdi-etc" "$WD/cdi-run"
cat >"$WD/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$WD/tmp"
EOF
export CONTAINERS_CONF=$WD/containers.conf
PODMAN=(podman --root "$WD/root" --runroot "$WD/runroot" --storage-driver vfs)

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
ko() { fail=$((fail + 1)); echo "FAIL $1: $2"; }

# --- image: busybox-static imported from a directory, with a baked-in NVIDIA_VISIBLE_DEVICES=all
# that the spec's `void` must override.
mkdir -p "$WD"/rootfs/{bin,dev,proc,sys,tmp,etc}
cp /bin/busybox "$WD/rootfs/bin/busybox"
for a in sh env ls cat find sort echo test grep true; do ln -sf busybox "$WD/rootfs/bin/$a"; done
tar -C "$WD/rootfs" -cf "$WD/rootfs.tar" .
"${PODMAN[@]}" import --change "ENV=NVIDIA_VISIBLE_DEVICES=all" "$WD/rootfs.tar" localhost/busybox >/dev/null 2>&1 ||
  { echo "e2e-podman: podman import failed" >&2; exit 1; }

# Run podman with our spec dirs bind-mounted over the real ones, in a private mount namespace.
in_ns() {
  unshare --mount --propagation private bash -c \
    'mount --bind "$1" /etc/cdi && mount --bind "$2" /run/cdi && shift 2 && exec "$@"' \
    _ "$WD/cdi-etc" "$WD/cdi-run" "$@"
}
# Print the container's NVIDIA char devices (sorted) and its NVIDIA_* env.
PROBE='find /dev -name "nvidia*" -type c | sort; env | grep "^NVIDIA_" | sort'
run_ctr() { # device args...
  local args=()
  for d in "$@"; do args+=(--device "$d"); done
  in_ns "${PODMAN[@]}" --log-level=error run --rm --network none "${args[@]}" \
    localhost/busybox sh -c "$PROBE"
}

out=$(in_ns "${PODMAN[@]}" run --rm --network none localhost/busybox sh -c "$PROBE" 2>&1)
if [ "$out" = "NVIDIA_VISIBLE_DEVICES=all" ]; then
  ok "smoke: container runs, image bakes in NVIDIA_VISIBLE_DEVICES=all, no GPU nodes"
else
  ko "smoke" "got: $out"
  echo "RESULT: $pass passed, $fail failed"
  exit 1
fi

# --- stand-in host devices under a dev root: every node the spec names, as c 1:3 (/dev/null),
# except nvidia-uvm-tools, which must then be left out of the spec.
DEVROOT=$WD/devroot
for p in $("$BIN" cdi generate --backend sim:mixed-a100 --output - | sed -n 's/^ *- path: \(\/dev\/.*\)$/\1/p' | sort -u); do
  [ "$p" = /dev/nvidia-uvm-tools ] && continue
  mkdir -p "$(dirname "$DEVROOT$p")"
  mknod "$DEVROOT$p" c 1 3
done

KIND=gpu-slicer.io/gpu
SPEC=$WD/cdi-run/gpu-slicer.io-gpu.yaml
if "$BIN" cdi generate --backend sim:mixed-a100 --dev-root "$DEVROOT" --output "$WD/cdi-run" >/dev/null &&
  "$BIN" cdi validate "$SPEC" >/dev/null && ! grep -q nvidia-uvm-tools "$SPEC" &&
  grep -q "hostPath: $DEVROOT/dev/nvidia0" "$SPEC"; then
  ok "generate: spec written with hostPath under the dev root, validates, absent uvm-tools omitted"
else
  ko "generate" "$(cat "$SPEC" 2>&1 | head -20)"
fi

CTL=$'/dev/nvidia-uvm\n/dev/nvidiactl'
expect_nodes() { # name, expected node list (newline separated, unsorted), devices...
  local name=$1 want got rc
  want=$(printf '%s\n%s\nNVIDIA_VISIBLE_DEVICES=void' "$2" "$CTL" | sort -u | grep -v '^NVIDIA_' ; echo NVIDIA_VISIBLE_DEVICES=void)
  shift 2
  got=$(run_ctr "$@" 2>&1)
  rc=$?
  if [ $rc = 0 ] && [ "$got" = "$want" ]; then
    ok "$name"
  else
    ko "$name" "exit $rc; want [$(echo $want)] got [$(echo $got)]"
  fi
}

caps() { for c in "$@"; do echo "/dev/nvidia-caps/nvidia-cap$c"; done; }

# MIG slice 0:1 (GPU 0, GI 8): GPU 0's node and its two caps nodes, nothing of GPU 1-3.
expect_nodes "MIG slice by index $KIND=0:1" "$(printf '/dev/nvidia0\n'; caps 75 76)" "$KIND=0:1"
# MIG 2g.20gb on GPU 1 (GI 3), asked for by UUID as the device plugin will.
expect_nodes "MIG slice by UUID (GPU 1, GI 3)" "$(printf '/dev/nvidia1\n'; caps 165 166)" \
  "$KIND=MIG-2c3d4e5f-0000-4b00-8000-000000000003"
expect_nodes "whole GPU by index $KIND=2" /dev/nvidia2 "$KIND=2"
expect_nodes "whole GPU by UUID (GPU 3)" /dev/nvidia3 "$KIND=GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03"
expect_nodes "two devices: MIG 1:3 + GPU 2" "$(printf '/dev/nvidia1\n/dev/nvidia2\n'; caps 228 229)" \
  "$KIND=1:3" "$KIND=2"
expect_nodes "$KIND=all" \
  "$(printf '/dev/nvidia%s\n' 0 1 2 3; caps 66 67 75 76 84 85 93 94 102 103 111 112 120 121 156 157 165 166 219 220 228 229)" \
  "$KIND=all"

# A device the spec does not define is refused by Podman itself.
got=$(run_ctr "$KIND=0:7" 2>&1)
rc=$?
if [ $rc != 0 ] && grep -q "unresolvable CDI devices" <<<"$got"; then
  ok "unknown device $KIND=0:7 refused by podman (exit $rc)"
else
  ko "unknown device" "exit $rc: $got"
fi

# --- broken specs are stopped before any runtime sees them.
good_sum=$(sha256sum "$SPEC")
mkdir -p "$WD/broken"
sed 's#^kind: .*#kind: gpu-slicer.io/g#' "$SPEC" >"$WD/broken/one-char-class.yaml"
sed 's#^cdiVersion: .*#cdiVersion: "0.6.0"#' "$SPEC" >"$WD/broken/too-new.yaml"
sed 's#^devices:$#devices:\n- name: all\n  containerEdits:\n    env: [A=1]#' "$SPEC" >"$WD/broken/dup.yaml"
for f in "$WD"/broken/*.yaml; do
  msg=$("$BIN" cdi validate "$f" 2>&1)
  rc=$?
  if [ $rc != 0 ] && [ -n "$msg" ]; then
    ok "validate rejects $(basename "$f"): ${msg#gpu-slicer: error: }"
  else
    ko "validate $(basename "$f")" "exit $rc: $msg"
  fi
done
msg=$("$BIN" cdi generate --backend sim:mixed-a100 --kind gpu-slicer.io/g --dev-root "$DEVROOT" --output "$WD/cdi-run" 2>&1)
rc=$?
if [ $rc != 0 ] && [ "$(sha256sum "$SPEC")" = "$good_sum" ] && [ "$(ls "$WD/cdi-run")" = gpu-slicer.io-gpu.yaml ]; then
  ok "generate with a bad kind fails (exit $rc), writes nothing, good spec untouched"
else
  ko "generate bad kind" "exit $rc: $msg; $(ls "$WD/cdi-run")"
fi
# The good spec still works after the failed attempt.
expect_nodes "good spec still served after failed regenerate" /dev/nvidia2 "$KIND=2"

# --- shares that bind: GPU 3 split 4 ways with memory limits and MPS. The hook is this
# build of gpu-slicer, loading the fake NVML, which records limits per cgroup in a file.
GPU3=GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e03
GPU3_MEM=$((80 * 1024 * 1024 * 1024))
MPS=$WD/mps
mkdir -p "$MPS/$GPU3/pipe" "$MPS/shm" "$WD/cdi-fail"
cat >"$WD/shares.yaml" <<EOF
version: v1
flags: {migStrategy: mixed, mpsRoot: $MPS}
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [3], replicas: 4, isolation: memory+mps}
EOF
LIMITS=$WD/limits.json
share_spec() { # output dir, extra hook env (comma list)
  "$BIN" cdi generate --backend sim:mixed-a100 --config "$WD/shares.yaml" --dev-root "$DEVROOT" \
    --output "$1" --cdi-hook-nvml-lib "$FAKE_LIB" \
    --cdi-hook-env "FAKE_NVML_NODE=$NODE_FILE,FAKE_NVML_LIMITS_FILE=$LIMITS${2:+,$2}" >/dev/null
}
if share_spec "$WD/cdi-run" && "$BIN" cdi validate "$SPEC" >/dev/null &&
  grep -qE -- "^- name: '?3-share-3'?$" "$SPEC" && grep -q "path: $BIN" "$SPEC"; then
  ok "generate shares: 3-share-3 with the hook at $BIN, validates"
else
  ko "generate shares" "$(grep -n share "$SPEC" 2>&1 | head -5)"
fi
SHARE_PROBE='env | grep "^CUDA_MPS_" | sort; grep " /mps/" /proc/mounts | cut -d" " -f2; echo started'
out=$(in_ns "${PODMAN[@]}" --log-level=error run --rm --network none --cidfile "$WD/cid" \
  --device "$KIND=3-share-3" localhost/busybox sh -c "$SHARE_PROBE" 2>&1)
rc=$?
cid=$(cat "$WD/cid" 2>/dev/null)
# The limits file maps GPU UUID -> cgroup path -> limits; the path must be this container's.
recorded=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])).get(sys.argv[2],{}); print("\n".join("%s %s" % (k, v["hardLimit"]) for k, v in d.items()))' "$LIMITS" "$GPU3" 2>/dev/null)
want_bytes=$((3 * GPU3_MEM / 4))
if [ $rc = 0 ] && [ -n "$cid" ] && grep -q "started" <<<"$out" &&
  [ "$(grep -c . <<<"$recorded")" = 1 ] && grep -q "$cid" <<<"$recorded" &&
  [ "${recorded##* }" = "$want_bytes" ]; then
  ok "hook ran on the host, found container ${cid:0:12}'s cgroup (${recorded%% *}), set 3/4 of GPU 3 = $want_bytes bytes"
else
  ko "share hook" "exit $rc; cid ${cid:-none}; limits [$recorded]; out: $out"
fi
want_env=$(printf '%s\n' CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75 "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=$((want_bytes >> 20))M" "CUDA_MPS_PIPE_DIRECTORY=/mps/$GPU3/pipe")
if [ "$(grep '^CUDA_MPS_' <<<"$out")" = "$want_env" ] && grep -qx "/mps/$GPU3/pipe" <<<"$out"; then
  ok "MPS share env (75 % of the threads) and pipe mount in the container"
else
  ko "MPS share env" "$out"
fi
# A hook that fails (driver without memory limits) must keep the container from starting.
before=$(cat "$LIMITS" 2>/dev/null)
if share_spec "$WD/cdi-fail" FAKE_NVML_LIMITS_UNSUPPORTED=1; then
  out=$(unshare --mount --propagation private bash -c \
    'mount --bind "$1" /etc/cdi && mount --bind "$2" /run/cdi && shift 2 && exec "$@"' \
    _ "$WD/cdi-etc" "$WD/cdi-fail" "${PODMAN[@]}" --log-level=error run --rm --network none \
    --device "$KIND=3-share-3" localhost/busybox sh -c 'echo started' 2>&1)
  rc=$?
  if [ $rc != 0 ] && ! grep -q "^started" <<<"$out" && [ "$(cat "$LIMITS" 2>/dev/null)" = "$before" ]; then
    ok "failing hook: container refused (exit $rc), never started unlimited"
  else
    ko "failing hook" "exit $rc: $out"
  fi
else
  ko "failing hook" "cannot generate the spec"
fi

echo "RESULT: $pass passed, $fail failed"
[ "$fail" = 0 ]

