//! Driver discovery and its spec edits on real temp driver roots (files, symlinks, a
//! unix socket, a cache written by the host's ldconfig).

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

const V: &str = "550.54.14";
const LIB: &str = "usr/lib/x86_64-linux-gnu";

fn write(root: &Path, rel: &str, body: &str) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, body).expect("write");
    p
}

/// A driver root laid out like a host driver install, without an ld cache.
fn fake_root() -> (tempfile::TempDir, std::os::unix::net::UnixListener) {
    let t = tempfile::tempdir().expect("tmp");
    let r = t.path();
    write(r, &format!("{LIB}/libcuda.so.{V}"), "cuda");
    write(r, &format!("{LIB}/libnvidia-ml.so.{V}"), "nvml");
    write(r, &format!("{LIB}/libnvidia-ptxjitcompiler.so.{V}"), "jit");
    symlink(format!("libcuda.so.{V}"), r.join(LIB).join("libcuda.so.1")).expect("ln");
    write(r, &format!("{LIB}/libz.so.1"), "not the driver's");
    // Hostile: aimed at the agent's own files by absolute path and by `..`.
    symlink(
        "/etc/hostname",
        r.join(LIB).join(format!("libnvidia-evil.so.{V}")),
    )
    .expect("ln");
    symlink(
        "../../../../../../../../etc/hostname",
        r.join(LIB).join(format!("libnvidia-up.so.{V}")),
    )
    .expect("ln");
    // A name no spec can carry (not UTF-8), directly and behind a UTF-8 link.
    {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"libnvidia-\xff.so.550.54.14");
        std::fs::write(r.join(LIB).join(bad), "x").expect("write");
        symlink(bad, r.join(LIB).join(format!("libnvidia-odd.so.{V}"))).expect("ln");
    }
    write(r, &format!("lib/firmware/nvidia/{V}/gsp_ga10x.bin"), "fw");
    write(r, &format!("lib/firmware/nvidia/{V}/gsp_tu10x.bin"), "fw");
    write(
        r,
        &format!("lib/firmware/nvidia/{V}/README"),
        "not firmware",
    );
    let smi = write(r, "usr/bin/nvidia-smi", "#!/bin/sh\n");
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Not executable: not a binary we mount.
    write(r, "usr/bin/nvidia-debugdump", "x");
    std::fs::create_dir_all(r.join("run/nvidia-persistenced")).expect("mkdir");
    std::fs::create_dir_all(r.join("var")).expect("mkdir");
    symlink("../run", r.join("var/run")).expect("ln");
    let sock = std::os::unix::net::UnixListener::bind(r.join("run/nvidia-persistenced/socket"))
        .expect("bind socket");
    (t, sock)
}

fn opts(host: &str, visible: &Path) -> DiscoverOptions {
    DiscoverOptions {
        root: DriverRoot {
            host: PathBuf::from(host),
            visible: visible.to_path_buf(),
        },
        version: V.into(),
        library_search_paths: Vec::new(),
        kernel_release: Some("6.1.0-test".into()),
    }
}

#[test]
fn finds_every_part_under_a_containerised_driver_root() -> Result<()> {
    let (t, _sock) = fake_root();
    // The runtime sees the root at /run/nvidia/driver; this process at the temp dir.
    let d = discover(&opts("/run/nvidia/driver", t.path()))?;
    let libs: Vec<(&str, &str, Option<&str>)> = d
        .libraries
        .iter()
        .map(|l| {
            (
                l.file.container_path.as_str(),
                l.file.host_path.as_str(),
                l.soname.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        libs,
        vec![
            (
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14",
                "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14",
                Some("libcuda.so.1"),
            ),
            (
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14",
                "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14",
                Some("libnvidia-ml.so.1"),
            ),
            (
                "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.550.54.14",
                "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.550.54.14",
                Some("libnvidia-ptxjitcompiler.so.1"),
            ),
        ],
        "no libz, and neither hostile link reaches /etc/hostname"
    );
    let fw: Vec<&str> = d
        .firmware
        .iter()
        .map(|f| f.container_path.as_str())
        .collect();
    assert_eq!(
        fw,
        vec![
            "/lib/firmware/nvidia/550.54.14/gsp_ga10x.bin",
            "/lib/firmware/nvidia/550.54.14/gsp_tu10x.bin"
        ]
    );
    assert_eq!(
        d.firmware[0].host_path,
        "/run/nvidia/driver/lib/firmware/nvidia/550.54.14/gsp_ga10x.bin"
    );
    assert_eq!(
        d.binaries,
        vec![DriverFile {
            container_path: "/usr/bin/nvidia-smi".into(),
            host_path: "/run/nvidia/driver/usr/bin/nvidia-smi".into(),
        }]
    );
    // Found at /run and again through /var/run -> ../run: one socket.
    assert_eq!(
        d.ipc_sockets,
        vec![DriverFile {
            container_path: "/run/nvidia-persistenced/socket".into(),
            host_path: "/run/nvidia/driver/run/nvidia-persistenced/socket".into(),
        }]
    );
    assert_eq!(
        d.ldconfig, DEFAULT_LDCONFIG,
        "the fake root has no ldconfig"
    );
    Ok(())
}

#[test]
fn edits_are_read_only_mounts_and_the_three_hooks() -> Result<()> {
    let (t, _sock) = fake_root();
    let d = discover(&opts("/run/nvidia/driver", t.path()))?;
    let e = container_edits(&d, Path::new("/opt/gpu-slicer/gpu-slicer"));
    assert_eq!(e.mounts.len(), 3 + 2 + 1 + 1);
    let mut sorted = e.mounts.clone();
    sorted.sort_by(|a, b| a.container_path.cmp(&b.container_path));
    assert_eq!(e.mounts, sorted, "sorted by container path");
    for m in &e.mounts {
        assert!(m.host_path.starts_with("/run/nvidia/driver/"), "{m:?}");
        assert_eq!(&m.options[..4], ["ro", "nosuid", "nodev", "bind"], "{m:?}");
        assert!(m.mount_type.is_none(), "no type: 0.3.0 can express it");
    }
    let sock = e
        .mounts
        .iter()
        .find(|m| m.container_path.ends_with("/socket"))
        .expect("socket mount");
    assert_eq!(sock.options.last().map(String::as_str), Some("noexec"));
    let hooks: Vec<Vec<&str>> = e
        .hooks
        .iter()
        .map(|h| h.args.iter().map(String::as_str).collect())
        .collect();
    let lib = "/usr/lib/x86_64-linux-gnu";
    assert_eq!(
        hooks,
        vec![
            vec![
                "/opt/gpu-slicer/gpu-slicer",
                "cdi-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                "--link",
                "libcuda.so.550.54.14::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "--link",
                "libnvidia-ml.so.1::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so",
                "--link",
                "libnvidia-ml.so.550.54.14::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "--link",
                "libnvidia-ptxjitcompiler.so.550.54.14::/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
            ],
            vec![
                "/opt/gpu-slicer/gpu-slicer",
                "cdi-hook",
                "update-ldcache",
                "--ldconfig-path",
                "/sbin/ldconfig",
                "--folder",
                lib,
            ],
            vec![
                "/opt/gpu-slicer/gpu-slicer",
                "cdi-hook",
                "disable-device-node-modification"
            ],
        ]
    );
    for h in &e.hooks {
        assert_eq!(h.hook_name, "createContainer");
        assert_eq!(h.path, "/opt/gpu-slicer/gpu-slicer");
    }
    // Deterministic.
    assert_eq!(
        container_edits(
            &discover(&opts("/run/nvidia/driver", t.path()))?,
            Path::new("/opt/gpu-slicer/gpu-slicer")
        ),
        e
    );
    Ok(())
}

#[test]
fn host_root_slash_gives_identical_host_and_container_paths() -> Result<()> {
    let (t, _sock) = fake_root();
    let d = discover(&opts("/", t.path()))?;
    for l in &d.libraries {
        assert_eq!(l.file.host_path, l.file.container_path);
    }
    Ok(())
}

/// A tiny shared library with a soname, made by the host's C compiler.
fn shared_lib(dir: &Path, file: &str, soname: &str) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let src = dir.join("x.c");
    std::fs::write(&src, "int gpu_slicer_test_symbol = 1;\n").expect("src");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(file))
        .arg(format!("-Wl,-soname,{soname}"))
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success());
    std::fs::remove_file(src).expect("rm");
}

#[test]
fn the_roots_ld_cache_finds_libraries_outside_the_standard_folders() -> Result<()> {
    let t = tempfile::tempdir().expect("tmp");
    let r = t.path();
    shared_lib(
        &r.join("opt/nvidia/lib"),
        &format!("libcuda.so.{V}"),
        "libcuda.so.1",
    );
    shared_lib(
        &r.join("opt/nvidia/lib"),
        &format!("libnvidia-gpucomp.so.{V}"),
        &format!("libnvidia-gpucomp.so.{V}"),
    );
    write(r, "etc/ld.so.conf", "/opt/nvidia/lib\n");
    let st = Command::new("/sbin/ldconfig")
        .arg("-r")
        .arg(r)
        .status()
        .expect("ldconfig");
    assert!(st.success());
    let d = discover(&opts("/", r))?;
    let got: Vec<(&str, Option<&str>)> = d
        .libraries
        .iter()
        .map(|l| (l.file.container_path.as_str(), l.soname.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("/opt/nvidia/lib/libcuda.so.550.54.14", Some("libcuda.so.1")),
            (
                "/opt/nvidia/lib/libnvidia-gpucomp.so.550.54.14",
                Some("libnvidia-gpucomp.so.550.54.14")
            ),
        ]
    );
    assert!(
        d.searched[0].ends_with("etc/ld.so.cache"),
        "{:?}",
        d.searched
    );
    // The soname equal to the file name needs no link.
    let links = symlinks(&d);
    assert_eq!(
        links,
        vec![
            "libcuda.so.1::/opt/nvidia/lib/libcuda.so",
            "libcuda.so.550.54.14::/opt/nvidia/lib/libcuda.so.1",
        ]
    );
    Ok(())
}

#[test]
fn library_search_path_adds_folders() -> Result<()> {
    let t = tempfile::tempdir().expect("tmp");
    write(t.path(), &format!("srv/drv/libcuda.so.{V}"), "x");
    let mut o = opts("/", t.path());
    let e = discover(&o).expect_err("not in a standard folder");
    assert!(matches!(e, DriverError::NoLibraries { .. }));
    o.library_search_paths = vec![PathBuf::from("/srv/drv")];
    let d = discover(&o)?;
    assert_eq!(
        d.libraries[0].file.container_path,
        "/srv/drv/libcuda.so.550.54.14"
    );
    Ok(())
}

#[test]
fn missing_driver_errors_name_root_and_version() {
    let t = tempfile::tempdir().expect("tmp");
    let e = discover(&opts("/run/nvidia/driver", t.path())).expect_err("empty root");
    let msg = e.to_string();
    assert!(
        msg.contains("/run/nvidia/driver") && msg.contains(V),
        "{msg}"
    );
    let mut o = opts("/", t.path());
    o.version = String::new();
    assert!(
        discover(&o)
            .expect_err("no version")
            .to_string()
            .contains("unknown")
    );
    o.version = "../../etc".into();
    assert!(
        discover(&o)
            .expect_err("bad version")
            .to_string()
            .contains("\"../../etc\"")
    );
    let o = opts("/", &t.path().join("missing"));
    assert!(
        discover(&o)
            .expect_err("no root")
            .to_string()
            .contains("missing")
    );
}

#[test]
fn spec_edits_follow_fail_on_init_error_and_container_driver_root() -> Result<()> {
    let (t, _sock) = fake_root();
    let mut cfg = crate::domain::config::Config {
        driver_root: PathBuf::from("/run/nvidia/driver"),
        container_driver_root: Some(t.path().to_path_buf()),
        ..crate::domain::config::Config::default()
    };
    let hook = Path::new("/usr/local/bin/gpu-slicer");
    let (d, edits) = spec_edits(&cfg, Some(V), &[], hook)?.expect("driver found");
    assert_eq!(d.host_root, PathBuf::from("/run/nvidia/driver"));
    assert!(
        edits
            .mounts
            .iter()
            .all(|m| m.host_path.starts_with("/run/nvidia/driver/"))
    );
    // Another version: nothing found.
    let e = spec_edits(&cfg, Some("999.1"), &[], hook).expect_err("fail on init error");
    assert!(e.to_string().contains("999.1"), "{e}");
    cfg.fail_on_init_error = false;
    assert!(spec_edits(&cfg, Some("999.1"), &[], hook)?.is_none());
    assert!(spec_edits(&cfg, None, &[], hook)?.is_none());
    Ok(())
}

#[test]
fn generated_spec_carries_driver_edits_at_spec_level_and_stays_valid() -> Result<()> {
    use crate::domain::cdi::{GenerateOptions, NoProbe, VISIBLE_DEVICES_VOID, generate};
    use crate::domain::inventory::Backend;
    let (t, _sock) = fake_root();
    let d = discover(&opts("/run/nvidia/driver", t.path()))?;
    let edits = container_edits(&d, Path::new("/usr/local/bin/gpu-slicer"));
    let inv = crate::platform::sim::SimBackend::open("mixed-a100")
        .and_then(|b| b.discover())
        .expect("profile");
    let spec = generate(
        &inv,
        &GenerateOptions {
            driver: Some(edits.clone()),
            ..GenerateOptions::new("gpu-slicer.io/gpu")
        },
        &NoProbe,
    )
    .expect("generate");
    assert_eq!(spec.cdi_version, "0.5.0");
    assert_eq!(spec.container_edits.env, vec![VISIBLE_DEVICES_VOID]);
    assert_eq!(spec.container_edits.mounts, edits.mounts);
    assert_eq!(spec.container_edits.hooks, edits.hooks);
    for dev in &spec.devices {
        assert!(dev.container_edits.mounts.is_empty(), "{}", dev.name);
    }
    Ok(())
}
