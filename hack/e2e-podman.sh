#!/usr/bin/env bash
# End-to-end: gpu-slicer's CDI spec for the sim node `mixed-a100`, loaded by a real Podman
# (4.3.1 on Debian 12), must give a container exactly the device nodes of the device it asked
# for and NVIDIA_VISIBLE_DEVICES=void, and a broken spec must be stopped by `cdi validate`.
# Shares: `--device gpu-slicer.io/gpu=3-share-3` runs gpu-slicer's memory-limit hook on the
# host (against the fake libnvidia-ml), which must find that container's cgroup and set 3/4
# of GPU 3's memory; a hook that fails must keep the container from starting. MPS: the real
# agent (`gpu-slicer run`, with hack/fake-mps-control as the daemon) gives each daemon its own
# size-bounded tmpfs as /dev/shm; share containers of GPU 2 and GPU 3 each see only their
# daemon's, never each other's nor the host's, and lose it when the agent stops.
# DRA (`run --dra` against `gpu-slicer emulate`): claims prepared into per-claim specs and run
# by Podman; shares of one GPU (consumable capacity) each limited to their own bytes by the
# hook, which NVML and CUDA inside the container report as the GPU's total, an over-committed
# share refused.
#
# Runs as root (CI: Debian 12 after `apt-get install -y podman runc busybox-static`).
# Idempotent and self-cleaning: all state lives in a temp dir; the spec directories Podman
# reads are bind-mounted inside a private mount namespace, so the host's /etc/cdi and
# /run/cdi never see our files (see docs/src/podman.md).
#   GPU_SLICER_BIN=path  use this binary instead of building target/debug/gpu-slicer (it
#                        runs `emulate` too, so it must be built with `--features testkit`)
#   FAKE_NVML_LIB=path   use this fake libnvidia-ml instead of building target/debug/libnvidia_ml.so
#   FAKE_CUDA_LIB=path, FAKE_SMI_BIN=path   likewise for the fake libcuda and nvidia-smi stand-in
set -u
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "e2e-podman: must run as root (podman, mknod, mount namespaces)" >&2
  exit 1
fi

missing=()
for p in podman runc busybox-static patchelf python3; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { echo "e2e-podman: cannot install ${missing[*]}" >&2; exit 1; }
fi

BIN=${GPU_SLICER_BIN:-}
if [ -z "$BIN" ]; then
  # `emulate` is test support, built only with the testkit feature (as `cargo test` builds it).
  cargo build --quiet --features testkit --bin gpu-slicer || exit 1
  BIN=$PWD/target/debug/gpu-slicer
fi
FAKE_LIB=${FAKE_NVML_LIB:-}
if [ -z "$FAKE_LIB" ]; then
  cargo build --quiet -p fake-nvml || exit 1
  FAKE_LIB=$PWD/target/debug/libnvidia_ml.so
fi
CUDA_LIB=${FAKE_CUDA_LIB:-}
SMI_BIN=${FAKE_SMI_BIN:-}
if [ -z "$CUDA_LIB" ] || [ -z "$SMI_BIN" ]; then
  cargo build --quiet -p fake-cuda -p fake-smi || exit 1
  CUDA_LIB=${CUDA_LIB:-$PWD/target/debug/libcuda.so}
  SMI_BIN=${SMI_BIN:-$PWD/target/debug/fake-nvidia-smi}
fi
# The runtime runs CDI hooks by absolute host path.
BIN=$(readlink -f "$BIN")
FAKE_LIB=$(readlink -f "$FAKE_LIB")
CUDA_LIB=$(readlink -f "$CUDA_LIB")
SMI_BIN=$(readlink -f "$SMI_BIN")
NODE_FILE=$PWD/hack/nodes/mixed-a100.yaml

WD=$(mktemp -d /tmp/gpu-slicer-e2e.XXXXXX)
made_dirs=()
AGENT_PID=
DRA_PID=
EMU_PID=
cleanup() {
  for p in $AGENT_PID $DRA_PID $EMU_PID; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  # An agent that died uncleanly leaves its shm tmpfs mounts under $WD: detach them first.
  for m in $(awk -v wd="$WD/" 'index($5, wd) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount -l "$m"
  done
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
for a in sh env ls cat find sort echo test grep true readlink; do ln -sf busybox "$WD/rootfs/bin/$a"; done
tar -C "$WD/rootfs" -cf "$WD/rootfs.tar" .
"${PODMAN[@]}" import --change "ENV=NVIDIA_VISIBLE_DEVICES=all" "$WD/rootfs.tar" localhost/busybox >/dev/null 2>&1 ||
  { echo "e2e-podman: podman import failed" >&2; exit 1; }

# Run podman with our spec dirs bind-mounted over the real ones, in a private mount namespace.
in_ns_dir() { # run-dir, command...
  local run=$1
  shift
  unshare --mount --propagation private bash -c \
    'mount --bind "$1" /etc/cdi && mount --bind "$2" /run/cdi && shift 2 && exec "$@"' \
    _ "$WD/cdi-etc" "$run" "$@"
}
in_ns() { in_ns_dir "$WD/cdi-run" "$@"; }
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
GPU2=GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02
mkdir -p "$WD/cdi-fail" "$WD/dp"
cat >"$WD/shares.yaml" <<EOF
version: v1
flags: {migStrategy: mixed, mpsRoot: $MPS}
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, devices: [2, 3], replicas: 4, isolation: memory+mps}
EOF
# The agent runs the MPS daemons of GPUs 2 and 3 (no kubelet needed: it keeps waiting for
# one) and mounts their /dev/shm: a 16 MiB tmpfs each at $MPS/<uuid>/shm, on this host.
SHM_KIB=16384
STATE_DIR=$WD/state LABELS_FILE=$WD/labels HTTP_LISTEN=127.0.0.1:0 POD_RESOURCES_SOCKET="" \
  "$BIN" run --backend sim:mixed-a100 --config "$WD/shares.yaml" --device-plugin-dir "$WD/dp" \
  --cdi-dir "$WD/cdi-agent" --mps-control-bin "$PWD/hack/fake-mps-control" \
  --mps-shm-size "${SHM_KIB}Ki" --mps-restart-backoff-ms 200 >"$WD/agent.log" 2>&1 &
AGENT_PID=$!
shm_mount() { # dir: "fstype source options" of the mount on top of dir, if any
  awk -v d="$1" '$5 == d { for (i = 7; $i != "-"; i++); t = $(i+1) " " $(i+2) " " $(i+3) } END { print t }' /proc/self/mountinfo
}
for _ in $(seq 100); do
  [ -s "$MPS/$GPU2/shm/fake-mps-daemon" ] && [ -s "$MPS/$GPU3/shm/fake-mps-daemon" ] && break
  sleep 0.1
done
m2=$(shm_mount "$MPS/$GPU2/shm")
m3=$(shm_mount "$MPS/$GPU3/shm")
if [[ $m2 == "tmpfs gpu-slicer-mps-shm "*size=${SHM_KIB}k* && $m3 == "tmpfs gpu-slicer-mps-shm "*size=${SHM_KIB}k* ]] &&
  [ "$(cut -d' ' -f2 "$MPS/$GPU2/shm/fake-mps-daemon")" = "$GPU2" ] &&
  [ "$(cut -d' ' -f2 "$MPS/$GPU3/shm/fake-mps-daemon")" = "$GPU3" ] && [ ! -e /dev/shm/fake-mps-daemon ]; then
  ok "agent: MPS daemons of GPU 2 and 3 up, each on its own ${SHM_KIB} KiB tmpfs as /dev/shm ($MPS/<uuid>/shm)"
else
  ko "agent MPS shm" "GPU2 [$m2] GPU3 [$m3]; $(tail -5 "$WD/agent.log")"
fi
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

# --- MPS /dev/shm isolation: a share container of GPU 2 and one of GPU 3, each writing into
# its /dev/shm. Each must find its own daemon's marker there and never the other's file;
# the host's /dev/shm sees neither, and the tmpfs bound holds inside a container too.
shm_ctr() { # device, script
  in_ns "${PODMAN[@]}" --log-level=error run --rm --network none --device "$1" localhost/busybox sh -c "$2" 2>&1
}
SHM_PROBE='cat /dev/shm/fake-mps-daemon; echo "$SHM_TAG" >/dev/shm/tenant-$SHM_TAG; ls /dev/shm | sort | tr "\n" " "'
out2=$(shm_ctr "$KIND=2-share-1" "SHM_TAG=gpu2; $SHM_PROBE")
out3=$(shm_ctr "$KIND=3-share-1" "SHM_TAG=gpu3; $SHM_PROBE")
want2="$(cat "$MPS/$GPU2/shm/fake-mps-daemon" 2>&1)"$'\n'"fake-mps-daemon tenant-gpu2 "
want3="$(cat "$MPS/$GPU3/shm/fake-mps-daemon" 2>&1)"$'\n'"fake-mps-daemon tenant-gpu3 "
if [ "$out2" = "$want2" ] && [ "$out3" = "$want3" ] &&
  [ "$(cat "$MPS/$GPU2/shm/tenant-gpu2")" = gpu2 ] && [ ! -e "$MPS/$GPU3/shm/tenant-gpu2" ] &&
  [ "$(cat "$MPS/$GPU3/shm/tenant-gpu3")" = gpu3 ] && [ ! -e "$MPS/$GPU2/shm/tenant-gpu3" ] &&
  [ ! -e /dev/shm/tenant-gpu2 ] && [ ! -e /dev/shm/tenant-gpu3 ]; then
  ok "MPS /dev/shm: GPU 2's and GPU 3's share containers each see only their daemon's tmpfs, not each other's nor the host's"
else
  ko "MPS /dev/shm isolation" "GPU2 [$out2] want [$want2]; GPU3 [$out3] want [$want3]"
fi
out=$(shm_ctr "$KIND=2-share-1" 'busybox dd if=/dev/zero of=/dev/shm/big bs=1M count=64 2>&1; echo "rc $?"')
big=$(stat -c %s "$MPS/$GPU2/shm/big" 2>/dev/null || echo 0)
rm -f "$MPS/$GPU2/shm/big"
if grep -q "No space left" <<<"$out" && grep -qx "rc 1" <<<"$out" && [ "$big" -le $((SHM_KIB * 1024)) ]; then
  ok "MPS /dev/shm bound: 64 MiB written in a share container stops at the ${SHM_KIB} KiB tmpfs ($big bytes)"
else
  ko "MPS /dev/shm bound" "wrote $big bytes: $out"
fi

# --- the driver in the spec: a fake driver root, run from a glibc image by the nvidia-smi
# stand-in, which loads libnvidia-ml.so.1 and libcuda.so.1 by soname.
DRV_VERSION=$(sed -n 's/^driverVersion: "\(.*\)"$/\1/p' "$NODE_FILE")
FDR=$WD/driver-root
if FAKE_NVML_LIB=$FAKE_LIB FAKE_CUDA_LIB=$CUDA_LIB FAKE_SMI_BIN=$SMI_BIN \
  hack/fake-driver-root.sh "$FDR" "$DRV_VERSION" >"$WD/fdr.log" 2>&1; then
  ok "fake driver root $DRV_VERSION laid out ($(find "$FDR" -type f -o -type l -o -type s | wc -l) entries)"
else
  ko "fake driver root" "$(cat "$WD/fdr.log")"
fi

# The glibc image: busybox plus the host's loader, libc and libgcc_s (what the stand-in and
# the fakes link), in /lib/x86_64-linux-gnu; /usr/lib/x86_64-linux-gnu, where the driver's
# libraries go, starts empty. No ld cache: the hook makes it.
G=$WD/glibc-rootfs
mkdir -p "$G"/{bin,dev,proc,sys,tmp,etc,lib64,lib/x86_64-linux-gnu,usr/lib/x86_64-linux-gnu,usr/bin}
cp /bin/busybox "$G/bin/busybox"
for a in sh env ls cat find sort echo test grep true sed readlink wc; do ln -sf busybox "$G/bin/$a"; done
for l in $(ldd "$SMI_BIN" "$CUDA_LIB" "$FAKE_LIB" | sed -n 's#.*=> \(/[^ ]*\) .*#\1#p' | sort -u); do
  cp -L "$l" "$G/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$G/lib64/"
tar -C "$G" -cf "$WD/glibc.tar" .
# The hostile image: busybox whose library folder, ld.so.conf.d and ld cache are absolute
# symlinks into folders that exist on the host: a hook that followed them would write into
# $HOSTILE.
HOSTILE=$WD/host-root
mkdir -p "$HOSTILE/lib" "$HOSTILE/conf" "$HOSTILE/cache" "$WD/hostile-rootfs"
cp -a "$WD/rootfs/." "$WD/hostile-rootfs/"
mkdir -p "$WD/hostile-rootfs/usr/lib" "$WD/hostile-rootfs/etc"
ln -s "$HOSTILE/lib" "$WD/hostile-rootfs/usr/lib/x86_64-linux-gnu"
ln -s "$HOSTILE/conf" "$WD/hostile-rootfs/etc/ld.so.conf.d"
ln -s "$HOSTILE/cache/ld.so.cache" "$WD/hostile-rootfs/etc/ld.so.cache"
tar -C "$WD/hostile-rootfs" -cf "$WD/hostile.tar" .
if "${PODMAN[@]}" import "$WD/glibc.tar" localhost/glibc >/dev/null 2>&1 &&
  "${PODMAN[@]}" import "$WD/hostile.tar" localhost/hostile >/dev/null 2>&1; then
  ok "images: glibc from the host's libraries ($(ls "$G/lib/x86_64-linux-gnu" | tr '\n' ' ')), hostile"
else
  ko "images" "podman import failed"
fi

# The fakes' inputs reach the container through one read-only folder and three env vars.
FG=$WD/fake-gpu
mkdir -p "$FG"
cp "$NODE_FILE" "$FG/node.yaml"
FAKE_ENV=(-e FAKE_NVML_NODE=/run/fake-gpu/node.yaml -e FAKE_GPU_DEV_ROOT=/
  -e FAKE_NVML_LIMITS_FILE=/run/fake-gpu/limits.json -v "$FG:/run/fake-gpu:ro")

DRV_RUN=$WD/cdi-drv
mkdir -p "$DRV_RUN"
DRV_SPEC=$DRV_RUN/gpu-slicer.io-gpu.yaml
if "$BIN" cdi generate --backend sim:mixed-a100 --dev-root "$DEVROOT" --driver-root "$FDR" \
  --output "$DRV_SPEC" >"$WD/drv-gen.log" 2>&1 && "$BIN" cdi validate "$DRV_SPEC" >/dev/null &&
  grep -q "hostPath: $FDR/usr/lib/x86_64-linux-gnu/libcuda.so.$DRV_VERSION" "$DRV_SPEC"; then
  ok "generate --driver-root: spec file with the fake driver's libraries, validates"
else
  ko "generate --driver-root" "$(cat "$WD/drv-gen.log"; head -40 "$DRV_SPEC" 2>&1)"
fi

DRV_PROBE='echo "## nodes"; find /dev -name "nvidia*" -type c | sort
echo "## fw"; ls /lib/firmware/nvidia/'$DRV_VERSION'/
echo "## smi"; LD_DEBUG=libs nvidia-smi 2>/tmp/ld; echo "rc $?"
echo "## ld"; grep -A2 "find library=libcuda.so.1 " /tmp/ld | sed "s/^ *[0-9]*:[[:space:]]*//"
echo "## err"; grep -v "^ *[0-9]*:" /tmp/ld; true'
section() { sed -n "/^## $1\$/,/^## /p" | sed '1d;/^## /d'; }
uuids_of() { sed -n 's/^\(GPU [0-9]*\|  MIG .*\): .*(UUID: \(.*\))$/\2/p'; }
cuda_uuids_of() { sed -n 's/^CUDA [0-9]*: .*(UUID: \([^)]*\)).*/\1/p'; }

G0=GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e00 G1=GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e01
G2=GPU-9d3e1a7c-5b2f-4c8d-a6e0-7f1b2c3d4e02 G3=$GPU3
M0=(MIG-1b2c3d4e-0000-4a00-8000-0000000000{07,08,09,0a,0b,0c,0d})
M1=(MIG-2c3d4e5f-0000-4b00-8000-0000000000{02,03,09,0a})

# expect_driver NAME RUN-DIR "NODES" "NVML UUIDS" "CUDA UUIDS" EXTRA-PODMAN-ARGS... -- DEVICES...
# Asserts the device nodes, the firmware, the stand-in's NVML list and CUDA list (in order),
# and that libcuda.so.1 was found through /etc/ld.so.cache. Prints the stand-in's output.
expect_driver() {
  local name=$1 run=$2 nodes=$3 nvml=$4 cuda=$5 extra=() args=() out rc why=""
  shift 5
  while [ $# -gt 0 ] && [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  for d in "$@"; do args+=(--device "$d"); done
  out=$(in_ns_dir "$run" "${PODMAN[@]}" --log-level=error run --rm --network none "${FAKE_ENV[@]}" \
    "${extra[@]}" "${args[@]}" localhost/glibc sh -c "$DRV_PROBE" 2>&1)
  rc=$?
  SMI_OUT=$(section smi <<<"$out")
  local want_nodes
  want_nodes=$(printf '%s\n%s\n' "$nodes" "$CTL" | grep . | sort -u)
  [ $rc = 0 ] || why+=" exit $rc;"
  [ "$(section nodes <<<"$out")" = "$want_nodes" ] || why+=" nodes [$(section nodes <<<"$out" | tr '\n' ' ')];"
  [ "$(section fw <<<"$out" | tr '\n' ' ')" = "gsp_ga10x.bin gsp_tu10x.bin " ] || why+=" firmware [$(section fw <<<"$out")];"
  grep -qx "rc 0" <<<"$SMI_OUT" || why+=" nvidia-smi failed;"
  [ "$(uuids_of <<<"$SMI_OUT" | tr '\n' ' ')" = "$nvml " ] || why+=" NVML sees [$(uuids_of <<<"$SMI_OUT" | tr '\n' ' ')];"
  [ "$(cuda_uuids_of <<<"$SMI_OUT" | tr '\n' ' ')" = "$cuda " ] || why+=" CUDA sees [$(cuda_uuids_of <<<"$SMI_OUT" | tr '\n' ' ')];"
  grep -qx "CUDA devices: $(wc -w <<<"$cuda")" <<<"$SMI_OUT" || why+=" CUDA count;"
  [ "$(section ld <<<"$out" | sed -n 2,3p | tr '\n' '|')" = "search cache=/etc/ld.so.cache|trying file=/usr/lib/x86_64-linux-gnu/libcuda.so.1|" ] ||
    why+=" libcuda.so.1 not from the ld cache [$(section ld <<<"$out" | tr '\n' '|')];"
  if [ -z "$why" ]; then
    ok "driver: $name (NVML $(wc -w <<<"$nvml"), CUDA $(wc -w <<<"$cuda"), libcuda.so.1 via ld cache)"
  else
    ko "driver: $name" "$why $(tr '\n' '|' <<<"$out" | head -c 3000)"
  fi
}

expect_driver "MIG slice $KIND=0:1" "$DRV_RUN" "$(printf '/dev/nvidia0\n'; caps 75 76)" \
  "$G0 ${M0[1]}" "${M0[1]}" -- "$KIND=0:1"
expect_driver "whole GPU $KIND=2" "$DRV_RUN" /dev/nvidia2 "$G2" "$G2" -- "$KIND=2"
expect_driver "two devices: MIG 1:3 + GPU by UUID" "$DRV_RUN" \
  "$(printf '/dev/nvidia1\n/dev/nvidia2\n'; caps 228 229)" "$G1 ${M1[3]} $G2" "${M1[3]} $G2" -- "$KIND=1:3" "$KIND=$G2"
expect_driver "$KIND=all" "$DRV_RUN" \
  "$(printf '/dev/nvidia%s\n' 0 1 2 3; caps 66 67 75 76 84 85 93 94 102 103 111 112 120 121 156 157 165 166 219 220 228 229)" \
  "$G0 ${M0[*]} $G1 ${M1[*]} $G2 $G3" "${M0[*]} ${M1[*]} $G2 $G3" -- "$KIND=all"
# A 3-of-4 memory share: the host hook records the limit for the container's cgroup; inside,
# NVML and CUDA report it as GPU 3's total. The fakes match their own cgroup path against
# the recorded host path, so they need the host's cgroup namespace (the real driver doesn't).
DRV_SHARE=$WD/cdi-drv-share
mkdir -p "$DRV_SHARE"
if "$BIN" cdi generate --backend sim:mixed-a100 --config "$WD/shares.yaml" --dev-root "$DEVROOT" \
  --driver-root "$FDR" --output "$DRV_SHARE" --cdi-hook-nvml-lib "$FAKE_LIB" \
  --cdi-hook-env "FAKE_NVML_NODE=$NODE_FILE,FAKE_NVML_LIMITS_FILE=$FG/limits.json" >"$WD/drv-share.log" 2>&1; then
  expect_driver "memory share $KIND=3-share-3" "$DRV_SHARE" /dev/nvidia3 "$G3" "$G3" --cgroupns=host -- "$KIND=3-share-3"
  if grep -qx "NVML $G3: total $want_bytes free $want_bytes" <<<"$SMI_OUT" &&
    grep -q "^CUDA 0: .*(UUID: $G3) free $want_bytes total $want_bytes\$" <<<"$SMI_OUT"; then
    ok "driver: memory share seen as $want_bytes bytes by NVML and CUDA inside the container"
  else
    ko "driver: memory share memory" "$SMI_OUT"
  fi
else
  ko "generate --driver-root shares" "$(cat "$WD/drv-share.log")"
fi

# busybox (no glibc, no ldconfig): the hooks still make the soname links and the ld cache.
out=$(in_ns_dir "$DRV_RUN" "${PODMAN[@]}" --log-level=error run --rm --network none --device "$KIND=2" \
  localhost/busybox sh -c 'readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1; grep -q libcuda.so.1 /etc/ld.so.cache && echo cache; test -x /usr/bin/nvidia-smi && echo smi' 2>&1)
# The link's target may be written relative or absolute; it must name the versioned file.
if [[ $out =~ ^(/usr/lib/x86_64-linux-gnu/)?libcuda\.so\.$DRV_VERSION$'\n'cache$'\n'smi$ ]]; then
  ok "driver in busybox: libcuda.so.1 -> libcuda.so.$DRV_VERSION, ld cache made by the hook, nvidia-smi mounted"
else
  ko "driver in busybox" "$out"
fi

# Hostile image: nothing may appear in the host folders its symlinks point at, nor in the
# host's own ld cache or ld.so.conf.d.
host_sum=$(cat /etc/ld.so.cache /etc/ld.so.conf.d/* 2>/dev/null | sha256sum; ls /etc/ld.so.conf.d)
out=$(in_ns_dir "$DRV_RUN" "${PODMAN[@]}" --log-level=error run --rm --network none --device "$KIND=2" \
  localhost/hostile sh -c 'echo started' 2>&1)
rc=$?
written=$(find "$HOSTILE" -mindepth 2 2>/dev/null)
if [ -z "$written" ] && [ "$host_sum" = "$(cat /etc/ld.so.cache /etc/ld.so.conf.d/* 2>/dev/null | sha256sum; ls /etc/ld.so.conf.d)" ]; then
  if [ $rc = 0 ]; then how="container ran, hooks stayed inside its root"; else how="refused (exit $rc): ${out##*$'\n'}"; fi
  ok "hostile image (absolute symlinks to host folders): nothing written outside the container; $how"
else
  ko "hostile image" "written on the host: [$written]; exit $rc: $out"
fi

# --- the agent stops: its daemons quit, their tmpfs mounts and directories are gone, and a
# share container started afterwards is refused (no unbounded directory in their place).
kill "$AGENT_PID"
wait "$AGENT_PID"
rc=$?
AGENT_PID=
out=$(shm_ctr "$KIND=3-share-1" 'echo started')
crc=$?
if [ $rc = 0 ] && [ -z "$(shm_mount "$MPS/$GPU2/shm")$(shm_mount "$MPS/$GPU3/shm")" ] &&
  [ ! -e "$MPS/$GPU2/shm" ] && [ ! -e "$MPS/$GPU3/shm" ] && [ $crc != 0 ] && ! grep -q "^started" <<<"$out" && grep -q "$MPS/$GPU3/shm" <<<"$out"; then
  ok "agent stopped (exit 0): shm tmpfs unmounted and removed; a share container is then refused (exit $crc: ${out##*$'\n'})"
else
  ko "agent stop" "agent exit $rc; mounts [$(shm_mount "$MPS/$GPU2/shm")$(shm_mount "$MPS/$GPU3/shm")]; container exit $crc: $out; $(ls "$MPS"/* 2>&1 | tr '\n' ' ')"
fi

# --- DRA: `run --dra` on the same node, over the same dev root and fake driver root. The
# emulators run in `gpu-slicer emulate` (a coprocess: one command line in, one answer line
# out); the agent reads claims from its API server and registers in its plugin directory.
DRA=$WD/dra
DRA_CDI=$WD/cdi-dra
DRIVER=gpu-slicer.io
mkdir -p "$DRA" "$DRA_CDI"
echo 'flags: {migStrategy: mixed}' >"$WD/dra.yaml"
coproc EMU { exec "$BIN" emulate --dir "$DRA" --node-name node-a 2>"$WD/emulate.log"; }
EMU_REPLY=
emu() { # command words...: sets EMU_REPLY to the answer line
  EMU_REPLY=
  echo "$*" >&"${EMU[1]}" && read -r -t 90 EMU_REPLY <&"${EMU[0]}"
}
dra_agent() {
  STATE_DIR=$WD/dra-state LABELS_FILE=$WD/dra-labels HTTP_LISTEN=127.0.0.1:0 POD_RESOURCES_SOCKET="" \
    "$BIN" run --backend sim:mixed-a100 --config "$WD/dra.yaml" --dra --node-name node-a \
    --kubeconfig "$DRA/kubeconfig" --kubelet-registry-dir "$DRA/registry" \
    --kubelet-plugins-dir "$DRA/plugins" --device-plugin-dir "$WD/dp-dra" --cdi-dir "$DRA_CDI" \
    --dev-root "$DEVROOT" --driver-root "$FDR" --usage-interval 0 "$@" >>"$WD/dra-agent.log" 2>&1 &
  DRA_PID=$!
}
# claim_file NAME DEVICE...: a claim allocated as the scheduler leaves it, one request per device.
claim_file() {
  local name=$1 i=0 d
  shift
  {
    printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: %s, namespace: e2e}\n' "$name"
    printf 'spec:\n  devices:\n    requests:\n'
    for d in "$@"; do printf '    - {name: r%d, exactly: {deviceClassName: any}}\n' $((i++)); done
    printf 'status:\n  allocation:\n    devices:\n      results:\n'
    i=0
    for d in "$@"; do printf '      - {request: r%d, driver: %s, pool: node-a, device: %s}\n' $((i++)) "$DRIVER" "$d"; done
  } >"$DRA/$name.yaml"
}
# dra_claim NAME DEVICE...: store it; sets CLAIM_UID.
dra_claim() {
  claim_file "$@"
  emu claim "$DRA/$1.yaml"
  CLAIM_UID=${EMU_REPLY#ok }
}
dra_spec() { echo "$DRA_CDI/k8s.$DRIVER-claim_$1.json"; }

read -r -t 30 EMU_REPLY <&"${EMU[0]}"
dra_agent
emu slices
SLICES=${EMU_REPLY#ok }
dra_name() { tr ' ' '\n' <<<"$SLICES" | sed -n "s/=$1\$//p"; }
MIG01=$(dra_name "${M0[1]}")
MIG13=$(dra_name "${M1[3]}")
if [[ $EMU_REPLY == "ok "* ]] && [ "$(dra_name "$G2")" = gpu-2 ] && [ "$(dra_name "$G3")" = gpu-3 ] &&
  [ -n "$MIG01" ] && [ -n "$MIG13" ] && [ -z "$(dra_name "$G0")" ]; then
  ok "DRA: run --dra published node-a's slice: $(wc -w <<<"$SLICES") devices, MIG 0:1 as $MIG01, no whole GPU 0"
else
  ko "DRA slices" "$EMU_REPLY; $(tail -5 "$WD/dra-agent.log")"
fi

# One whole GPU of four: the per-claim spec validates and gives exactly GPU 2.
dra_claim whole gpu-2
WHOLE=$CLAIM_UID
emu prepare e2e whole
WHOLE_ID=k8s.$DRIVER/claim=$WHOLE-gpu-2
if [ "$EMU_REPLY" = "ok $WHOLE_ID" ] && "$BIN" cdi validate "$(dra_spec "$WHOLE")" >/dev/null; then
  ok "DRA: claim e2e/whole prepared as $WHOLE_ID, its spec validates"
else
  ko "DRA prepare whole" "$EMU_REPLY; $(tail -5 "$WD/dra-agent.log")"
fi
expect_driver "DRA claim of GPU 2" "$DRA_CDI" /dev/nvidia2 "$G2" "$G2" -- "$WHOLE_ID"
# The agent writes the claim's status.devices after answering: poll for it.
for _ in $(seq 100); do
  emu claim-status e2e whole
  [[ $EMU_REPLY == *"\"uuid\":\"$G2\""* ]] && break
  sleep 0.1
done
if [[ $EMU_REPLY == *'"device":"gpu-2"'* && $EMU_REPLY == *"\"uuid\":\"$G2\""* && $EMU_REPLY == *'"status":"True"'* ]]; then
  ok "DRA: the claim's status.devices names GPU 2's UUID, Ready"
else
  ko "DRA claim status" "$EMU_REPLY"
fi

# A MIG device, and a claim of two devices (a MIG slice of GPU 1 and GPU 3).
dra_claim mig "$MIG01"
MIG=$CLAIM_UID
emu prepare e2e mig
MIG_ID=${EMU_REPLY#ok }
[ "$MIG_ID" = "k8s.$DRIVER/claim=$MIG-$MIG01" ] || ko "DRA prepare mig" "$EMU_REPLY"
expect_driver "DRA claim of MIG 0:1" "$DRA_CDI" "$(printf '/dev/nvidia0\n'; caps 75 76)" \
  "$G0 ${M0[1]}" "${M0[1]}" -- "$MIG_ID"
dra_claim two "$MIG13" gpu-3
emu prepare e2e two
read -r -a TWO_IDS <<<"${EMU_REPLY#ok }"
[ "${#TWO_IDS[@]}" = 2 ] || ko "DRA prepare two" "$EMU_REPLY"
expect_driver "DRA claim of MIG 1:3 + GPU 3" "$DRA_CDI" "$(printf '/dev/nvidia1\n/dev/nvidia3\n'; caps 228 229)" \
  "$G1 ${M1[3]} $G3" "${M1[3]} $G3" -- "${TWO_IDS[@]}"

# GPU 2 is the whole claim's: another claim for it is refused, nothing written for it.
dra_claim thief gpu-2
THIEF=$CLAIM_UID
emu prepare e2e thief
if [[ $EMU_REPLY == "error "*"already prepared for claim $WHOLE"* ]] && [ ! -e "$(dra_spec "$THIEF")" ]; then
  ok "DRA: a second claim for GPU 2 refused (${EMU_REPLY#error })"
else
  ko "DRA exclusive" "$EMU_REPLY"
fi

# SIGKILL: the restarted agent answers the MIG claim again from its checkpoint, the same ID,
# and the spec still serves it.
kill -KILL "$DRA_PID"
wait "$DRA_PID" 2>/dev/null
dra_agent
emu prepare e2e mig
if [ "$EMU_REPLY" = "ok $MIG_ID" ]; then
  ok "DRA: after SIGKILL and restart the MIG claim is still prepared ($MIG_ID)"
else
  ko "DRA restart" "$EMU_REPLY; $(tail -5 "$WD/dra-agent.log")"
fi
expect_driver "DRA claim of MIG 0:1 after the restart" "$DRA_CDI" "$(printf '/dev/nvidia0\n'; caps 75 76)" \
  "$G0 ${M0[1]}" "${M0[1]}" -- "$MIG_ID"

# Unprepare: the spec is gone and podman refuses the device name; GPU 2 is free for the other claim.
emu unprepare e2e whole
u=$EMU_REPLY
got=$(in_ns_dir "$DRA_CDI" "${PODMAN[@]}" --log-level=error run --rm --network none --device "$WHOLE_ID" \
  localhost/busybox true 2>&1)
rc=$?
if [ "$u" = ok ] && [ ! -e "$(dra_spec "$WHOLE")" ] && [ $rc != 0 ] && grep -q "unresolvable CDI devices" <<<"$got"; then
  ok "DRA: after Unprepare the spec is gone and podman refuses $WHOLE_ID (exit $rc)"
else
  ko "DRA unprepare" "unprepare [$u]; exit $rc: $got"
fi
emu prepare e2e thief
if [ "$EMU_REPLY" = "ok k8s.$DRIVER/claim=$THIEF-gpu-2" ]; then
  ok "DRA: GPU 2 prepared for the other claim once released"
else
  ko "DRA prepare after release" "$EMU_REPLY"
fi

# --- DRA shares (consumable capacity): GPU 2 shared with driver-enforced memory. Two claims
# of 10 GiB and 30 GiB of its 80 GiB, as the scheduler writes them (shareID,
# consumedCapacity): each container's cgroup gets exactly its bytes from the hook in its
# claim's spec, and NVML and CUDA inside report that as the GPU's total; a third claim the
# scheduler over-committed (50 GiB) is refused with the free figure, and fits once a share is
# released. The agent restarts with the hook's fake-NVML environment (the GPUs are released
# first: a device held whole counts as full once it is shared).
emu unprepare e2e thief
emu unprepare e2e two
kill "$DRA_PID"
wait "$DRA_PID" 2>/dev/null
printf '%s\n' 'flags: {migStrategy: mixed}' 'sharing:' '  timeSlicing:' '    resources:' \
  '    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mem, devices: [2], replicas: 4, isolation: memory}' \
  >"$WD/dra.yaml"
dra_agent --cdi-hook-nvml-lib "$FAKE_LIB" \
  --cdi-hook-env "FAKE_NVML_NODE=$NODE_FILE,FAKE_NVML_LIMITS_FILE=$FG/limits.json"
# share_claim NAME GIB SHARE: a claim for GIB GiB of GPU 2, allocated with share ID SHARE.
share_claim() {
  printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: %s, namespace: e2e}\n' "$1"
  printf 'spec:\n  devices:\n    requests:\n    - {name: r0, exactly: {deviceClassName: any, capacity: {requests: {memory: %sGi}}}}\n' "$2"
  printf 'status:\n  allocation:\n    devices:\n      results:\n'
  printf '      - {request: r0, driver: %s, pool: node-a, device: gpu-2, shareID: %s, consumedCapacity: {memory: %sGi, compute: "0"}}\n' \
    "$DRIVER" "$3" "$2"
}
share_ids=()
for gib in 10 30 50; do
  share_claim "share$gib" "$gib" "5a4e0000-0000-4000-8000-0000000000$gib" >"$DRA/share$gib.yaml"
  emu claim "$DRA/share$gib.yaml"
  emu prepare e2e "share$gib"
  share_ids+=("$EMU_REPLY")
done
if [[ ${share_ids[0]} == "ok k8s.$DRIVER/claim="*"-gpu-2-5a4e0000-0000-4000-8000-000000000010" ]] &&
  [[ ${share_ids[1]} == "ok "* ]] && [[ ${share_ids[2]} == "error "*"gpu-2"*"50Gi"*"only 40Gi of its 80Gi"* ]]; then
  ok "DRA shares: 10 GiB and 30 GiB of GPU 2 prepared, the over-committed 50 GiB refused (${share_ids[2]#error })"
else
  ko "DRA shares" "${share_ids[*]}; $(tail -3 "$WD/dra-agent.log")"
fi
for i in 0 1; do
  gib=$((i == 0 ? 10 : 30))
  bytes=$((gib << 30))
  expect_driver "DRA $gib GiB share of GPU 2" "$DRA_CDI" /dev/nvidia2 "$G2" "$G2" --cgroupns=host -- "${share_ids[$i]#ok }"
  if grep -qx "NVML $G2: total $bytes free $bytes" <<<"$SMI_OUT" &&
    grep -q "^CUDA 0: .*(UUID: $G2) free $bytes total $bytes\$" <<<"$SMI_OUT"; then
    ok "DRA share: NVML and CUDA in the container report its own $gib GiB as GPU 2's total"
  else
    ko "DRA share memory ($gib GiB)" "$SMI_OUT"
  fi
done
emu unprepare e2e share10
emu prepare e2e share50
if [[ $EMU_REPLY == "ok "*"-gpu-2-5a4e0000-0000-4000-8000-000000000050" ]]; then
  ok "DRA shares: with 10 GiB released, the 50 GiB claim fits"
else
  ko "DRA share after release" "$EMU_REPLY"
fi

kill "$DRA_PID"
wait "$DRA_PID"
rc=$?
DRA_PID=
echo quit >&"${EMU[1]}"
wait "$EMU_PID"
erc=$?
EMU_PID=
if [ $rc = 0 ] && [ $erc = 0 ] && [ ! -e "$DRA/registry/$DRIVER-reg.sock" ]; then
  ok "DRA: agent stopped (exit 0), registration socket removed; emulators stopped"
else
  ko "DRA stop" "agent exit $rc, emulate exit $erc; $(tail -3 "$WD/emulate.log")"
fi

echo "RESULT: $pass passed, $fail failed"
[ "$fail" = 0 ]
