#!/usr/bin/env bash
# The advise HTML report in a real headless Chromium (Debian's `chromium`, installed by
# hack/install-deps.sh): the report of the 64-GPU fixture rendered to a PNG, kept as the CI
# artifact target/advise-report.png, and no console message (a script error, a blocked
# fetch) while it loads. Usage: hack/advise-report.sh [path to gpu-slicer].
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build -q --bin gpu-slicer
  bin=${CARGO_TARGET_DIR:-target}/debug/gpu-slicer
fi
command -v chromium >/dev/null || { echo "advise-report: chromium not found (hack/install-deps.sh)" >&2; exit 1; }
out=${CARGO_TARGET_DIR:-target}
mkdir -p "$out"
wd=$(mktemp -d /tmp/gs-advise-report.XXXXXX)
trap 'rm -rf "$wd"' EXIT
"$bin" advise --from-file tests/fixtures/advise/fleet-64.json --gpu-hour-price 2.5 \
  --report "$wd/report.html" >/dev/null
rm -f "$out/advise-report.png"
# --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
timeout 120 chromium --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
  --window-size=1400,2400 --screenshot="$out/advise-report.png" "file://$wd/report.html" \
  >"$wd/chromium.out" 2>"$wd/chromium.err"
if grep -q ':CONSOLE' "$wd/chromium.err"; then
  echo "advise-report: console messages while loading the report:" >&2
  grep ':CONSOLE' "$wd/chromium.err" >&2
  exit 1
fi
[ -s "$out/advise-report.png" ] || { cat "$wd/chromium.err" >&2; echo "advise-report: no screenshot" >&2; exit 1; }
echo "advise-report: rendered without console messages: $out/advise-report.png"
