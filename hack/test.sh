#!/usr/bin/env bash
# The project's test command (README and CI run exactly this): install what is missing,
# run every Rust test in the workspace, then the end-to-end scripts against real runtimes.
set -euo pipefail
cd "$(dirname "$0")/.."

hack/install-deps.sh
. hack/env.sh
cargo test --workspace 2>&1
# The end-to-end scripts take the binaries built with the tests' feature set: a plain
# `cargo build` resolves features without the dev-dependencies (rustls gains aws-lc-rs, syn
# more features through them) and would build a second copy of most of the tree.
cargo build --workspace --lib --bins --tests --quiet
export GPU_SLICER_BIN=$PWD/target/debug/gpu-slicer FAKE_NVML_LIB=$PWD/target/debug/libnvidia_ml.so \
  FAKE_CUDA_LIB=$PWD/target/debug/libcuda.so FAKE_SMI_BIN=$PWD/target/debug/fake-nvidia-smi
hack/validate-manifests.sh
# `advise --prometheus` on a real Prometheus, both metric families (README "How many GPUs…").
hack/advise-e2e.sh "$GPU_SLICER_BIN"
# The advise report in headless Chromium; the screenshot stays as target/advise-report.png.
hack/advise-report.sh "$GPU_SLICER_BIN"
if [ -x hack/e2e-podman.sh ]; then
  hack/e2e-podman.sh
fi
# The image the manifests name, built with Podman and run as the DaemonSet runs it.
GPU_SLICER_PROFILE=dev hack/e2e-image.sh
# A short smoke of every fuzz target (skipped where no nightly toolchain exists, or with
# FUZZ_SMOKE_SECONDS=0: building the fuzz crate is the costly part).
if [ "${FUZZ_SMOKE_SECONDS:-10}" != 0 ]; then
  FUZZ_SKIP_MISSING=1 hack/fuzz.sh "${FUZZ_SMOKE_SECONDS:-10}"
fi
