//! The driver's `cdi-hook` commands, run by the container runtime as `createContainer`
//! hooks (in the container's mount namespace, after its root is mounted, before
//! `pivot_root`), with the OCI state on stdin:
//!
//! - [`create_symlinks`]: `--link TARGET::LINK` (`libcuda.so.550.54.14::/usr/lib/x86_64-linux-gnu/libcuda.so.1`);
//! - [`update_ldcache`]: the host's `ldconfig -r <container root>` with the driver's folders;
//! - [`disable_device_node_modification`]: a copy of `/proc/driver/nvidia/params` with
//!   `ModifyDeviceFiles: 0` bound over the container's, so the user-space driver never
//!   creates device nodes (which would widen the container's slice).
//!
//! Every path written is resolved inside the container root ([`super::inroot`]): an image
//! is untrusted input, and a symlink such as `/usr/lib/x86_64-linux-gnu -> /host-root`
//! must not make a hook write on the host. Any failure is an error: the runtime then
//! refuses to start the container (fail closed). Called by `crate::cli::cdi_hook`.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{DriverError, Result, inroot};

/// Largest `config.json` read from a bundle.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Name of the conf file `update-ldcache` writes into the container's `/etc/ld.so.conf.d`.
pub(crate) const LDCONF_NAME: &str = "00-gpu-slicer-driver.conf";

/// The host's driver parameters file.
pub(crate) const PARAMS_PATH: &str = "/proc/driver/nvidia/params";

#[derive(Debug, Deserialize)]
struct State {
    bundle: String,
}

#[derive(Debug, Deserialize)]
struct BundleConfig {
    root: Option<BundleRoot>,
}

#[derive(Debug, Deserialize)]
struct BundleRoot {
    path: String,
}

/// The container's root filesystem on the host, from the OCI state JSON: the bundle's
/// `config.json` `root.path`, relative to the bundle unless absolute.
pub(crate) fn container_root(state_json: &str) -> Result<PathBuf> {
    let bad = |m: String| DriverError::OciState(m);
    let state: State = serde_json::from_str(state_json).map_err(|e| bad(format!("stdin: {e}")))?;
    let bundle = PathBuf::from(&state.bundle);
    if !bundle.is_absolute() {
        return Err(bad(format!(
            "bundle `{}` is not an absolute path",
            state.bundle
        )));
    }
    let config = bundle.join("config.json");
    let meta = std::fs::metadata(&config).map_err(|e| bad(format!("{}: {e}", config.display())))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(bad(format!(
            "{}: larger than {MAX_CONFIG_BYTES} bytes",
            config.display()
        )));
    }
    let text =
        std::fs::read_to_string(&config).map_err(|e| bad(format!("{}: {e}", config.display())))?;
    let cfg: BundleConfig =
        serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", config.display())))?;
    let path = cfg
        .root
        .map(|r| r.path)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad(format!("{}: no root.path", config.display())))?;
    let root = if Path::new(&path).is_absolute() {
        PathBuf::from(&path)
    } else {
        bundle.join(&path)
    };
    match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() => Ok(root),
        _ => Err(bad(format!(
            "{}: root.path `{path}` is not a directory",
            config.display()
        ))),
    }
}

/// One `--link TARGET::LINK`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    /// What the link points at (written verbatim; resolved later inside the container).
    pub(crate) target: String,
    /// Absolute path of the link in the container.
    pub(crate) link: PathBuf,
}

/// Parse `TARGET::LINK`.
pub(crate) fn parse_link(arg: &str) -> Result<Link> {
    let bad = |m: &str| DriverError::HookArg {
        flag: "--link",
        value: arg.to_string(),
        message: m.to_string(),
    };
    let (target, link) = arg
        .split_once("::")
        .ok_or_else(|| bad("expected TARGET::LINK"))?;
    if target.is_empty() || target.contains('\0') {
        return Err(bad("empty target"));
    }
    let link_path = PathBuf::from(link);
    if !link_path.is_absolute() || link_path.file_name().is_none() || link.ends_with("/..") {
        return Err(bad("LINK must be an absolute path naming a file"));
    }
    Ok(Link {
        target: target.to_string(),
        link: link_path,
    })
}

/// Create each link inside `root`. An existing link to the same target is kept, a link
/// elsewhere is replaced (atomically), and any other file already at the link's path is
/// left alone with a warning: the image's own files are not ours to delete.
pub(crate) fn create_symlinks(root: &Path, links: &[Link]) -> Result<()> {
    for l in links {
        let parent = l.link.parent().unwrap_or(Path::new("/"));
        let name = l.link.file_name().map(OsString::from).unwrap_or_default();
        let dir = inroot::create_dir_all(root, parent)?;
        let at = dir.join(&name);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let current = std::fs::read_link(&at).map_err(|source| DriverError::Io {
                    action: "read symlink",
                    path: at.clone(),
                    source,
                })?;
                if current == Path::new(&l.target) {
                    continue;
                }
                replace_link(&dir, &name, &l.target)?;
            }
            Ok(_) => {
                tracing::warn!(link = %l.link.display(), "not a symlink in the image; left as it is");
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::os::unix::fs::symlink(&l.target, &at).map_err(|source| DriverError::Io {
                    action: "create symlink",
                    path: at.clone(),
                    source,
                })?;
            }
            Err(source) => {
                return Err(DriverError::Io {
                    action: "inspect",
                    path: at,
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Put a symlink `dir/name -> target` in place with a rename (which replaces the old link
/// itself, never what it points to).
fn replace_link(dir: &Path, name: &std::ffi::OsStr, target: &str) -> Result<()> {
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".gpu-slicer.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(|source| DriverError::Io {
        action: "create symlink",
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        DriverError::Io {
            action: "rename symlink into",
            path: dir.join(name),
            source,
        }
    })
}

/// Write `text` to the in-root file `path` through a temp file and a rename, so a symlink
/// planted at `path` is replaced rather than followed.
fn write_in_root(root: &Path, path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let parent = path.parent().unwrap_or(Path::new("/"));
    let dir = inroot::create_dir_all(root, parent)?;
    let name = path.file_name().map(OsString::from).unwrap_or_default();
    let mut tmp_name = OsString::from(".");
    tmp_name.push(&name);
    tmp_name.push(format!(".gpu-slicer.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| DriverError::Io {
            action,
            path,
            source,
        }
    };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io("write", &tmp))
        .and_then(|()| {
            std::fs::rename(&tmp, dir.join(&name)).map_err(io("rename into", &dir.join(&name)))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Update the container's ld cache: write `/etc/ld.so.conf.d/<LDCONF_NAME>` listing
/// `folders` (so a later `ldconfig` in the container keeps them), create `/etc/ld.so.conf`
/// with an include line when the image has none (busybox), then run the host's
/// `ldconfig -r <root>` with the folders also on its command line (so the cache has them
/// even when the image's `ld.so.conf` has no include). `ldconfig -r` chroots into the root
/// itself, so its own reads and writes stay inside it.
pub(crate) fn update_ldcache(root: &Path, ldconfig: &Path, folders: &[PathBuf]) -> Result<()> {
    if !ldconfig.is_absolute() {
        return Err(DriverError::HookArg {
            flag: "--ldconfig-path",
            value: ldconfig.display().to_string(),
            message: "must be an absolute host path".into(),
        });
    }
    for f in folders {
        let s = f.to_str().unwrap_or_default();
        if !f.is_absolute() || s.is_empty() || s.contains(['\n', '\0']) {
            return Err(DriverError::HookArg {
                flag: "--folder",
                value: f.display().to_string(),
                message: "must be an absolute path inside the container".into(),
            });
        }
    }
    let mut conf = String::from(
        "# Written by gpu-slicer's update-ldcache hook: the NVIDIA driver's library folders.\n",
    );
    for f in folders {
        conf.push_str(&format!("{}\n", f.display()));
    }
    write_in_root(
        root,
        &Path::new("/etc/ld.so.conf.d").join(LDCONF_NAME),
        &conf,
    )?;
    let main_conf = inroot::resolve(root, Path::new("/etc/ld.so.conf"))?;
    if std::fs::symlink_metadata(&main_conf).is_err() {
        write_in_root(
            root,
            Path::new("/etc/ld.so.conf"),
            "include /etc/ld.so.conf.d/*.conf\n",
        )?;
    }
    let out = std::process::Command::new(ldconfig)
        .arg("-r")
        .arg(root)
        .args(folders)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| DriverError::Io {
            action: "run",
            path: ldconfig.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        return Err(DriverError::Ldconfig {
            ldconfig: ldconfig.to_path_buf(),
            root: root.to_path_buf(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// `params` with every `ModifyDeviceFiles` value set to 0; `None` when nothing changes.
pub(crate) fn params_without_device_file_modification(params: &str) -> Option<String> {
    let mut changed = false;
    let mut out = String::with_capacity(params.len());
    for line in params.lines() {
        match line.split_once(':') {
            Some((key, value)) if key.trim() == "ModifyDeviceFiles" && value.trim() != "0" => {
                out.push_str("ModifyDeviceFiles: 0");
                changed = true;
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    changed.then_some(out)
}

/// Hide device-node creation from the user-space driver: bind a read-only copy of the
/// host's `params_source` (normally [`PARAMS_PATH`]) with `ModifyDeviceFiles: 0` over the
/// container's `/proc/driver/nvidia/params`. Nothing to do when the host has no params
/// file (no driver loaded), when it already says 0, or when the container's procfs lacks
/// the file. The copy is written to a fresh file in `scratch` (a host directory, normally
/// `/run`), bound, and unlinked at once: the mount keeps it alive, nothing stays on disk.
/// (A memfd cannot be the source: the kernel refuses bind mounts from its internal
/// mount.) Refuses to run in the host's mount namespace, where the mount would land on
/// the host.
pub(crate) fn disable_device_node_modification(
    root: &Path,
    params_source: &Path,
    scratch: &Path,
) -> Result<()> {
    let params = match std::fs::read_to_string(params_source) {
        Ok(p) => p,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(DriverError::Io {
                action: "read",
                path: params_source.to_path_buf(),
                source,
            });
        }
    };
    let Some(modified) = params_without_device_file_modification(&params) else {
        return Ok(());
    };
    let target = inroot::resolve(root, Path::new(PARAMS_PATH))?;
    if !target.is_file() {
        return Ok(());
    }
    check_mount_namespace(root, &target)?;
    bind_copy(&target, &modified, scratch)
}

/// Fail unless this process is in a mount namespace that is not the host's, as a
/// `createContainer` hook is (the container's, before `pivot_root`): PID 1's namespace
/// differs from ours, or, where PID 1's cannot be read (a runtime in a user namespace),
/// `target` sits on a procfs, which inside the container root is only the container's
/// own `/proc` (the host's namespace sees the image's empty directory there). The OCI
/// state's `pid` cannot be used: runc reports the container's pid in its own pid
/// namespace (1) while the hook still sees the host's `/proc`.
fn check_mount_namespace(root: &Path, target: &Path) -> Result<()> {
    let refuse = |why: String| DriverError::Mount {
        what: "disable-device-node-modification".into(),
        message: format!(
            "{why}: run it as a createContainer hook (a bind mount elsewhere would land on the host)"
        ),
    };
    if std::fs::canonicalize(root).is_ok_and(|r| r == Path::new("/")) {
        return Err(refuse("the container root is the host's /".into()));
    }
    let ns = |p: &str| std::fs::read_link(p).ok();
    let mine =
        ns("/proc/self/ns/mnt").ok_or_else(|| refuse("cannot read /proc/self/ns/mnt".into()))?;
    match ns("/proc/1/ns/mnt") {
        Some(init) if init == mine => Err(refuse("in the host's mount namespace".into())),
        Some(_) => Ok(()),
        None => {
            let on_proc = nix::sys::statfs::statfs(target)
                .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC);
            if on_proc {
                Ok(())
            } else {
                Err(refuse(format!(
                    "cannot tell this mount namespace from the host's (/proc/1/ns/mnt unreadable) and {} is not on a procfs",
                    target.display()
                )))
            }
        }
    }
}

fn bind_copy(target: &Path, contents: &str, scratch: &Path) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |what: &str, e: &dyn std::fmt::Display| DriverError::Mount {
        what: format!("{what} {}", target.display()),
        message: e.to_string(),
    };
    let source = scratch.join(format!(".gpu-slicer-nvidia-params.{}", std::process::id()));
    let _ = std::fs::remove_file(&source);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&source)
        .and_then(|mut f| f.write_all(contents.as_bytes()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&source);
        return Err(err(&format!("write {} for", source.display()), &e));
    }
    let bound = mount(
        Some(&source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    );
    // The mount holds the inode; the name goes now whether or not it worked.
    let _ = std::fs::remove_file(&source);
    bound.map_err(|e| err("bind mount over", &e))?;
    let ro = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    mount(None::<&str>, target, None::<&str>, ro, None::<&str>)
        .map_err(|e| err("remount read-only", &e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn bundle_with_root(root_path: &str) -> (tempfile::TempDir, String) {
        let b = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(b.path().join("rootfs")).expect("rootfs");
        let cfg = serde_json::json!({"ociVersion": "1.0.2", "root": {"path": root_path}});
        std::fs::write(b.path().join("config.json"), cfg.to_string()).expect("config");
        let state = serde_json::json!({
            "ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
            "bundle": b.path().display().to_string(),
        });
        (b, state.to_string())
    }

    #[test]
    fn container_root_is_relative_to_the_bundle() -> Result<()> {
        let (b, state) = bundle_with_root("rootfs");
        assert_eq!(container_root(&state)?, b.path().join("rootfs"));
        let abs = b.path().join("rootfs").display().to_string();
        let (_b2, state) = bundle_with_root(&abs);
        assert_eq!(container_root(&state)?, PathBuf::from(&abs));
        let (_b3, state) = bundle_with_root("missing");
        let e = container_root(&state).expect_err("missing root");
        assert!(
            e.to_string().contains("`missing` is not a directory"),
            "{e}"
        );
        assert!(container_root("{").is_err());
        assert!(container_root(r#"{"bundle":"rel"}"#).is_err());
        Ok(())
    }

    #[test]
    fn links_are_parsed_strictly() {
        let l = parse_link("libcuda.so.1::/usr/lib/libcuda.so").expect("ok");
        assert_eq!(l.target, "libcuda.so.1");
        assert_eq!(l.link, PathBuf::from("/usr/lib/libcuda.so"));
        for bad in ["libcuda.so.1", "::/x", "a::rel/x", "a::/", "a::/x/.."] {
            let e = parse_link(bad).expect_err(bad);
            assert!(e.to_string().contains("--link"), "{e}");
        }
    }

    #[test]
    fn symlinks_land_inside_a_hostile_root() -> Result<()> {
        let host = tempfile::tempdir().expect("tmp");
        let outside = host.path().join("host-lib");
        std::fs::create_dir_all(&outside).expect("mkdir");
        let root = host.path().join("rootfs");
        std::fs::create_dir_all(root.join("usr/lib")).expect("mkdir");
        // Aimed at the host directory by absolute path and by `..`.
        symlink(&outside, root.join("usr/lib/x86_64-linux-gnu")).expect("ln");
        symlink("../../../host-lib", root.join("usr/lib64")).expect("ln");
        std::fs::write(root.join("usr/lib/keep.so"), "image file").expect("write");
        symlink("old-target", root.join("usr/lib/stale.so")).expect("ln");
        let links: Vec<Link> = [
            "libcuda.so.550.1::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "libcuda.so.1::/usr/lib64/libcuda.so",
            "x::/usr/lib/keep.so",
            "new-target::/usr/lib/stale.so",
        ]
        .iter()
        .map(|s| parse_link(s))
        .collect::<Result<_>>()?;
        create_symlinks(&root, &links)?;
        create_symlinks(&root, &links)?; // idempotent
        assert_eq!(
            std::fs::read_dir(&outside).expect("ls").count(),
            0,
            "nothing on the host"
        );
        let inner = root.join(outside.strip_prefix("/").expect("abs"));
        assert_eq!(
            std::fs::read_link(inner.join("libcuda.so.1")).expect("link"),
            PathBuf::from("libcuda.so.550.1")
        );
        // `../../../host-lib` from /usr/lib64 clamps at the root: /host-lib in the container.
        assert_eq!(
            std::fs::read_link(root.join("host-lib/libcuda.so")).expect("link"),
            PathBuf::from("libcuda.so.1")
        );
        assert_eq!(
            std::fs::read_to_string(root.join("usr/lib/keep.so")).expect("kept"),
            "image file"
        );
        assert_eq!(
            std::fs::read_link(root.join("usr/lib/stale.so")).expect("link"),
            PathBuf::from("new-target")
        );
        Ok(())
    }

    #[test]
    fn params_rewrite() {
        let p = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n";
        assert_eq!(
            params_without_device_file_modification(p).as_deref(),
            Some("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n")
        );
        assert_eq!(
            params_without_device_file_modification("ModifyDeviceFiles: 0\n"),
            None
        );
        assert_eq!(params_without_device_file_modification("Other: 1\n"), None);
    }

    #[test]
    fn ldcache_conf_files_are_not_written_through_planted_links() -> Result<()> {
        let host = tempfile::tempdir().expect("tmp");
        let victim = host.path().join("victim");
        std::fs::write(&victim, "host file").expect("write");
        let root = host.path().join("rootfs");
        std::fs::create_dir_all(root.join("etc/ld.so.conf.d")).expect("mkdir");
        symlink(&victim, root.join("etc/ld.so.conf.d").join(LDCONF_NAME)).expect("ln");
        symlink(&victim, root.join("etc/ld.so.conf")).expect("ln");
        write_in_root(
            &root,
            &Path::new("/etc/ld.so.conf.d").join(LDCONF_NAME),
            "/x\n",
        )?;
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "host file");
        let written = root.join("etc/ld.so.conf.d").join(LDCONF_NAME);
        assert!(
            !std::fs::symlink_metadata(&written)
                .expect("stat")
                .file_type()
                .is_symlink()
        );
        Ok(())
    }
}
