#!/usr/bin/env bash
# Build the gpu-slicer image from Containerfile with Podman, without any registry, and run
# it the way the DaemonSet does: `--version`, then the init container's own
# `cdi-hook install` args (taken from `kubectl kustomize deploy/`) into a host directory.
#
#   hack/e2e-image.sh          build in a private store under a temp dir (CI), then remove it
#   hack/e2e-image.sh --keep   build into the host's Podman store and keep the image
#   GPU_SLICER_PROFILE=dev     stage the debug build (CI: hack/test.sh has just built it, so
#                              no release build is paid for; stripped, ~22 MB)
#   GPU_SLICER_BIN=path        stage this binary instead of building one
#   IMAGE_OCI_ARCHIVE=path     also save the image there as an OCI archive (the local
#                              cluster imports it into containerd: hack/cluster.sh)
#
# The base of the assemble stage (`localhost/gpu-slicer-busybox`) is imported from a tar of
# Debian's busybox-static; the runtime stage is FROM scratch plus the binary and the
# libraries `ldd` lists for it. The image is tagged with exactly the reference the built
# manifests name, which must carry the crate's version. Runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/env.sh

keep=0
[ "${1:-}" = --keep ] && keep=1
if [ "$(id -u)" != 0 ]; then
  echo "e2e-image: must run as root (podman build, chroot in the build)" >&2
  exit 1
fi
for tool in podman busybox ldd; do
  command -v "$tool" >/dev/null || { echo "e2e-image: $tool missing (hack/install-deps.sh)" >&2; exit 1; }
done

WD=$(mktemp -d /tmp/gpu-slicer-image.XXXXXX)
trap 'rm -rf "$WD"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
ko() { fail=$((fail + 1)); echo "FAIL $1: $2"; }

# --- what the manifests name
kubectl kustomize deploy/ >"$WD/deploy.yaml"
python3 - "$WD/deploy.yaml" >"$WD/refs" <<'PY'
import sys, yaml
for o in yaml.safe_load_all(open(sys.argv[1])):
    if o and o["kind"] == "DaemonSet":
        pod = o["spec"]["template"]["spec"]
        for c in pod["initContainers"] + pod["containers"]:
            print(c["name"], c["image"], *c.get("args", []))
PY
IMAGE=$(awk '{print $2}' "$WD/refs" | sort -u)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
if [ "$(wc -l <<<"$IMAGE")" != 1 ]; then
  ko "one image" "the DaemonSet names several: $IMAGE"
  exit 1
fi
[ "${IMAGE##*:}" = "$version" ] && ok "manifests name the crate version ($IMAGE)" ||
  ko "image tag" "$IMAGE is not version $version"

# --- the binary and what it links
BIN=${GPU_SLICER_BIN:-}
if [ -z "$BIN" ]; then
  if [ "${GPU_SLICER_PROFILE:-release}" = dev ]; then
    cargo build --quiet --bin gpu-slicer
    BIN=target/debug/gpu-slicer
  else
    cargo build --quiet --release --bin gpu-slicer
    BIN=target/release/gpu-slicer
  fi
fi
ctx=$WD/context
mkdir -p "$ctx/rootfs/usr/bin"
# Symbols are no use in the image (the release profile strips them already).
strip --strip-all -o "$ctx/rootfs/usr/bin/gpu-slicer" "$BIN"
STAGED=$ctx/rootfs/usr/bin/gpu-slicer
# `ldd` prints `name => /path (addr)` and the loader as `/path (addr)`; vdso has no file.
ldd "$BIN" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u >"$WD/libs"
while read -r lib; do
  mkdir -p "$ctx/rootfs$(dirname "$lib")"
  cp -L "$lib" "$ctx/rootfs$lib"
done <"$WD/libs"
cp Containerfile "$ctx/Containerfile"

# --- podman, private unless --keep
cat >"$WD/containers.conf" <<EOC
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOC
export CONTAINERS_CONF=$WD/containers.conf
PODMAN=(podman)
[ "$keep" = 1 ] || PODMAN=(podman --root "$WD/root" --runroot "$WD/runroot" --storage-driver vfs)
export TMPDIR=$WD

# The assemble stage's base: busybox-static and the applets the Containerfile runs.
if ! "${PODMAN[@]}" image exists localhost/gpu-slicer-busybox; then
  bb=$WD/busybox
  mkdir -p "$bb/bin" "$bb/tmp"
  cp "$(command -v busybox)" "$bb/bin/busybox"
  for a in sh mkdir chmod echo printf chroot; do ln -s busybox "$bb/bin/$a"; done
  tar -C "$bb" -cf "$WD/busybox.tar" .
  "${PODMAN[@]}" import -q --change 'ENV PATH=/bin' "$WD/busybox.tar" localhost/gpu-slicer-busybox >/dev/null
fi
if "${PODMAN[@]}" build -q --network none --pull=never -t "$IMAGE" -f "$ctx/Containerfile" "$ctx" >"$WD/build.log" 2>&1; then
  ok "podman build $IMAGE"
else
  ko "podman build" "$(tail -20 "$WD/build.log")"
  echo "RESULT: $pass passed, $fail failed"
  exit 1
fi
if [ -n "${IMAGE_OCI_ARCHIVE:-}" ]; then
  rm -f "$IMAGE_OCI_ARCHIVE"
  "${PODMAN[@]}" save -q --format oci-archive -o "$IMAGE_OCI_ARCHIVE" "$IMAGE" &&
    ok "saved as an OCI archive: $IMAGE_OCI_ARCHIVE" || ko "save" "podman save -o $IMAGE_OCI_ARCHIVE failed"
fi
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
echo "image $IMAGE: $((size / 1024 / 1024)) MiB, files: $(cd "$ctx/rootfs" && find . -type f | sort | tr '\n' ' ')"
user=$("${PODMAN[@]}" image inspect --format '{{.Config.User}}' "$IMAGE")
[ "$user" = 65532:65532 ] && ok "default user is non-root ($user)" || ko "user" "$user"

RUN=("${PODMAN[@]}" run --rm --network none --read-only --cap-drop=all)
out=$("${RUN[@]}" "$IMAGE" --version 2>&1) && [ "$out" = "gpu-slicer $version" ] &&
  ok "gpu-slicer --version: $out" || ko "--version" "$out"

# Nothing but the binary: no shell to run.
if "${RUN[@]}" --entrypoint /bin/sh "$IMAGE" -c true >/dev/null 2>&1; then
  ko "no shell" "/bin/sh runs in the image"
else
  ok "no shell in the image"
fi

# The init container, as the DaemonSet runs it: root, read-only root fs, no capabilities,
# its own args, the install directory a host directory.
read -r -a init_args <<<"$(awk '$1 == "install-hook" {$1 = ""; $2 = ""; print}' "$WD/refs")"
to=""
for a in "${init_args[@]}"; do
  case $a in --to=*) to=${a#--to=} ;; esac
done
hostbin=$WD/hook-bin
mkdir -p "$hostbin"
if out=$("${RUN[@]}" --user 0 -v "$hostbin:$to" "$IMAGE" "${init_args[@]}" 2>&1) &&
  [ -x "$hostbin/gpu-slicer" ] && cmp -s "$hostbin/gpu-slicer" "$STAGED"; then
  ok "cdi-hook install ${init_args[*]}: the image's binary is on the host"
else
  ko "cdi-hook install" "$out; $(ls -l "$hostbin")"
fi
# The installed copy runs on the host (it is what runtimes execute as the CDI hook).
out=$("$hostbin/gpu-slicer" --version 2>&1) && ok "installed hook runs on the host" ||
  ko "installed hook" "$out"
echo "RESULT: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
