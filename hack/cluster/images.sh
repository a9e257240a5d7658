#!/usr/bin/env bash
# The local cluster's two images, made from files on this machine (no registry is reachable):
#   PAUSE_REF  the pod sandbox: hack/cluster/runtime/pause, static, as /pause
#   TEST_REF   busybox-static (sh and its applets on /bin) and the fake `nvidia-smi`
#              (crates/fake-smi, with the libraries ldd lists) on /usr/bin. A contract:
#              test pods name it as localhost/gpu-slicer-test:latest.
# Written as OCI archives OUT/pause.tar and OUT/test.tar for `ctr images import`.
#
# usage: hack/cluster/images.sh OUT PAUSE_REF TEST_REF PAUSE_BIN
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# = 4 ] || { echo "usage: $0 OUT PAUSE_REF TEST_REF PAUSE_BIN" >&2; exit 2; }
out=$1 pause_ref=$2 test_ref=$3 pause_bin=$4
command -v busybox >/dev/null || { echo "images: busybox missing (busybox-static; hack/install-deps.sh)" >&2; exit 1; }
smi=${FAKE_SMI_BIN:-$PWD/target/debug/fake-nvidia-smi}
[ -x "$smi" ] || cargo build --quiet -p fake-smi
mkdir -p "$out"
wd=$(mktemp -d)
trap 'rm -rf "$wd"' EXIT

mkdir -p "$wd/pause"
cp "$pause_bin" "$wd/pause/pause"
python3 hack/cluster/oci-archive.py "$wd/pause" "$pause_ref" "$out/pause.tar" --entrypoint /pause

r=$wd/test
mkdir -p "$r/bin" "$r/usr/bin" "$r/tmp" "$r/etc" "$r/dev" "$r/proc" "$r/sys" "$r/run"
cp "$(command -v busybox)" "$r/bin/busybox"
for a in $("$r/bin/busybox" --list); do
  [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"
done
cp "$smi" "$r/usr/bin/nvidia-smi"
ldd "$smi" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u | while read -r lib; do
  mkdir -p "$r$(dirname "$lib")"
  cp -L "$lib" "$r$lib"
done
echo 'root:x:0:0:root:/:/bin/sh' >"$r/etc/passwd"
python3 hack/cluster/oci-archive.py "$r" "$test_ref" "$out/test.tar" \
  --env PATH=/usr/bin:/bin --cmd sh
