#!/usr/bin/env bash
# Lay out a fake NVIDIA driver root, as the driver installer leaves it under `/` (or the GPU
# Operator under /run/nvidia/driver), from this workspace's fakes, so `gpu-slicer cdi generate
# --driver-root OUT` can discover it and containers can run against it without a GPU:
#
#   usr/lib/x86_64-linux-gnu/libnvidia-ml.so.VERSION   fake NVML   (crates/fake-nvml), SONAME libnvidia-ml.so.1
#   usr/lib/x86_64-linux-gnu/libcuda.so.VERSION        fake CUDA   (crates/fake-cuda), SONAME libcuda.so.1
#   usr/lib/x86_64-linux-gnu/lib*.so.1                 soname links (made by ldconfig, as on a real host)
#   usr/bin/nvidia-smi                                 the stand-in (crates/fake-smi)
#   lib/firmware/nvidia/VERSION/gsp_{ga10x,tu10x}.bin  GSP firmware (placeholder bytes)
#   run/nvidia-persistenced/socket                     IPC sockets (real unix sockets, nobody listening)
#   run/nvidia-fabricmanager/socket
#   etc/ld.so.conf(.d), etc/ld.so.cache                the root's ld cache, made with `ldconfig -r OUT`
#
# The fakes read their node description from FAKE_NVML_NODE and decide what is visible from
# the device nodes under FAKE_GPU_DEV_ROOT (crates/fake-view): whoever runs a container on
# this root passes both (the e2e mounts the node file and sets them with `podman run -e`).
#
# A script rather than Rust test support: it needs ldconfig and patchelf (the cargo-built
# cdylibs have no SONAME, on purpose: crates/fake-nvml's per-test copies rely on that), and
# both the bash e2e and a person at a shell use it.
#
# usage: hack/fake-driver-root.sh OUT VERSION
#   FAKE_NVML_LIB, FAKE_CUDA_LIB, FAKE_SMI_BIN: use these builds instead of target/debug's
#   (built with `cargo build -p fake-nvml -p fake-cuda -p fake-smi` when absent)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# != 2 ]; then
  echo "usage: $0 OUT VERSION" >&2
  exit 2
fi
OUT=$1
VERSION=$2
if ! [[ $VERSION =~ ^[0-9]+(\.[0-9]+)+$ ]]; then
  echo "fake-driver-root: VERSION must look like 570.124.06, got '$VERSION'" >&2
  exit 2
fi
for tool in patchelf ldconfig python3; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "/sbin/$tool" ] ||
    { echo "fake-driver-root: $tool not found (hack/install-deps.sh installs it)" >&2; exit 1; }
done
LDCONFIG=$(command -v ldconfig || echo /sbin/ldconfig)

NVML=${FAKE_NVML_LIB:-$PWD/target/debug/libnvidia_ml.so}
CUDA=${FAKE_CUDA_LIB:-$PWD/target/debug/libcuda.so}
SMI=${FAKE_SMI_BIN:-$PWD/target/debug/fake-nvidia-smi}
if [ -z "${FAKE_NVML_LIB:-}${FAKE_CUDA_LIB:-}${FAKE_SMI_BIN:-}" ]; then
  cargo build --quiet -p fake-nvml -p fake-cuda -p fake-smi
fi
for f in "$NVML" "$CUDA" "$SMI"; do
  [ -f "$f" ] || { echo "fake-driver-root: $f not found" >&2; exit 1; }
done

mkdir -p "$OUT"
if [ -n "$(ls -A "$OUT")" ]; then
  echo "fake-driver-root: $OUT is not empty; refusing to mix driver roots" >&2
  exit 1
fi
LIB=$OUT/usr/lib/x86_64-linux-gnu
mkdir -p "$LIB" "$OUT/usr/bin" "$OUT/lib/firmware/nvidia/$VERSION" "$OUT/etc/ld.so.conf.d" \
  "$OUT/run/nvidia-persistenced" "$OUT/run/nvidia-fabricmanager"

install -m 0755 "$NVML" "$LIB/libnvidia-ml.so.$VERSION"
install -m 0755 "$CUDA" "$LIB/libcuda.so.$VERSION"
patchelf --set-soname libnvidia-ml.so.1 "$LIB/libnvidia-ml.so.$VERSION"
patchelf --set-soname libcuda.so.1 "$LIB/libcuda.so.$VERSION"
install -m 0755 "$SMI" "$OUT/usr/bin/nvidia-smi"

for fw in gsp_ga10x.bin gsp_tu10x.bin; do
  printf 'fake GSP firmware %s for driver %s\n' "$fw" "$VERSION" >"$OUT/lib/firmware/nvidia/$VERSION/$fw"
done

python3 - "$OUT/run/nvidia-persistenced/socket" "$OUT/run/nvidia-fabricmanager/socket" <<'EOF'
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
EOF

echo 'include /etc/ld.so.conf.d/*.conf' >"$OUT/etc/ld.so.conf"
printf '/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' >"$OUT/etc/ld.so.conf.d/x86_64-linux-gnu.conf"
# Creates the soname links (libcuda.so.1 -> libcuda.so.VERSION, ...) and etc/ld.so.cache.
"$LDCONFIG" -r "$OUT"
for so in libcuda.so.1 libnvidia-ml.so.1; do
  [ "$(readlink "$LIB/$so")" = "${so%.1}.$VERSION" ] ||
    { echo "fake-driver-root: ldconfig made no $so link" >&2; exit 1; }
done
