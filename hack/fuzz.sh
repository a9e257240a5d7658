#!/usr/bin/env bash
# Run every cargo-fuzz target for SECONDS each (default 60) and print the executions.
#
#   hack/fuzz.sh [SECONDS] [TARGET...]
#
# Needs cargo-fuzz (hack/install-deps.sh installs it). cargo-fuzz passes unstable `-Z` flags
# (the sanitizer, coverage instrumentation): a nightly toolchain takes them; where none is
# installed the stable toolchain runs with RUSTC_BOOTSTRAP=1, which lets stable rustc accept
# them (the standard library is then not instrumented, which libFuzzer does not need). The
# smoke never skips: a machine without cargo-fuzz fails it. The seed corpus in
# fuzz/corpus/<target>/ is read, never written: new inputs go to a temp dir and are dropped;
# a crash leaves its input in fuzz/artifacts/ and fails the run.
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
if cargo +nightly --version >/dev/null 2>&1; then
  CARGO=(cargo +nightly)
  toolchain=nightly
else
  CARGO=(env RUSTC_BOOTSTRAP=1 cargo)
  toolchain="stable with RUSTC_BOOTSTRAP=1"
fi
if ! "${CARGO[@]}" fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is not installed (hack/install-deps.sh, or cargo install --locked cargo-fuzz)" >&2
  exit 1
fi
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <("${CARGO[@]}" fuzz list --fuzz-dir fuzz)
fi
work=$(mktemp -d /tmp/gpu-slicer-fuzz.XXXXXX)
build=
trap 'if [ -n "$build" ]; then kill "$build" 2>/dev/null || true; fi; rm -rf "$work"' EXIT

# One build for all targets (optimised, debug assertions on: cargo-fuzz's default). On a
# fresh machine this is most of the smoke's time (it builds the crate again with sanitizer
# flags, without its `agent` feature: the domain and parsers, not tokio, tonic or kube:
# fuzz/Cargo.toml), so it reports its progress every FUZZ_PROGRESS_SECONDS (30).
every=${FUZZ_PROGRESS_SECONDS:-30}
# Coverage-guided, without AddressSanitizer by default: the targets reach safe Rust only
# (the parsers of the lean library; bounds checks and debug assertions stay on), and the ASan
# build costs more than the smoke's whole budget on a 2-core machine (build 273 s against
# 168 s, docs/src/fuzzing.md). FUZZ_SANITIZER=address (or any of cargo-fuzz's) for a deeper run.
sanitizer=${FUZZ_SANITIZER:-none}
echo "fuzz: building ${#targets[@]} targets on $toolchain, sanitizer $sanitizer (the long part on a fresh machine, seconds once built)"
t0=$(date +%s)
"${CARGO[@]}" fuzz build --fuzz-dir fuzz --sanitizer "$sanitizer" >/dev/null 2>"$work/build.log" &
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
  if "${CARGO[@]}" fuzz run --fuzz-dir fuzz --sanitizer "$sanitizer" "$t" "$work/$t" "fuzz/corpus/$t" -- \
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
