# Sourced by the advise scripts: serve the TSDB blocks in $1/data with a Prometheus of its
# own (no scrapes; a retention long enough for backfilled weeks) on a free local port, and
# wait up to $2 × 0.2 s for /-/ready. Sets `port` and `prom_pid` (the caller kills it); on a
# start that never gets ready, prints Prometheus's log and exits 1.
start_prometheus() {
  local wd=$1 tries=$2
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  printf 'global:\n  scrape_interval: 1h\nscrape_configs: []\n' >"$wd/prometheus.yml"
  prometheus --config.file="$wd/prometheus.yml" --storage.tsdb.path="$wd/data" \
    --storage.tsdb.retention.time=10y --web.listen-address="127.0.0.1:$port" >"$wd/prometheus.log" 2>&1 &
  prom_pid=$!
  # Ready when /-/ready answers 200 (python: curl is not among the dependencies).
  python3 - "$port" "$tries" <<'PY' || { cat "$wd/prometheus.log" >&2; exit 1; }
import sys, time, urllib.request
for _ in range(int(sys.argv[2])):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/-/ready", timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.2)
sys.exit("prometheus did not become ready")
PY
}
