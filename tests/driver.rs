//! The driver in the spec through the real binary: `cdi generate` against fake driver
//! roots (files, symlinks, a socket), its new flags and outputs, `cdi list` / `cdi
//! validate` on directories, and the driver hooks run for real on temp container roots
//! (a busybox-like root with no /etc and no ldconfig; a hostile root whose absolute and
//! `..` symlinks aim at the host).

use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const V: &str = "570.124.06"; // the built-in sim profiles' driverVersion
const LIB: &str = "usr/lib/x86_64-linux-gnu";

fn bin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run gpu-slicer")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write(root: &Path, rel: &str, body: &str) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, body).expect("write");
    p
}

/// A fake driver root: libraries, firmware, nvidia-smi, and an empty dev/.
fn driver_root() -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tmp");
    let r = t.path();
    write(r, &format!("{LIB}/libcuda.so.{V}"), "cuda");
    write(r, &format!("{LIB}/libnvidia-ml.so.{V}"), "nvml");
    write(r, &format!("lib/firmware/nvidia/{V}/gsp_ga10x.bin"), "fw");
    let smi = write(r, "usr/bin/nvidia-smi", "#!/bin/sh\n");
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::create_dir_all(r.join("dev")).expect("dev");
    t
}

fn generate(extra: &[&str]) -> Output {
    let mut args = vec![
        "cdi",
        "generate",
        "--backend",
        "sim:mixed-a100",
        "--cdi-hook-path",
        "/usr/local/bin/gpu-slicer",
    ];
    args.extend_from_slice(extra);
    bin(&args)
}

fn spec_at(path: &Path) -> serde_json::Value {
    let t = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&t).expect("spec parses")
}

#[test]
fn generate_with_driver_root_writes_the_named_file_with_driver_mounts() {
    let root = driver_root();
    let out_dir = tempfile::tempdir().expect("tmp");
    let file = out_dir.path().join("spec.yaml");
    let r = root.path().to_str().expect("utf8");
    let o = generate(&["--driver-root", r, "--output", file.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let said = text(&o.stdout);
    assert!(
        said.contains("2 libraries, 1 firmware, 1 binaries"),
        "{said}"
    );
    let spec = spec_at(&file);
    assert_eq!(spec["cdiVersion"], "0.5.0");
    let edits = &spec["containerEdits"];
    assert_eq!(edits["env"][0], "NVIDIA_VISIBLE_DEVICES=void");
    let mounts = edits["mounts"].as_array().expect("mounts");
    let paths: Vec<&str> = mounts
        .iter()
        .map(|m| m["containerPath"].as_str().expect("s"))
        .collect();
    assert_eq!(
        paths,
        vec![
            format!("/lib/firmware/nvidia/{V}/gsp_ga10x.bin"),
            "/usr/bin/nvidia-smi".to_string(),
            format!("/{LIB}/libcuda.so.{V}"),
            format!("/{LIB}/libnvidia-ml.so.{V}"),
        ]
    );
    for m in mounts {
        assert!(m["hostPath"].as_str().expect("s").starts_with(r), "{m}");
        assert_eq!(
            m["options"],
            serde_json::json!(["ro", "nosuid", "nodev", "bind"])
        );
    }
    let hooks: Vec<&str> = edits["hooks"]
        .as_array()
        .expect("hooks")
        .iter()
        .map(|h| h["args"][2].as_str().expect("s"))
        .collect();
    assert_eq!(
        hooks,
        [
            "create-symlinks",
            "update-ldcache",
            "disable-device-node-modification"
        ]
    );
    // The nvidia-ctk spelling of the flag, and a JSON file by extension.
    let json = out_dir.path().join("spec.json");
    let o = generate(&[
        "--nvidia-driver-root",
        r,
        "--output",
        json.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("is JSON");
    assert_eq!(
        j["containerEdits"]["mounts"],
        spec["containerEdits"]["mounts"]
    );
    // One spec file per name: writing the JSON removed its YAML twin (runtimes would load
    // both and refuse every device they share).
    assert!(
        !out_dir.path().join("spec.yaml").exists(),
        "the YAML twin is left"
    );
    let o = bin(&["cdi", "validate", out_dir.path().to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", text(&o.stdout));
    // Two files of one kind in a directory, as a runtime loads them: their shared device
    // names are a conflict.
    std::fs::copy(&json, out_dir.path().join("other.json")).expect("copy");
    let o = bin(&["cdi", "validate", out_dir.path().to_str().expect("utf8")]);
    assert!(!o.status.success());
    let said = text(&o.stdout);
    assert!(
        said.contains("conflict: gpu-slicer.io/gpu=0 is offered by"),
        "{said}"
    );
}

#[test]
fn container_driver_root_is_read_while_host_paths_name_the_host_root() {
    let root = driver_root();
    let o = generate(&[
        "--driver-root",
        "/run/nvidia/driver",
        "--container-driver-root",
        root.path().to_str().expect("utf8"),
        "--dev-root",
        "/",
        "--output",
        "-",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let spec: serde_json::Value = serde_yaml_ng::from_str(&text(&o.stdout)).expect("yaml");
    let mounts = spec["containerEdits"]["mounts"].as_array().expect("mounts");
    assert_eq!(mounts.len(), 4);
    for m in mounts {
        let host = m["hostPath"].as_str().expect("s");
        let inside = m["containerPath"].as_str().expect("s");
        assert_eq!(host, format!("/run/nvidia/driver{inside}"));
    }
    // --dev-root / keeps the real /dev: no hostPath on device nodes.
    let n = &spec["devices"][0]["containerEdits"]["deviceNodes"][0];
    assert!(n.get("hostPath").is_none(), "{n}");
}

#[test]
fn a_missing_driver_is_an_error_or_a_warning_per_fail_on_init_error() {
    let empty = tempfile::tempdir().expect("tmp");
    let r = empty.path().to_str().expect("utf8");
    let o = generate(&["--driver-root", r, "--output", "-"]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains(r) && err.contains(V) && err.contains("no NVIDIA driver libraries"),
        "{err}"
    );
    assert!(o.stdout.is_empty());

    let cfg = write(
        empty.path(),
        "config.yaml",
        "version: v1\nflags:\n  failOnInitError: false\n",
    );
    let o = generate(&[
        "--driver-root",
        r,
        "--config",
        cfg.to_str().expect("utf8"),
        "--output",
        "-",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("driver not added"),
        "{}",
        text(&o.stderr)
    );
    let spec: serde_json::Value = serde_yaml_ng::from_str(&text(&o.stdout)).expect("yaml");
    assert!(spec["containerEdits"].get("mounts").is_none());
    assert!(spec["containerEdits"].get("hooks").is_none());
}

#[test]
fn sim_backend_without_a_driver_root_stays_devices_only() {
    let o = generate(&["--output", "-"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let spec: serde_json::Value = serde_yaml_ng::from_str(&text(&o.stdout)).expect("yaml");
    assert!(spec["containerEdits"].get("mounts").is_none());
}

#[test]
fn output_takes_file_dir_or_stdout_and_refuses_what_runtimes_ignore() {
    let d = tempfile::tempdir().expect("tmp");
    let dir = d.path().join("cdi");
    let o = generate(&["--output", dir.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(dir.join("gpu-slicer.io-gpu.yaml").is_file());

    let yml = d.path().join("spec.yml");
    let o = generate(&["--output", yml.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("spec.yml") && text(&o.stderr).contains(".yml is ignored"));
    assert!(!yml.exists());

    let json = d.path().join("spec.json");
    let o = generate(&["--output", json.to_str().expect("utf8"), "--format", "yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--format says yaml"),
        "{}",
        text(&o.stderr)
    );
    assert!(!json.exists());
}

#[test]
fn device_name_strategies() {
    let names = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--output", "-"];
        args.extend_from_slice(extra);
        let o = generate(&args);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let spec: serde_json::Value = serde_yaml_ng::from_str(&text(&o.stdout)).expect("yaml");
        spec["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["name"].as_str().expect("s").to_string())
            .collect()
    };
    let default = names(&[]);
    assert!(default.contains(&"0".to_string()) && default.iter().any(|n| n.starts_with("GPU-")));
    let ti = names(&["--device-name-strategy", "type-index"]);
    assert!(
        ti.contains(&"gpu0".to_string()) && ti.contains(&"mig1:3".to_string()),
        "{ti:?}"
    );
    assert!(
        !ti.iter().any(|n| n.starts_with("GPU-") || n == "0"),
        "{ti:?}"
    );
    let both = names(&[
        "--device-name-strategy",
        "uuid",
        "--device-name-strategy",
        "type-index",
    ]);
    assert_eq!(both.len(), ti.len() + 4 + 11);
    let o = generate(&["--output", "-", "--device-name-strategy", "serial"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("serial"));
}

#[test]
fn list_and_validate_read_directories_as_runtimes_do() {
    let d = tempfile::tempdir().expect("tmp");
    let dir = d.path().join("cdi");
    let o = generate(&["--output", dir.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    write(&dir, "notes.yml", "ignored by runtimes");
    let o = bin(&["cdi", "list", dir.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let listed = text(&o.stdout);
    assert!(
        listed.lines().any(|l| l == "gpu-slicer.io/gpu=all"),
        "{listed}"
    );
    assert_eq!(listed.lines().count(), 31);
    let o = bin(&["cdi", "validate", dir.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("ignored") && text(&o.stdout).contains("notes.yml"));
    // A second file offering one of the same devices: a conflict runtimes resolve by
    // dropping the device.
    write(
        &dir,
        "other.yaml",
        "cdiVersion: \"0.5.0\"\nkind: gpu-slicer.io/gpu\ndevices:\n- name: '0'\n  containerEdits:\n    env: [A=1]\n",
    );
    let o = bin(&["cdi", "validate", dir.to_str().expect("utf8")]);
    assert!(!o.status.success());
    assert!(
        text(&o.stdout).contains("conflict: gpu-slicer.io/gpu=0"),
        "{}",
        text(&o.stdout)
    );
    assert!(
        text(&o.stderr).contains("1 CDI device name conflicts"),
        "{}",
        text(&o.stderr)
    );
}

// ---- hooks on real container roots ----

/// A bundle whose config.json points at `rootfs`, and the OCI state naming it.
fn bundle(pid: &str) -> (tempfile::TempDir, PathBuf, String) {
    let b = tempfile::tempdir().expect("tmp");
    let root = b.path().join("rootfs");
    std::fs::create_dir_all(&root).expect("rootfs");
    std::fs::write(
        b.path().join("config.json"),
        r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#,
    )
    .expect("config");
    let state = format!(
        r#"{{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":{pid},"bundle":"{}"}}"#,
        b.path().display()
    );
    (b, root, state)
}

fn hook(args: &[&str], state: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-slicer"))
        .arg("cdi-hook")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hook");
    // A hook that refuses its arguments exits before reading stdin: a broken pipe here is
    // that refusal, which the caller checks through the output.
    if let Err(e) = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(state.as_bytes())
    {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "state: {e}");
    }
    child.wait_with_output().expect("hook")
}

/// A shared library with a soname, made by the host's C compiler.
fn shared_lib(path: &Path, soname: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let src = path.with_extension("c");
    std::fs::write(&src, "int gpu_slicer_fake = 1;\n").expect("src");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(path)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success());
    std::fs::remove_file(src).expect("rm");
}

#[test]
fn hooks_give_a_busybox_like_root_links_and_an_ld_cache() {
    // No /etc, no ldconfig: just the driver file where the runtime's bind mount puts it.
    let (_b, root, state) = bundle("1");
    shared_lib(&root.join(format!("{LIB}/libcuda.so.{V}")), "libcuda.so.1");
    let o = hook(
        &[
            "create-symlinks",
            "--link",
            &format!("libcuda.so.{V}::/{LIB}/libcuda.so.1"),
            "--link",
            &format!("libcuda.so.1::/{LIB}/libcuda.so"),
        ],
        &state,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_link(root.join(LIB).join("libcuda.so.1")).expect("link"),
        PathBuf::from(format!("libcuda.so.{V}"))
    );
    let o = hook(&["update-ldcache", "--folder", &format!("/{LIB}")], &state);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(root.join("etc/ld.so.conf")).expect("created"),
        "include /etc/ld.so.conf.d/*.conf\n"
    );
    let conf = std::fs::read_to_string(root.join("etc/ld.so.conf.d/00-gpu-slicer-driver.conf"))
        .expect("conf");
    assert!(conf.lines().any(|l| l == format!("/{LIB}")), "{conf}");
    // The container's cache resolves libcuda.so.1 to the mounted folder.
    let p = Command::new("/sbin/ldconfig")
        .arg("-p")
        .arg("-C")
        .arg(root.join("etc/ld.so.cache"))
        .output()
        .expect("ldconfig -p");
    let listing = text(&p.stdout);
    assert!(
        listing.contains(&format!(
            "libcuda.so.1 (libc6,x86-64) => /{LIB}/libcuda.so.1"
        )),
        "{listing}"
    );
}

#[test]
fn hooks_write_nothing_outside_a_hostile_root() {
    let (b, root, state) = bundle("1");
    let outside = b.path().join("host-side");
    std::fs::create_dir_all(outside.join("lib")).expect("mkdir");
    std::fs::create_dir_all(outside.join("etc")).expect("mkdir");
    std::fs::create_dir_all(root.join("usr/lib")).expect("mkdir");
    // Absolute links at real host directories, and a `..` climb.
    symlink(outside.join("lib"), root.join(LIB)).expect("ln");
    symlink(outside.join("etc"), root.join("etc")).expect("ln");
    symlink("../../../../../../..", root.join("usr/lib64")).expect("ln");
    shared_lib(
        &root
            .join(outside.join("lib").strip_prefix("/").expect("abs"))
            .join(format!("libcuda.so.{V}")),
        "libcuda.so.1",
    );
    let o = hook(
        &[
            "create-symlinks",
            "--link",
            &format!("libcuda.so.{V}::/{LIB}/libcuda.so.1"),
            "--link",
            &format!("x::/usr/lib64{}/escape", outside.display()),
        ],
        &state,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = hook(&["update-ldcache", "--folder", &format!("/{LIB}")], &state);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let left: Vec<_> = walk(&outside);
    assert_eq!(
        left,
        vec![outside.join("etc"), outside.join("lib")],
        "the host side stays empty"
    );
    // Everything landed under the root instead.
    let inner = root.join(outside.strip_prefix("/").expect("abs"));
    assert!(std::fs::symlink_metadata(inner.join("lib/libcuda.so.1")).is_ok());
    assert!(std::fs::symlink_metadata(inner.join("escape")).is_ok());
    assert!(
        inner
            .join("etc/ld.so.conf.d/00-gpu-slicer-driver.conf")
            .is_file()
    );
    assert!(inner.join("etc/ld.so.cache").is_file());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("ls") {
        let p = e.expect("entry").path();
        out.push(p.clone());
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
    }
    out.sort();
    out
}

#[test]
fn hook_failures_are_non_zero_with_the_reason() {
    let (_b, _root, state) = bundle("1");
    let o = hook(&["create-symlinks", "--link", "relative-link-only"], &state);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("--link `relative-link-only`"),
        "{}",
        text(&o.stderr)
    );
    let o = hook(&["update-ldcache", "--folder", "/x"], "{not json");
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("invalid OCI state"),
        "{}",
        text(&o.stderr)
    );
    let o = hook(
        &[
            "update-ldcache",
            "--folder",
            "/x",
            "--ldconfig-path",
            "/nonexistent/ldconfig",
        ],
        &state,
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("/nonexistent/ldconfig"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn disable_device_node_modification_binds_a_copy_only_inside_the_container_namespace() {
    let t = tempfile::tempdir().expect("tmp");
    let original = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\n";
    let params = write(t.path(), "host-params", original);
    let scratch = t.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    let (b, root, _) = bundle("1");
    let target = write(&root, "proc/driver/nvidia/params", original);
    let exe = env!("CARGO_BIN_EXE_gpu-slicer");
    let args = [
        "disable-device-node-modification",
        "--params",
        params.to_str().expect("utf8"),
        "--scratch-dir",
        scratch.to_str().expect("utf8"),
    ];
    // In this process's own namespace (not a container's): refused, nothing mounted.
    // (Here PID 1's namespace is either ours or unreadable and the target not on procfs.)
    let state = format!(
        r#"{{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":{},"bundle":"{}"}}"#,
        std::process::id(),
        b.path().display()
    );
    let o = hook(&args, &state);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("createContainer hook"),
        "{}",
        text(&o.stderr)
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(target.to_str().expect("utf8")), "{mounts}");

    // As a runtime runs it: the "container" is a shell in its own mount namespace, under
    // a PID 1 in another (private pid namespace, so /proc/1 is readable and not ours). The
    // state says pid 1, as runc's createContainer state does (its own pid namespace).
    let script = t.path().join("container.sh");
    std::fs::write(
        &script,
        format!(
            "printf '{{\"ociVersion\":\"1.0.2\",\"id\":\"c1\",\"status\":\"creating\",\"pid\":1,\"bundle\":\"%s\"}}' '{}' | '{exe}' cdi-hook {} && cat '{}'\n",
            b.path().display(),
            args.join(" "),
            target.display()
        ),
    )
    .expect("script");
    let o = Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "--mount-proc"])
        // PID 1 is this outer shell, left in the first namespace.
        .args([
            "sh",
            "-c",
            "unshare --mount --propagation private sh \"$0\"; exit $?",
        ])
        .arg(&script)
        .output()
        .expect("unshare (util-linux) as root");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\n"
    );
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        original,
        "the bind mount stayed in the container's namespace"
    );
    assert_eq!(
        std::fs::read_dir(&scratch).expect("ls").count(),
        0,
        "copy unlinked"
    );
}

#[test]
fn config_file_driver_roots_are_read_and_checked() {
    let root = driver_root();
    let d = tempfile::tempdir().expect("tmp");
    let cfg = write(
        d.path(),
        "config.yaml",
        &format!(
            "version: v1\nflags:\n  nvidiaDriverRoot: /run/nvidia/driver\n  nvidiaDevRoot: /\n  plugin:\n    containerDriverRoot: {}\n",
            root.path().display()
        ),
    );
    let o = generate(&["--config", cfg.to_str().expect("utf8"), "--output", "-"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let spec: serde_json::Value = serde_yaml_ng::from_str(&text(&o.stdout)).expect("yaml");
    let m = &spec["containerEdits"]["mounts"][0];
    assert!(
        m["hostPath"]
            .as_str()
            .expect("s")
            .starts_with("/run/nvidia/driver/"),
        "{m}"
    );

    let bad = write(
        d.path(),
        "bad.yaml",
        "version: v1\nflags:\n  plugin:\n    containerDriverRoot: host\n",
    );
    let o = generate(&["--config", bad.to_str().expect("utf8"), "--output", "-"]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains("flags.plugin.containerDriverRoot")
            && err.contains("`host`")
            && err.contains("bad.yaml"),
        "{err}"
    );
}

#[test]
fn list_without_arguments_reads_the_runtimes_default_dirs() {
    let d = tempfile::tempdir().expect("tmp");
    let o = generate(&[
        "--output",
        d.path().join("spec.yaml").to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // A private mount namespace with an empty /etc/cdi (when present) and a fresh
    // /var/run (or /run it links to) holding only our spec, so the host's own specs do not matter.
    let script = format!(
        "set -e; if [ -d /etc/cdi ]; then mount -t tmpfs none /etc/cdi; fi; \
         if [ -L /var/run ]; then mount -t tmpfs none /run; else mount -t tmpfs none /var/run; fi; \
         mkdir -p /var/run/cdi; cp '{}' /var/run/cdi/gpu-slicer.yaml; exec '{}' cdi list",
        d.path().join("spec.yaml").display(),
        env!("CARGO_BIN_EXE_gpu-slicer")
    );
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare (util-linux) as root");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let listed = text(&o.stdout);
    assert_eq!(listed.lines().count(), 31, "{listed}");
    assert!(
        listed.lines().all(|l| l.starts_with("gpu-slicer.io/gpu=")),
        "{listed}"
    );
}
