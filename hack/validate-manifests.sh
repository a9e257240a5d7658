#!/usr/bin/env bash
# Validate everything in deploy/ with real tools: yamllint on the files, then every
# kustomization (the base, deploy/ itself and each overlay) built by real `kubectl kustomize`
# and its output checked by kubernetes-validate --strict for every Kubernetes minor we
# support (1.28 … 1.34; overlays that use the Kubernetes API, deploy/label-configs/ and
# deploy/dra/ with its examples/, against 1.34 … 1.37, the releases they target). Components (kind: Component) are built through the overlays that
# use them. The Prometheus rules in deploy/monitoring/ are checked and unit-tested by
# promtool (src/runtime/metrics/monitoring_tests.rs checks their metric names, and the dashboard's, against a
# real scrape).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/env.sh

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
# Every manifest in base/ is listed by its kustomization (a file left out would never deploy).
for f in deploy/base/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] && continue
  check "base kustomization lists $f" grep -qx -- "- $(basename "$f")" deploy/base/kustomization.yaml
done
check "promtool check rules" promtool check rules deploy/monitoring/rules.yaml
check "promtool test rules" promtool test rules deploy/monitoring/rules.test.yaml
check "dashboard is JSON" python3 -m json.tool deploy/monitoring/dashboard.json /dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
versions=(1.28.0 1.29.0 1.30.0 1.31.0 1.32.0 1.33.0 1.34.0)
api_versions=(1.34.0 1.35.0 1.36.0 1.37.0)
while IFS= read -r k; do
  dir=$(dirname "$k")
  grep -qx 'kind: Component' "$k" && continue
  built=$out/$(echo "$dir" | tr / _).yaml
  if ! kubectl kustomize "$dir" >"$built"; then
    echo "FAILED: kubectl kustomize $dir" >&2
    fail=$((fail + 1))
    continue
  fi
  pass=$((pass + 1))
  minors=("${versions[@]}")
  case $dir in deploy/label-configs | deploy/dra | deploy/dra/*) minors=("${api_versions[@]}") ;; esac
  for v in "${minors[@]}"; do
    check "kubernetes-validate $dir $v" kubernetes-validate --strict --quiet -k "$v" "$built"
  done
done < <(find deploy -name kustomization.yaml | sort)
echo "manifests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
