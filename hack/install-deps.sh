#!/usr/bin/env bash
# Install what the test suite needs on a fresh Debian machine (idempotent; needs root for
# apt). Packages already present are skipped so repeated runs take a second.
set -euo pipefail

apt_pkgs=(podman runc busybox-static uidmap)
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
