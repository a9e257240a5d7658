#!/usr/bin/env bash
# Run every cargo-fuzz target for SECONDS each (default 60) and print the executions.
#
#   hack/fuzz.sh [SECONDS] [TARGET...]
#
# Needs a nightly toolchain and cargo-fuzz (hack/install-deps.sh installs cargo-fuzz where
# nightly exists). The seed corpus in fuzz/corpus/<target>/ is read, never written: new
# inputs go to a temp dir and are dropped; a crash leaves its input in fuzz/artifacts/ and
# fails the run. With FUZZ_SKIP_MISSING=1 (CI), a machine without the toolchain skips.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
# libFuzzer reads -max_total_time=0 as "no limit".
if ! [[ $secs =~ ^[0-9]+$ ]] || [ "$secs" -eq 0 ]; then
  echo "fuzz: SECONDS must be a whole number above 0, not \`$secs\`" >&2
  exit 2
fi
targets=("$@")
if ! cargo +nightly --version >/dev/null 2>&1 || ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  if [ "${FUZZ_SKIP_MISSING:-0}" = 1 ]; then
    echo "fuzz: no nightly toolchain or cargo-fuzz; skipped"
    exit 0
  fi
  echo "fuzz: needs \`cargo +nightly\` and cargo-fuzz (cargo install cargo-fuzz)" >&2
  exit 1
fi
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
fi
work=$(mktemp -d /tmp/gpu-slicer-fuzz.XXXXXX)
build=
trap 'if [ -n "$build" ]; then kill "$build" 2>/dev/null || true; fi; rm -rf "$work"' EXIT

# One build for all targets (optimised, debug assertions on: cargo-fuzz's default). On a
# fresh machine this is most of the smoke's time (it builds the crate again with nightly
# and sanitizer flags), so it reports its progress every FUZZ_PROGRESS_SECONDS (30).
every=${FUZZ_PROGRESS_SECONDS:-30}
echo "fuzz: building ${#targets[@]} targets (cargo +nightly fuzz build; the long part on a fresh machine, seconds once built)"
t0=$(date +%s)
cargo +nightly fuzz build --fuzz-dir fuzz >/dev/null 2>"$work/build.log" &
build=$!
next=$((t0 + every))
while kill -0 "$build" 2>/dev/null; do
  sleep 1
  now=$(date +%s)
  if [ "$now" -ge "$next" ]; then
    crates=$(grep -c '^ *Compiling ' "$work/build.log" || true)
    last=$(grep '^ *Compiling ' "$work/build.log" | tail -1 | sed 's/^ *Compiling //' || true)
    echo "fuzz: building for $((now - t0))s: $crates crates compiled${last:+, now $last}"
    next=$((now + every))
  fi
done
rc=0
wait "$build" || rc=$?
build=
if [ "$rc" -ne 0 ]; then
  cat "$work/build.log" >&2
  exit 1
fi
echo "fuzz: built in $(($(date +%s) - t0))s; running each target for ${secs}s"
pass=0
fail=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  log=$work/$t.log
  if cargo +nightly fuzz run --fuzz-dir fuzz "$t" "$work/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=1024 -max_len=65536 \
    >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "PASS $t: ${execs:-?} executions in ${secs}s, ${cov:-cov ?}"
    pass=$((pass + 1))
  else
    echo "FAIL $t:"
    tail -40 "$log"
    fail=$((fail + 1))
  fi
done
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
