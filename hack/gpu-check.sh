#!/usr/bin/env bash
# Read-only check of gpu-slicer on a machine with a real NVIDIA GPU (issue 12). It never
# changes MIG mode, clocks, limits or any device setting and never resets a GPU; the only
# writes are a CDI spec under a temp dir and, when Podman is present, one short container.
#   GPU_SLICER_BIN=path   binary to use (default: target/release or target/debug gpu-slicer)
# Prints one `CHECK name: result` line per check and the raw facts behind it.
set -u -o pipefail
cd "$(dirname "$0")/.."
BIN=${GPU_SLICER_BIN:-}
if [ -z "$BIN" ]; then
  for b in target/release/gpu-slicer target/debug/gpu-slicer; do [ -x "$b" ] && BIN=$b && break; done
fi
[ -n "$BIN" ] || { cargo build -q && BIN=target/debug/gpu-slicer; }
WD=$(mktemp -d)
trap 'rm -rf "$WD"' EXIT
pass=0 fail=0
check() { if [ "$2" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi; echo "CHECK $1: $2${3:+ ($3)}"; }

echo "== nvidia-smi -L"
nvidia-smi -L | tee "$WD/smi.txt"
echo "== gpu-slicer inventory --backend nvml"
"$BIN" inventory --backend nvml --format json > "$WD/inv.json" || true
python3 - "$WD/inv.json" "$WD/smi.txt" <<'PY'
import json, re, sys
inv = json.load(open(sys.argv[1]))
smi = open(sys.argv[2]).read()
want = set(re.findall(r"UUID: ((?:GPU|MIG)-[0-9a-fA-F-]+)", smi))
have = {g["uuid"] for g in inv["gpus"]} | {m["uuid"] for g in inv["gpus"] for m in g.get("migDevices", [])}
print("driverVersion", inv.get("driverVersion"), "gpus", len(inv["gpus"]))
print("only in nvidia-smi:", sorted(want - have)); print("only in gpu-slicer:", sorted(have - want))
sys.exit(0 if want == have else 1)
PY
[ $? = 0 ] && check "inventory matches nvidia-smi -L" ok || check "inventory matches nvidia-smi -L" FAIL

echo "== gpu-slicer cdi generate --backend nvml"
if "$BIN" cdi generate --backend nvml --output "$WD/cdi/gpu-slicer.yaml" 2>&1 | tee "$WD/gen.txt"; then
  check "cdi generate finds the driver" ok "$(grep -o 'driver .*sockets' "$WD/gen.txt")"
  "$BIN" cdi validate "$WD/cdi" && check "spec validates" ok || check "spec validates" FAIL
  grep -o 'containerPath: [^ ]*' "$WD/cdi/gpu-slicer.yaml" | sort -u | head -40
else
  check "cdi generate finds the driver" FAIL
fi

if command -v podman >/dev/null && [ -f "$WD/cdi/gpu-slicer.yaml" ]; then
  echo "== podman: nvidia-smi -L inside a container on GPU 0"
  uuid=$(grep -m1 -o 'GPU-[0-9a-fA-F-]*' "$WD/smi.txt")
  img=$(podman images --format '{{.Repository}}:{{.Tag}}' | head -1)
  if [ -z "$img" ]; then
    echo "CHECK podman: skipped (no local image; any glibc image will do)"
  else
    mkdir -p /etc/cdi
    out=$(unshare --mount --propagation private sh -c "mount --bind '$WD/cdi' /etc/cdi && podman run --rm --network none --device gpu-slicer.io/gpu=$uuid $img nvidia-smi -L" 2>&1)
    echo "$out"
    n=$(echo "$out" | grep -c '^GPU ')
    if [ "$n" = 1 ] && echo "$out" | grep -q "$uuid"; then check "container sees exactly its GPU" ok; else check "container sees exactly its GPU" FAIL "$n GPUs"; fi
  fi
else
  echo "CHECK podman: skipped (no podman or no spec)"
fi

echo "== gpu-slicer mig apply --dry-run (read-only: plans, applies nothing)"
# Reads every GPU's GPU/compute instances and checks the driver's placements
# (nvmlDeviceGetGpuInstancePossiblePlacements_v2) against gpu-slicer's tables; a mismatch is
# an error naming the profile. The dry run never creates or destroys an instance.
cat > "$WD/layouts.yaml" <<'YAML'
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
YAML
for layout in all-disabled all-enabled; do
  if "$BIN" mig apply --backend nvml --mig-layout-file "$WD/layouts.yaml" --mig-layout "$layout" --dry-run --format json > "$WD/mig-$layout.json" 2> "$WD/mig-$layout.err"; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(g["index"], g["status"], g.get("reason",""), len(g["steps"]), "steps") for g in d["gpus"]]' "$WD/mig-$layout.json"
    check "mig apply --dry-run $layout reads the instances" ok
  else
    cat "$WD/mig-$layout.err"
    check "mig apply --dry-run $layout reads the instances" FAIL "$(head -1 "$WD/mig-$layout.err")"
  fi
done

echo "== NVML memory-limit entry points (symbols only; nothing is called or set)"
python3 - <<'PY'
import ctypes
lib = ctypes.CDLL("libnvidia-ml.so.1")
for sym in ("nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"):
    print(sym, "present" if hasattr(lib, sym) else "absent")
PY
echo "(nvmlDeviceGetMemoryLimits_v1 for this script's cgroup: not called; its argument layout is not yet verified against a driver header)"
echo "RESULT: $pass passed, $fail failed"
[ "$fail" = 0 ]
