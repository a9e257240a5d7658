#!/usr/bin/env bash
# The project's test command (README and CI run exactly this): install what is missing,
# run every Rust test in the workspace, then the end-to-end scripts against real runtimes.
set -euo pipefail
cd "$(dirname "$0")/.."

hack/install-deps.sh
cargo test --workspace 2>&1
hack/validate-manifests.sh
if [ -x hack/e2e-podman.sh ]; then
  hack/e2e-podman.sh
fi
