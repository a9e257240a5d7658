#!/usr/bin/env bash
# End-to-end: gpu-slicer's DRA sockets reached with the kubelet's own client code.
# hack/kubelet-dial (grpc-go and the generated k8s.io/kubelet v0.37.2 APIs) dials the
# registration socket as the kubelet's plugin watcher does — the bare socket path with a unix
# context dialer, so the path goes out as the HTTP/2 :authority, which h2 refuses unless the
# agent reads its clients leniently (platform::uds_authority) — then GetInfo,
# NotifyRegistrationStatus, and NodePrepareResources / NodeUnprepareResources of a claim held
# by `gpu-slicer emulate` (the API-server emulator) on the endpoint GetInfo names.
#   GPU_SLICER_BIN=path  use this binary instead of building target/debug/gpu-slicer (it
#                        runs `emulate` too, so it must be built with `--features testkit`)
set -u
cd "$(dirname "$0")/.."

command -v go >/dev/null || { echo "e2e-kubelet-dial: needs Go (hack/install-deps.sh)" >&2; exit 1; }
BIN=${GPU_SLICER_BIN:-}
if [ -z "$BIN" ]; then
  # `emulate` is test support, built only with the testkit feature (as `cargo test` builds it).
  cargo build --quiet --features testkit --bin gpu-slicer || exit 1
  BIN=$PWD/target/debug/gpu-slicer
fi
WD=$(mktemp -d)
AGENT_PID= EMU_PID=
cleanup() {
  [ -n "$AGENT_PID" ] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
  [ -n "$EMU_PID" ] && kill "$EMU_PID" 2>/dev/null && wait "$EMU_PID" 2>/dev/null
  rm -rf "$WD"
}
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
ko() { fail=$((fail + 1)); echo "FAIL $1: $2"; }

# The probe is built into target/ so a second run reuses Go's build cache and the binary.
PROBE=$PWD/target/kubelet-dial
(cd hack/kubelet-dial && go build -o "$PROBE" .) || { echo "e2e-kubelet-dial: probe build failed" >&2; exit 1; }

EMU_DIR=$WD/emu
mkdir -p "$EMU_DIR"
coproc EMU { exec "$BIN" emulate --dir "$EMU_DIR" --node-name node-a 2>"$WD/emulate.log"; }
EMU_REPLY=
emu() { EMU_REPLY=; echo "$*" >&"${EMU[1]}" && read -r -t 90 EMU_REPLY <&"${EMU[0]}"; }
read -r -t 30 EMU_REPLY <&"${EMU[0]}"

REG=$EMU_DIR/registry/gpu-slicer.io-reg.sock
STATE_DIR=$WD/state LABELS_FILE=$WD/labels HTTP_LISTEN=127.0.0.1:0 POD_RESOURCES_SOCKET="" \
  "$BIN" run --backend sim:mixed-a100 --dra --node-name node-a --kubeconfig "$EMU_DIR/kubeconfig" \
  --kubelet-registry-dir "$EMU_DIR/registry" --kubelet-plugins-dir "$EMU_DIR/plugins" \
  --device-plugin-dir "$WD/dp" --cdi-dir "$WD/cdi" --usage-interval 0 >"$WD/agent.log" 2>&1 &
AGENT_PID=$!
# The slices are published once the agent serves; `slices` answers with what the API holds.
for _ in $(seq 1 300); do
  emu slices
  [[ $EMU_REPLY == *gpu-2=* ]] && [ -S "$REG" ] && break
  sleep 0.1
done

# Registration only: the plugin watcher's dial, GetInfo, NotifyRegistrationStatus.
out=$("$PROBE" -registration "$REG" 2>&1)
if [[ $out == *"ok GetInfo type=DRAPlugin name=gpu-slicer.io"*"ok NotifyRegistrationStatus"* ]]; then
  ok "kubelet-style dial of the registration socket (path as :authority): $(head -1 <<<"$out")"
else
  ko "registration" "$out; agent: $(tail -3 "$WD/agent.log")"
fi

# A claim the scheduler allocated (GPU 2, whole) prepared and unprepared over the endpoint.
cat >"$WD/claim.yaml" <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: dial, namespace: e2e}
spec:
  devices:
    requests:
    - {name: r0, exactly: {deviceClassName: any}}
status:
  allocation:
    devices:
      results:
      - {request: r0, driver: gpu-slicer.io, pool: node-a, device: gpu-2}
YAML
emu claim "$WD/claim.yaml"
UID_=${EMU_REPLY#ok }
out=$("$PROBE" -registration "$REG" -namespace e2e -name dial -uid "$UID_" 2>&1)
spec=$WD/cdi/k8s.gpu-slicer.io-claim_$UID_.json
if [[ $out == *"ok NodePrepareResources pool=node-a device=gpu-2 cdi=k8s.gpu-slicer.io/claim=$UID_-gpu-2"*"ok NodeUnprepareResources"* ]] &&
  [ ! -e "$spec" ]; then
  ok "NodePrepareResources and NodeUnprepareResources over the endpoint, dialled the same way; spec removed"
else
  ko "prepare/unprepare" "$out; spec $(ls "$WD/cdi" 2>&1); agent: $(tail -3 "$WD/agent.log")"
fi

echo "RESULT: $pass passed, $fail failed"
[ "$fail" = 0 ]
