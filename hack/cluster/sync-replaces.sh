#!/usr/bin/env bash
# Rewrite the replace block of hack/cluster/kube/go.mod from k8s.io/kubernetes' own go.mod:
# one replace per staging module, to the published k8s.io/<module> at the matching v0 tag.
# Run after changing KUBE_VERSION; hack/cluster/build.sh --check fails when they differ.
#
#   hack/cluster/sync-replaces.sh          rewrite go.mod
#   hack/cluster/sync-replaces.sh --check  exit 1 when go.mod's replaces are not the derived ones
set -euo pipefail
cd "$(dirname "$0")/kube"
kube_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit} $1 == "require" && $2 == "k8s.io/kubernetes" {print $3; exit}' go.mod)
[ -n "$kube_version" ] || { echo "sync-replaces: hack/cluster/kube/go.mod requires no k8s.io/kubernetes" >&2; exit 1; }
staging_version="v0.${kube_version#v1.}"
upstream=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$kube_version" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
want=$(awk -v v="$staging_version" '
  /^replace \(/ {r = 1; next}
  r && /^\)/ {r = 0}
  r && $2 == "=>" && $3 ~ /^\.\/staging\// {printf "\t%s => %s %s\n", $1, $1, v}' "$upstream")
[ -n "$want" ] || { echo "sync-replaces: no staging replaces found in $upstream" >&2; exit 1; }
have=$(awk '/^replace \(/ {r = 1; next} r && /^\)/ {r = 0} r' go.mod)
if [ "${1:-}" = --check ]; then
  if [ "$want" != "$have" ]; then
    echo "sync-replaces: hack/cluster/kube/go.mod's replaces differ from k8s.io/kubernetes@$kube_version's staging list; run hack/cluster/sync-replaces.sh" >&2
    diff <(echo "$want") <(echo "$have") >&2 || true
    exit 1
  fi
  exit 0
fi
python3 - go.mod "$want" <<'PY'
import re, sys
path, block = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r"\nreplace \(\n.*?\n\)\n", "\n", text, flags=re.S)
text = text.rstrip("\n") + "\n\nreplace (\n" + block + "\n)\n"
open(path, "w").write(text)
PY
echo "sync-replaces: $(grep -c . <<<"$want") staging modules replaced at $staging_version"
