//! Generates the kubelet gRPC bindings (device plugin v1beta1, pod-resources v1) from
//! `proto/` into `OUT_DIR`. `protoc` comes from `$PROTOC` when set, else from the
//! `protoc-bin-vendored` build dependency, so no system protobuf compiler is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = match std::env::var_os("PROTOC") {
        Some(p) => PathBuf::from(p),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(true)
        .compile_with_config(
            config,
            &[
                "proto/deviceplugin/v1beta1/api.proto",
                "proto/podresources/v1/api.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
