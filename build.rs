//! Generates the kubelet gRPC bindings (device plugin v1beta1, pod-resources v1, DRA v1 and
//! v1beta1, plugin registration, DRA resource health v1alpha1 and v1) from `proto/` into
//! `OUT_DIR`. `protoc` comes from `$PROTOC` when set, else from the `protoc-bin-vendored`
//! build dependency, so no system protobuf compiler is needed.

#[cfg(feature = "agent")]
use std::path::PathBuf;

/// Without the `agent` feature (the fuzz build) nothing speaks gRPC: no bindings, and the
/// code generator is not a build dependency then.
#[cfg(not(feature = "agent"))]
fn main() {}

#[cfg(feature = "agent")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = match std::env::var_os("PROTOC") {
        Some(p) => PathBuf::from(p),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    println!("cargo:rerun-if-env-changed=PROTOC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    compile(
        &protoc,
        &out,
        &[
            "proto/deviceplugin/v1beta1/api.proto",
            "proto/podresources/v1/api.proto",
            "proto/dra/v1/api.proto",
            "proto/dra/v1beta1/api.proto",
            "proto/pluginregistration/v1/api.proto",
            "proto/drahealth/v1alpha1/api.proto",
        ],
    )?;
    // DRA health v1 is the bare package `v1`, as is pod-resources v1: prost writes one file
    // per package, so it gets a directory of its own instead of merging the two.
    let health_v1 = out.join("drahealth_v1");
    std::fs::create_dir_all(&health_v1)?;
    compile(&protoc, &health_v1, &["proto/drahealth/v1/api.proto"])?;
    Ok(())
}

#[cfg(feature = "agent")]
fn compile(
    protoc: &std::path::Path,
    out: &std::path::Path,
    files: &[&str],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    // Allocate answers are built as ordered maps (the domain's `BTreeMap`s): the same type
    // on the wire side moves them into the message instead of re-hashing every entry into
    // a `HashMap` on each call, and encodes them in a stable order.
    config.btree_map([".v1beta1.ContainerAllocateResponse"]);
    // ListAndWatch frames are sent as bytes encoded from per-device fragments
    // (src/proto.rs, `frame`): the same wire message, without re-encoding every device.
    config.extern_path(
        ".v1beta1.ListAndWatchResponse",
        "crate::proto::frame::ListAndWatchResponse",
    );
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(true)
        .out_dir(out)
        .compile_with_config(config, files, &["proto"])?;
    Ok(())
}
