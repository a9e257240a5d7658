#!/usr/bin/env bash
# The kube-scheduler's DRA allocator as a library (hack/allocator: Go, on
# k8s.io/dynamic-resource-allocation/structured v0.37.2 with the 1.37 scheduler's default
# features) run on what gpu-slicer publishes. `gpu-slicer dra slices` prints two sim nodes:
#   h100: hack/nodes/dgx-h100.yaml, GPU 0 shared (sharing.timeSlicing, isolation memory),
#         GPUs 1-7 whole;
#   a100: hack/nodes/mixed-a100.yaml with flags.dra.dynamicMig [0] (the MIG-on-demand example
#         needs it: GPU 0's 1g.10gb come from partitionable counters), GPU 1's MIG devices
#         static, GPUs 2 and 3 whole.
# Then deploy/dra/deviceclasses.yaml and the claims of deploy/dra/examples/ are allocated as
# the scheduler would; one PASS/FAIL line per named check, a RESULT line, exit 1 on failure.
#   GPU_SLICER_BIN=path      use this binary instead of building target/debug/gpu-slicer
#   ALLOCATOR_WRITE_CASES=1  also rewrite tests/fixtures/allocator/capacity-cases.json (the
#                            corpus tests/allocator_cases.rs holds the emulator's scheduler to)
set -u
cd "$(dirname "$0")/.."

command -v go >/dev/null || { echo "allocator: needs Go (hack/install-deps.sh)" >&2; exit 1; }
BIN=${GPU_SLICER_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --quiet --bin gpu-slicer || exit 1
  BIN=$PWD/target/debug/gpu-slicer
fi
WD=$(mktemp -d)
trap 'rm -rf "$WD"' EXIT

# Built into target/ so a second run reuses Go's build cache and the binary.
PROG=$PWD/target/allocator
(cd hack/allocator && go build -o "$PROG" .) || { echo "allocator: build failed" >&2; exit 1; }

cat >"$WD/h100.yaml" <<'EOF'
version: v1
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, rename: nvidia.com/gpu.mem, replicas: 8, devices: [0], isolation: memory}
EOF
cat >"$WD/a100.yaml" <<'EOF'
version: v1
flags:
  migStrategy: mixed
  dra: {dynamicMig: [0]}
EOF
for node in h100:dgx-h100 a100:mixed-a100; do
  name=${node%%:*} sim=${node#*:}
  "$BIN" dra slices --backend "sim:hack/nodes/$sim.yaml" --config "$WD/$name.yaml" \
    --node-name "$name" >"$WD/$name-slices.yaml" 2>"$WD/$name-slices.log" || {
    cat "$WD/$name-slices.log" >&2
    echo "FAIL slices/$name: dra slices exited non-zero"
    echo "RESULT allocator: 0 passed, 1 failed"
    exit 1
  }
done

cases=()
if [ "${ALLOCATOR_WRITE_CASES:-0}" = 1 ]; then
  cases=(-write-cases tests/fixtures/allocator/capacity-cases.json)
  mkdir -p tests/fixtures/allocator
fi
"$PROG" -slices "h100=$WD/h100-slices.yaml" -slices "a100=$WD/a100-slices.yaml" \
  -classes deploy/dra/deviceclasses.yaml -examples deploy/dra/examples "${cases[@]}" | tee "$WD/out"
rc=${PIPESTATUS[0]}
pass=$(grep -c '^PASS ' "$WD/out") fail=$(grep -c '^FAIL ' "$WD/out")
if [ "$rc" != 0 ] && [ "$fail" = 0 ]; then fail=1; fi
echo "RESULT allocator: $pass passed, $fail failed"
[ "$fail" = 0 ]
