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
# Overlays: merge each patch onto the base object it names (strategic merge as kustomize
# does it for these shapes: maps merge, lists of named items merge by name, other lists are
# replaced) and validate the merged objects the same way.
for overlay in deploy/*/kustomization.yaml; do
  [ -e "$overlay" ] || continue
  odir=$(dirname "$overlay")
  out=$(mktemp -d)
  check "merge $odir" python3 - "$odir" "$out" <<'PY'
import os, sys, yaml

odir, out = sys.argv[1], sys.argv[2]
kust = yaml.safe_load(open(os.path.join(odir, "kustomization.yaml")))
base_dir = os.path.normpath(os.path.join(odir, kust["resources"][0]))
base_kust = yaml.safe_load(open(os.path.join(base_dir, "kustomization.yaml")))
objs = [yaml.safe_load(open(os.path.join(base_dir, f))) for f in base_kust["resources"]]

def merge(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        r = dict(a)
        for k, v in b.items():
            r[k] = merge(a[k], v) if k in a else v
        return r
    if isinstance(a, list) and isinstance(b, list) and all(
        isinstance(x, dict) and "name" in x for x in a + b
    ):
        r = list(a)
        for item in b:
            i = next((j for j, x in enumerate(r) if x["name"] == item["name"]), None)
            if i is None:
                r.append(item)
            else:
                r[i] = merge(r[i], item)
        return r
    return b

for p in kust["patches"]:
    patch = yaml.safe_load(open(os.path.join(odir, p["path"])))
    hits = [i for i, o in enumerate(objs)
            if o["kind"] == patch["kind"] and o["metadata"]["name"] == patch["metadata"]["name"]]
    if len(hits) != 1:
        sys.exit(f"{odir}/{p['path']}: patches no base object")
    objs[hits[0]] = merge(objs[hits[0]], patch)
for i, o in enumerate(objs):
    with open(os.path.join(out, f"{i}-{o['kind'].lower()}.yaml"), "w") as f:
        yaml.safe_dump(o, f)
PY
  for v in 1.28.0 1.34.0; do
    check "kubernetes-validate $odir $v" kubernetes-validate --strict --quiet -k "$v" "$out"/*.yaml
  done
  rm -rf "$out"
done
echo "manifests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
