#!/usr/bin/env bash
# The project's test command (README and CI run exactly this): install what is missing,
# run every Rust test in the workspace, then the end-to-end scripts against real runtimes.
# Each step is a named phase (hack/phase.sh) that prints its start, its time and the
# running total; the table of all phases ends the output, even when one fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/phase.sh
trap phase_summary EXIT

phase "install dependencies" hack/install-deps.sh
. hack/env.sh
phase "cargo test --workspace" cargo test --workspace 2>&1
# The book (docs/, mdBook) builds and every link and anchor in it and the README resolves;
# the MSRV is named only as Cargo.toml declares it. Then the API docs, private items included
# (they are most of them): no broken or ambiguous intra-doc link. The test support is
# documented too (its feature, `testkit`, is on).
phase "docs" hack/check-docs.sh
phase "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --all-features --quiet
# The library without the node agent (no tokio, tonic, hyper, kube: what fuzz/ builds on)
# compiles without a warning, also where the fuzz smoke is left out.
phase "lean library" env RUSTFLAGS="-D warnings" cargo check --lib --no-default-features --quiet --target-dir target/lean
# The end-to-end scripts take the binaries built with the tests' feature set: a plain
# `cargo build` resolves features without the dev-dependencies (rustls gains aws-lc-rs, syn
# more features through them) and would build a second copy of most of the tree.
phase "build binaries for the scripts" cargo build --workspace --lib --bins --tests --quiet
export GPU_SLICER_BIN=$PWD/target/debug/gpu-slicer FAKE_NVML_LIB=$PWD/target/debug/libnvidia_ml.so \
  FAKE_CUDA_LIB=$PWD/target/debug/libcuda.so FAKE_SMI_BIN=$PWD/target/debug/fake-nvidia-smi
# Every command the README and the book show, run as written on the simulated node (or
# skipped for a named reason: a GPU, a cluster, root, the network), and the output they show.
phase "docs commands" hack/docs-commands.py
phase "validate manifests" hack/validate-manifests.sh
# The kube-scheduler's DRA allocator (Go, k8s.io/dynamic-resource-allocation v0.37.2) on what
# `dra slices` publishes: every example claim, consumable capacity, counters, refusals.
phase "allocator tier" hack/allocator.sh
# The kubelet's own gRPC client (grpc-go, k8s.io/kubelet APIs) against `run --dra`.
phase "kubelet dial end to end" hack/e2e-kubelet-dial.sh
# `advise --prometheus` on a real Prometheus, both metric families (docs/src/advise.md).
phase "advise on prometheus" hack/advise-e2e.sh "$GPU_SLICER_BIN"
# The fleet check (issue 32 item 6): 64 GPUs on 8 real agents scraped by a real Prometheus,
# with gpu-slicer's metrics and a generated dcgm-exporter exposition; plan applied, usage
# replayed, grants, utilisation and GPU count checked from Prometheus (about 3 minutes).
phase "advise fleet check" hack/advise-fleet.sh "$GPU_SLICER_BIN"
# The advise report in headless Chromium; the screenshot stays as target/advise-report.png.
phase "advise report in chromium" hack/advise-report.sh "$GPU_SLICER_BIN"
if [ -x hack/e2e-podman.sh ]; then
  phase "podman end to end" hack/e2e-podman.sh
fi
# The image the manifests name, built with Podman and run as the DaemonSet runs it.
phase "image end to end" env GPU_SLICER_PROFILE=dev hack/e2e-image.sh
# A real one-node Kubernetes v1.37 (hack/cluster.sh: apiserver, scheduler, controller-manager,
# kubelet, containerd, built from their Go modules) with fake GPUs: the agent deployed from
# deploy/ in device-plugin mode, then deploy/dra/, and the scenarios of hack/e2e-cluster.sh.
# The first run builds Kubernetes (10-35 min on 2 cores); later runs reuse Go's caches.
phase "build the cluster (Go modules)" hack/cluster/build.sh
phase "cluster end to end" hack/e2e-cluster.sh
# A short smoke of every fuzz target (nightly, else stable with RUSTC_BOOTSTRAP=1; never
# skipped, except with FUZZ_SMOKE_SECONDS=0: building the fuzz crate is the costly part).
if [ "${FUZZ_SMOKE_SECONDS:-10}" != 0 ]; then
  phase "fuzz smoke" hack/fuzz.sh "${FUZZ_SMOKE_SECONDS:-10}"
fi
