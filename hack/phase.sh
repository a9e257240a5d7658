#!/usr/bin/env bash
# `phase NAME CMD...`: run CMD as one named phase of a long script, saying when it starts,
# how long it took and the running total, so a 35-minute `hack/test.sh` is never silent
# about where it is. `phase_summary` prints every phase's time at the end.
#
#   . hack/phase.sh            # then: phase "cargo test" cargo test --workspace
#   hack/phase.sh NAME CMD...  # one phase on its own
#
# A phase's exit status is its command's; the caller's `set -e` stops the script on it.

PHASE_T0=${PHASE_T0:-$(date +%s)}
PHASE_LOG=()

# Seconds as `1m05s` (or `42s`).
phase_fmt() {
  local s=$1
  if [ "$s" -ge 60 ]; then
    printf '%dm%02ds' $((s / 60)) $((s % 60))
  else
    printf '%ds' "$s"
  fi
}

phase() {
  local name=$1
  shift
  local start rc=0 took total
  start=$(date +%s)
  echo "==> [$(phase_fmt $((start - PHASE_T0)))] $name: $*"
  "$@" || rc=$?
  took=$(($(date +%s) - start))
  total=$(($(date +%s) - PHASE_T0))
  if [ "$rc" -eq 0 ]; then
    echo "<== $name: ok in $(phase_fmt "$took") (total $(phase_fmt "$total"))"
    PHASE_LOG+=("$(printf '%-40s %8s' "$name" "$(phase_fmt "$took")")")
  else
    echo "<== $name: FAILED (exit $rc) after $(phase_fmt "$took") (total $(phase_fmt "$total"))"
    PHASE_LOG+=("$(printf '%-40s %8s  FAILED' "$name" "$(phase_fmt "$took")")")
  fi
  return "$rc"
}

phase_summary() {
  echo "==> phases:"
  local line
  for line in "${PHASE_LOG[@]}"; do
    echo "    $line"
  done
  echo "    $(printf '%-40s %8s' total "$(phase_fmt $(($(date +%s) - PHASE_T0)))")"
}

# Executed rather than sourced: one phase.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  if [ $# -lt 2 ]; then
    echo "usage: hack/phase.sh NAME CMD..." >&2
    exit 2
  fi
  phase "$@"
fi
