//! The spec-level CDI edits of a discovered [`Driver`]: one read-only bind mount per file
//! and the `createContainer` hooks (`create-symlinks`, `update-ldcache`,
//! `disable-device-node-modification`) that [`super::hooks`] runs. Pure.

use std::collections::BTreeSet;
use std::path::Path;

use crate::domain::cdi::{ContainerEdits, Hook, Mount};

use super::Driver;

/// Mount options of every driver file: read-only, no setuid, no device files.
pub(crate) const MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "bind"];

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn dir_name(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some(("", _)) => "/",
        Some((d, _)) => d,
        None => "/",
    }
}

/// The `--link TARGET::LINK` pairs `create-symlinks` is given: each library's soname link
/// (when the soname differs from the file name), and the unversioned development links
/// `libcuda.so` and `libnvidia-ml.so` that some tools open.
pub(crate) fn symlinks(driver: &Driver) -> Vec<String> {
    let mut links = BTreeSet::new();
    for lib in &driver.libraries {
        let path = &lib.file.container_path;
        let (dir, name) = (dir_name(path), file_name(path));
        let Some(soname) = &lib.soname else { continue };
        if soname != name && !soname.contains('/') {
            links.insert(format!("{name}::{}", join(dir, soname)));
        }
        for dev in ["libcuda.so", "libnvidia-ml.so"] {
            if soname.strip_suffix(".1") == Some(dev) {
                links.insert(format!("{soname}::{}", join(dir, dev)));
            }
        }
    }
    links.into_iter().collect()
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Seconds the runtime gives each driver hook.
pub(crate) const HOOK_TIMEOUT_SECS: i64 = 30;

fn hook(hook_path: &Path, args: Vec<String>) -> Hook {
    let path = hook_path.display().to_string();
    let mut all = vec![path.clone(), "cdi-hook".to_string()];
    all.extend(args);
    Hook {
        hook_name: "createContainer".into(),
        path,
        args: all,
        env: Vec::new(),
        timeout: Some(HOOK_TIMEOUT_SECS),
    }
}

/// Spec-level CDI edits for `driver`: one read-only bind mount per file, sorted by
/// container path, and the `createContainer` hooks `create-symlinks`, `update-ldcache` and
/// `disable-device-node-modification` of the `gpu-slicer` binary at `hook_path` (a host
/// path). Pure.
pub(crate) fn container_edits(driver: &Driver, hook_path: &Path) -> ContainerEdits {
    let mut mounts: Vec<Mount> = Vec::new();
    let files = driver
        .libraries
        .iter()
        .map(|l| (&l.file, false))
        .chain(driver.firmware.iter().map(|f| (f, false)))
        .chain(driver.binaries.iter().map(|f| (f, false)))
        .chain(driver.ipc_sockets.iter().map(|f| (f, true)));
    for (f, socket) in files {
        let mut options: Vec<String> = MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect();
        if socket {
            options.push("noexec".into());
        }
        mounts.push(Mount {
            host_path: f.host_path.clone(),
            container_path: f.container_path.clone(),
            mount_type: None,
            options,
        });
    }
    mounts.sort_by(|a, b| a.container_path.cmp(&b.container_path));
    mounts.dedup_by(|a, b| a.container_path == b.container_path);

    let mut hooks = Vec::new();
    let links = symlinks(driver);
    if !links.is_empty() {
        let mut args = vec!["create-symlinks".to_string()];
        for l in links {
            args.push("--link".into());
            args.push(l);
        }
        hooks.push(hook(hook_path, args));
    }
    let folders: BTreeSet<&str> = driver
        .libraries
        .iter()
        .map(|l| dir_name(&l.file.container_path))
        .collect();
    let mut args = vec![
        "update-ldcache".to_string(),
        "--ldconfig-path".into(),
        driver.ldconfig.clone(),
    ];
    for f in folders {
        args.push("--folder".into());
        args.push(f.to_string());
    }
    hooks.push(hook(hook_path, args));
    hooks.push(hook(
        hook_path,
        vec!["disable-device-node-modification".to_string()],
    ));
    ContainerEdits {
        mounts,
        hooks,
        ..ContainerEdits::default()
    }
}
