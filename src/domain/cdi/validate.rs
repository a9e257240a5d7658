//! The rules a CDI spec must meet before any runtime sees it.
//!
//! Used by [`super::generate`](fn@super::generate) on every spec it builds and by `gpu-slicer cdi validate` on
//! files. The rules are those that the CDI libraries inside Podman 4.3.1, containerd 1.7
//! and CRI-O enforce when they load a file (strict keys, known version, minimum version for
//! the features used, name syntax, unique names, non-empty edits, `KEY=VALUE` env, hook
//! names, permissions), plus the ones that keep every consumer safe: `cdiVersion` at most
//! 0.5.0, vendor and class of at least two characters (shorter ones crash Podman's CDI
//! registry for the whole host), no dot in the class, `.yaml`/`.json` file names only.

use std::collections::BTreeSet;
use std::path::Path;

use super::{CdiError, ContainerEdits, Result, SUPPORTED_VERSIONS, Spec};

/// Versions a CDI library knows but we refuse, and why.
const REFUSED_VERSIONS: &[(&str, &str)] = &[
    (
        "0.1.0",
        "pre-release schema: CDI libraries from v0.5.4 on reject it",
    ),
    (
        "0.2.0",
        "pre-release schema: CDI libraries from v0.5.4 on reject it",
    ),
    ("0.6.0", "newer than 0.5.0: Podman 4.3 cannot load it"),
    ("0.7.0", "newer than 0.5.0: Podman 4.3 cannot load it"),
    ("0.8.0", "newer than 0.5.0: Podman 4.3 cannot load it"),
    ("1.0.0", "newer than 0.5.0: Podman 4.3 cannot load it"),
    ("1.1.0", "newer than 0.5.0: Podman 4.3 cannot load it"),
];

/// OCI hook points a CDI hook may name.
const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Label used for the spec-level edits in errors.
const SPEC_LEVEL: &str = "(spec-level containerEdits)";

/// The lowest `cdiVersion` whose features `spec` uses (0.3.0 at least).
pub(crate) fn minimum_version(spec: &Spec) -> &'static str {
    minimum_with_reason(spec).0
}

/// The minimum version and the feature that forces it.
fn minimum_with_reason(spec: &Spec) -> (&'static str, String) {
    let all_edits = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    let mut has_mount_type = false;
    let mut host_path = false;
    for e in all_edits {
        host_path |= e.device_nodes.iter().any(|n| n.host_path.is_some());
        has_mount_type |= e
            .mounts
            .iter()
            .any(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty()));
    }
    if let Some(d) = spec
        .devices
        .iter()
        .find(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
    {
        return (
            "0.5.0",
            format!("device name `{}` starts with a digit", d.name),
        );
    }
    if host_path {
        return ("0.5.0", "a device node sets hostPath".into());
    }
    if has_mount_type {
        return ("0.4.0", "a mount sets type".into());
    }
    ("0.3.0", String::new())
}

fn version_rank(v: &str) -> Option<usize> {
    SUPPORTED_VERSIONS.iter().position(|s| *s == v)
}

/// Check `spec` against every rule; the first broken rule is returned.
pub(crate) fn validate(spec: &Spec) -> Result<()> {
    let version = spec.cdi_version.as_str();
    let version_err = |rule: &str| CdiError::Version {
        version: version.to_string(),
        rule: rule.to_string(),
    };
    let Some(rank) = version_rank(version) else {
        if version.starts_with('v') {
            return Err(version_err(
                "write it without the `v` prefix: Podman 4.3 rejects it",
            ));
        }
        if let Some((_, why)) = REFUSED_VERSIONS.iter().find(|(v, _)| *v == version) {
            return Err(version_err(why));
        }
        return Err(version_err(
            "unknown version: expected 0.3.0, 0.4.0 or 0.5.0",
        ));
    };
    let (min, why) = minimum_with_reason(spec);
    if version_rank(min).is_some_and(|m| m > rank) {
        return Err(version_err(&format!(
            "too old for the features used: {why} needs at least {min}"
        )));
    }

    crate::domain::cdi_kind::check_syntax(&spec.kind).map_err(|rule| CdiError::Kind {
        kind: spec.kind.clone(),
        rule,
    })?;

    if spec.devices.is_empty() {
        return Err(CdiError::NoDevices);
    }
    check_edits(SPEC_LEVEL, &spec.container_edits)?;
    let mut seen = BTreeSet::new();
    for d in &spec.devices {
        check_device_name(&d.name)?;
        if !seen.insert(d.name.as_str()) {
            return Err(CdiError::DuplicateDevice {
                device: d.name.clone(),
            });
        }
        if d.container_edits.is_empty() {
            return Err(CdiError::Edits {
                device: d.name.clone(),
                rule: "empty containerEdits: runtimes reject a device with no edits".into(),
            });
        }
        check_edits(&d.name, &d.container_edits)?;
    }
    Ok(())
}

/// Device names (CDI ≥ 0.5.0): alphanumeric first and last, `[A-Za-z0-9_.:-]` inside; a
/// digit first is allowed because [`minimum_version`] then demands 0.5.0.
pub(crate) fn check_device_name(name: &str) -> Result<()> {
    let err = |rule: &str| CdiError::DeviceName {
        device: name.to_string(),
        rule: rule.to_string(),
    };
    let first = name.chars().next().ok_or_else(|| err("empty name"))?;
    if !first.is_ascii_alphanumeric() {
        return Err(err("must start with a letter or digit"));
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(err("must end with a letter or digit"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')))
    {
        return Err(err(&format!(
            "invalid character {c:?}: only [A-Za-z0-9_.:-] allowed"
        )));
    }
    Ok(())
}

fn check_env(device: &str, what: &str, env: &[String]) -> Result<()> {
    for e in env {
        if e.find('=').is_none_or(|i| i == 0) {
            return Err(CdiError::Edits {
                device: device.to_string(),
                rule: format!("{what} entry `{e}` is not KEY=VALUE"),
            });
        }
    }
    Ok(())
}

fn check_edits(device: &str, edits: &ContainerEdits) -> Result<()> {
    let err = |rule: String| CdiError::Edits {
        device: device.to_string(),
        rule,
    };
    check_env(device, "env", &edits.env)?;
    for n in &edits.device_nodes {
        if !n.path.starts_with('/') {
            return Err(err(format!(
                "deviceNodes path `{}` must be an absolute path",
                n.path
            )));
        }
        if let Some(h) = &n.host_path
            && !h.starts_with('/')
        {
            return Err(err(format!(
                "deviceNodes hostPath `{h}` must be an absolute path"
            )));
        }
        if let Some(t) = &n.node_type
            && !matches!(t.as_str(), "" | "b" | "c" | "u" | "p")
        {
            return Err(err(format!(
                "deviceNodes `{}`: type `{t}` is not one of b, c, u, p",
                n.path
            )));
        }
        if let Some(p) = &n.permissions
            && (p.is_empty() || !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')))
        {
            return Err(err(format!(
                "deviceNodes `{}`: permissions `{p}` must be letters from rwm",
                n.path
            )));
        }
    }
    for m in &edits.mounts {
        if m.host_path.is_empty() {
            return Err(err(format!(
                "mount to `{}` has an empty hostPath",
                m.container_path
            )));
        }
        if !m.container_path.starts_with('/') {
            return Err(err(format!(
                "mount containerPath `{}` must be an absolute path",
                m.container_path
            )));
        }
    }
    for h in &edits.hooks {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(err(format!(
                "hook name `{}` is not one of {}",
                h.hook_name,
                HOOK_NAMES.join(", ")
            )));
        }
        if h.path.is_empty() {
            return Err(err(format!("hook `{}` has an empty path", h.hook_name)));
        }
        if h.timeout.is_some_and(|t| t <= 0) {
            return Err(err(format!(
                "hook `{}` timeout must be positive",
                h.hook_name
            )));
        }
        check_env(device, "hook env", &h.env)?;
    }
    Ok(())
}

/// Check that runtimes would scan a file of this name: `.yaml` or `.json` only.
pub(crate) fn check_file_name(path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("yaml" | "json") => Ok(()),
        _ => Err(CdiError::FileName {
            path: path.to_path_buf(),
            rule: "runtimes only load files ending in .yaml or .json (.yml and extension-less files are ignored)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::cdi::{Device, DeviceNode, Hook};

    fn spec_with(name: &str, edits: ContainerEdits) -> Spec {
        Spec {
            cdi_version: "0.5.0".into(),
            kind: "example.com/gpu".into(),
            devices: vec![Device {
                name: name.into(),
                container_edits: edits,
            }],
            container_edits: ContainerEdits::default(),
        }
    }

    fn env(e: &str) -> ContainerEdits {
        ContainerEdits {
            env: vec![e.into()],
            ..ContainerEdits::default()
        }
    }

    #[test]
    fn minimum_version_follows_features() {
        let mut s = spec_with("dev0", env("A=1"));
        s.cdi_version = "0.3.0".into();
        assert_eq!(minimum_version(&s), "0.3.0");
        assert!(validate(&s).is_ok());
        s.devices[0].name = "0".into();
        assert_eq!(minimum_version(&s), "0.5.0");
        let e = validate(&s).expect_err("digit under 0.3.0").to_string();
        assert!(e.contains("starts with a digit"), "{e}");
        s.devices[0].name = "dev0".into();
        let mut n = DeviceNode::at("/dev/x");
        n.host_path = Some("/tmp/x".into());
        s.devices[0].container_edits.device_nodes.push(n);
        assert_eq!(minimum_version(&s), "0.5.0");
    }

    #[test]
    fn each_rule_names_device_and_rule() {
        let cases: Vec<(Spec, &str)> = vec![
            (
                spec_with("dev0", ContainerEdits::default()),
                "empty containerEdits",
            ),
            (spec_with("dev0", env("NOEQUALS")), "KEY=VALUE"),
            (spec_with("dev0", env("=x")), "KEY=VALUE"),
            (spec_with("bad name1", env("A=1")), "invalid character"),
            (spec_with("-dev", env("A=1")), "start with"),
            (spec_with("dev-", env("A=1")), "end with"),
            (
                spec_with(
                    "dev0",
                    ContainerEdits {
                        hooks: vec![Hook {
                            hook_name: "preStart".into(),
                            path: "/bin/true".into(),
                            args: vec![],
                            env: vec![],
                            timeout: None,
                        }],
                        ..ContainerEdits::default()
                    },
                ),
                "hook name",
            ),
            (
                spec_with(
                    "dev0",
                    ContainerEdits {
                        device_nodes: vec![DeviceNode {
                            permissions: Some("none".into()),
                            ..DeviceNode::at("/dev/x")
                        }],
                        ..ContainerEdits::default()
                    },
                ),
                "permissions",
            ),
        ];
        for (spec, want) in cases {
            let e = validate(&spec).expect_err(want).to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        }
        let mut s = spec_with("dev0", env("A=1"));
        s.devices.push(s.devices[0].clone());
        assert!(matches!(
            validate(&s),
            Err(CdiError::DuplicateDevice { .. })
        ));
        for (v, want) in [
            ("0.6.0", "Podman 4.3"),
            ("v0.5.0", "prefix"),
            ("0.5", "unknown"),
            ("", "unknown"),
            ("0.1.0", "pre-release"),
        ] {
            let mut s = spec_with("dev0", env("A=1"));
            s.cdi_version = v.into();
            let e = validate(&s).expect_err(v).to_string();
            assert!(e.contains(want), "{e}");
        }
        for k in [
            "x/gpu",
            "example.com/g",
            "example.com/gpu.v2",
            "gpu",
            "a.com/b/c",
        ] {
            let mut s = spec_with("dev0", env("A=1"));
            s.kind = k.into();
            assert!(matches!(validate(&s), Err(CdiError::Kind { .. })), "{k}");
        }
        let mut s = spec_with("dev0", env("A=1"));
        s.devices.clear();
        assert!(matches!(validate(&s), Err(CdiError::NoDevices)));
    }

    #[test]
    fn strict_parsing_rejects_newer_fields() {
        for text in [
            "cdiVersion: \"0.5.0\"\nkind: a.com/bb\nannotations: {a: b}\ndevices: [{name: d, containerEdits: {env: [A=1]}}]\n",
            "cdiVersion: \"0.5.0\"\nkind: a.com/bb\ndevices: [{name: d, containerEdits: {additionalGids: [5]}}]\n",
            "cdiVersion: \"0.5.0\"\nkind: a.com/bb\ndevices: [{name: d, containerEdits: {intelRdt: {}}}]\n",
        ] {
            assert!(Spec::parse(text, Path::new("t.yaml")).is_err(), "{text}");
        }
    }

    #[test]
    fn only_yaml_and_json_names() {
        assert!(check_file_name(Path::new("/x/a.yaml")).is_ok());
        assert!(check_file_name(Path::new("/x/a.json")).is_ok());
        assert!(check_file_name(Path::new("/x/a.yml")).is_err());
        assert!(check_file_name(Path::new("/x/a")).is_err());
    }
}
