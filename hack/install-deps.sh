#!/usr/bin/env bash
# Install what the test suite needs on a fresh Debian machine (idempotent; needs root for
# apt). Packages already present are skipped so repeated runs take a second.
set -euo pipefail

apt_pkgs=(podman runc busybox-static uidmap prometheus patchelf python3)
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

# Python validators used by the tests (kubernetes-validate, yamllint, check-jsonschema).
py_missing=()
for tool in kubernetes-validate yamllint check-jsonschema; do
  command -v "$tool" >/dev/null 2>&1 || py_missing+=("$tool")
done
if ((${#py_missing[@]})); then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    kubernetes-validate==1.37.0 yamllint==1.38.0 check-jsonschema==0.39.0
fi
