# Sourced by hack/bench.sh and hack/rss-breakdown.sh: one idle `run` as the RSS figures take it
# (sim:mixed-a100, time-slicing, HTTP endpoint on, the ledger retrying against an absent
# socket). idle_run <bin> <dir> [extra run args...] starts it under an optional prefix command
# in $IDLE_RUN_PREFIX (e.g. valgrind), waits until it idles (its labels file written, or under
# --dra its registration socket bound) and leaves the pid in $pid; it fails, with the log,
# when the daemon exits or is not there within 30 s.
idle_run() {
  local bin=$1 dir=$2
  shift 2
  local dra=
  case " $* " in *" --dra "*) dra=1 ;; esac
  mkdir -p "$dir/dp" "$dir/cdi"
  rm -rf "$dir"/dp/* "$dir/registry" "$dir/labels"
  ${IDLE_RUN_PREFIX:-} "$bin" run --backend sim:mixed-a100 --config hack/configs/mixed-timeslicing.yaml \
    --device-plugin-dir "$dir/dp" --cdi-dir "$dir/cdi" --state-dir "$dir/state" \
    --labels-file "$dir/labels" --http-listen 127.0.0.1:0 \
    --pod-resources-socket "$dir/pod-resources.sock" "$@" >"$dir/run.log" 2>&1 &
  pid=$!
  local _
  for _ in $(seq 600); do
    if [ -n "$dra" ]; then
      [ -S "$dir/registry/gpu-slicer.io-reg.sock" ] && return 0
    else
      # The plugin sockets wait for kubelet.sock, which nobody serves here; the labels
      # file is written once the plan is served.
      [ -s "$dir/labels" ] && return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.05
  done
  echo "idle run not up within 30 s; its log ($dir/run.log):" >&2
  cat "$dir/run.log" >&2
  kill -TERM "$pid" 2>/dev/null || true
  return 1
}
