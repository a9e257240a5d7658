//! The mig-parted config format (`api/spec/v1` of NVIDIA/mig-parted), read strictly.
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-balanced:
//!     - devices: all                  # or [0, 2]: NVML indices
//!       device-filter: "0x20B010DE"   # optional: PCI device id(s) or product name(s)
//!       mig-enabled: true
//!       mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
//! ```
//!
//! The rules are mig-parted's: `version` must be `v1`; `mig-configs` needs at least one
//! layout and each layout at least one entry; `devices` and `mig-enabled` are required;
//! `mig-devices` is required when `mig-enabled` is true and must be empty when it is false;
//! unknown keys are errors. Profile keys must look like a MIG profile (`<G>g.<N>gb`, with an
//! optional `+me`-style suffix, or `<C>c.<G>g.<N>gb`) and counts are non-negative; whether
//! a profile exists on a GPU is checked when the layout is matched to it ([`super::select`](mod@super::select)).
//! YAML anchors and merge keys (`<<: *base`) are resolved first, as mig-parted's YAML reader does.

use std::collections::BTreeMap;

use serde_yaml_ng::Value;

use super::{MigLayoutError, Result};

/// Largest file accepted: layout files are a few kilobytes; anything bigger is not one.
pub(crate) const MAX_FILE_BYTES: usize = 1 << 20;
/// Largest count of one profile: no product holds more than 7 GPU instances.
const MAX_COUNT: u64 = 64;

/// A parsed mig-parted file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigPartedFile {
    /// Where it came from, for messages.
    pub(crate) origin: String,
    /// Layout name → its entries, in file order.
    pub(crate) layouts: BTreeMap<String, Vec<LayoutEntry>>,
}

/// Which GPUs an entry selects by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Devices {
    /// `devices: all`.
    All,
    /// `devices: [0, 1]`.
    Indices(Vec<u32>),
}

/// One entry of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayoutEntry {
    /// `devices`.
    pub(crate) devices: Devices,
    /// `device-filter`: empty means every GPU.
    pub(crate) device_filter: Vec<String>,
    /// `mig-enabled`.
    pub(crate) mig_enabled: bool,
    /// `mig-devices`: profile → count (zero counts kept as written; they mean none).
    pub(crate) mig_devices: BTreeMap<String, u32>,
}

impl MigPartedFile {
    /// Parse `text`; `origin` (a path) names it in errors.
    pub(crate) fn parse(text: &str, origin: &str) -> Result<Self> {
        let err = |field: &str, message: String| MigLayoutError::Parse {
            file: origin.to_string(),
            field: field.to_string(),
            message,
        };
        if text.len() > MAX_FILE_BYTES {
            return Err(err("", format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        let mut root: Value =
            serde_yaml_ng::from_str(text).map_err(|e| err("", format!("not valid YAML: {e}")))?;
        root.apply_merge()
            .map_err(|e| err("", format!("bad merge key: {e}")))?;
        let map = as_map(&root, "").map_err(|(f, m)| err(&f, m))?;
        let mut version = None;
        let mut configs = None;
        for (k, v) in map {
            match key(k, "").map_err(|(f, m)| err(&f, m))? {
                "version" => version = Some(v),
                "mig-configs" => configs = Some(v),
                other => {
                    return Err(err(
                        other,
                        "unknown field (expected `version`, `mig-configs`)".into(),
                    ));
                }
            }
        }
        match version {
            None => return Err(err("version", "missing (expected `v1`)".into())),
            Some(Value::String(s)) if s == "v1" => {}
            Some(v) => {
                return Err(err(
                    "version",
                    format!("{} is not a supported version (expected `v1`)", show(v)),
                ));
            }
        }
        let configs = configs.ok_or_else(|| err("mig-configs", "missing".into()))?;
        let configs = as_map(configs, "mig-configs").map_err(|(f, m)| err(&f, m))?;
        if configs.is_empty() {
            return Err(err("mig-configs", "at least one layout is required".into()));
        }
        let mut layouts = BTreeMap::new();
        for (name, entries) in configs {
            let name = key(name, "mig-configs")
                .map_err(|(f, m)| err(&f, m))?
                .to_string();
            let field = format!("mig-configs.{name}");
            let Value::Sequence(list) = entries else {
                return Err(err(
                    &field,
                    format!("{} is not a list of entries", show(entries)),
                ));
            };
            if list.is_empty() {
                return Err(err(&field, "at least one entry is required".into()));
            }
            let parsed = list
                .iter()
                .enumerate()
                .map(|(i, e)| entry(e, &format!("{field}[{i}]")).map_err(|(f, m)| err(&f, m)))
                .collect::<Result<Vec<_>>>()?;
            layouts.insert(name, parsed);
        }
        Ok(Self {
            origin: origin.to_string(),
            layouts,
        })
    }

    /// The entries of `layout`, or an error listing the layouts there are.
    pub(crate) fn layout(&self, layout: &str) -> Result<&[LayoutEntry]> {
        self.layouts
            .get(layout)
            .map(Vec::as_slice)
            .ok_or_else(|| MigLayoutError::UnknownLayout {
                file: self.origin.clone(),
                layout: layout.to_string(),
                known: self.layouts.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }
}

/// Where in the file (the field's path) and what is wrong there; [`MigPartedFile::parse`]
/// adds the file.
type FieldError = (String, String);

fn entry(v: &Value, field: &str) -> Result<LayoutEntry, FieldError> {
    let at = |k: &str| format!("{field}.{k}");
    let map = as_map(v, field)?;
    let (mut devices, mut filter, mut enabled, mut migs) = (None, Vec::new(), None, None);
    for (k, v) in map {
        let k = key(k, field)?;
        match k {
            "devices" => devices = Some(parse_devices(v, &at(k))?),
            "device-filter" => filter = string_or_list(v, &at(k))?,
            "mig-enabled" => match v {
                Value::Bool(b) => enabled = Some(*b),
                other => return Err((at(k), format!("{} is not true or false", show(other)))),
            },
            "mig-devices" => migs = Some(mig_devices(v, &at(k))?),
            other => {
                return Err((
                    at(other),
                    "unknown field (expected `devices`, `device-filter`, `mig-enabled`, `mig-devices`)".into(),
                ));
            }
        }
    }
    let devices = devices.ok_or_else(|| {
        (
            at("devices"),
            "missing (`all` or a list of GPU indices)".into(),
        )
    })?;
    let mig_enabled = enabled.ok_or_else(|| (at("mig-enabled"), "missing".into()))?;
    let mig_devices = match (mig_enabled, migs) {
        (true, None) => {
            return Err((
                at("mig-devices"),
                "required when `mig-enabled` is true".into(),
            ));
        }
        (false, Some(m)) if m.values().any(|&c| c > 0) => {
            return Err((
                at("mig-devices"),
                "MIG devices listed but `mig-enabled` is false".into(),
            ));
        }
        (_, m) => m.unwrap_or_default(),
    };
    Ok(LayoutEntry {
        devices,
        device_filter: filter,
        mig_enabled,
        mig_devices,
    })
}

fn parse_devices(v: &Value, field: &str) -> Result<Devices, FieldError> {
    match v {
        Value::String(s) if s == "all" => Ok(Devices::All),
        Value::Sequence(items) => items
            .iter()
            .map(|i| match i.as_u64() {
                Some(n) if n <= 1024 => Ok(n as u32),
                _ => Err((field.to_string(), format!("{} is not a GPU index", show(i)))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Devices::Indices),
        other => Err((
            field.to_string(),
            format!("{} is neither `all` nor a list of GPU indices", show(other)),
        )),
    }
}

fn string_or_list(v: &Value, field: &str) -> Result<Vec<String>, FieldError> {
    match v {
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Sequence(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.clone()),
                other => Err((
                    field.to_string(),
                    format!("{} is not a string", show(other)),
                )),
            })
            .collect(),
        other => Err((
            field.to_string(),
            format!("{} is neither a string nor a list of strings", show(other)),
        )),
    }
}

fn mig_devices(v: &Value, field: &str) -> Result<BTreeMap<String, u32>, FieldError> {
    let map = as_map(v, field)?;
    let mut out = BTreeMap::new();
    for (k, count) in map {
        let name = key(k, field)?;
        let at = format!("{field}.{name}");
        if !is_profile_name(name) {
            return Err((
                at,
                "not a MIG profile name like `1g.10gb` or `1g.10gb+me`".into(),
            ));
        }
        let n = match count.as_u64() {
            Some(n) if n <= MAX_COUNT => n as u32,
            _ => {
                return Err((
                    at,
                    format!("{} is not a count between 0 and {MAX_COUNT}", show(count)),
                ));
            }
        };
        out.insert(name.to_string(), n);
    }
    Ok(out)
}

/// `[<C>c.]<G>g.<N>gb[+<attr>[.<attr>]]`, the shape mig-parted accepts.
fn is_profile_name(s: &str) -> bool {
    let (base, attrs) = s.split_once('+').unwrap_or((s, ""));
    let num = |p: &str, suffix: &str| {
        p.strip_suffix(suffix)
            .is_some_and(|n| !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let parts: Vec<&str> = base.split('.').collect();
    let shape = match parts.as_slice() {
        [g, m] => num(g, "g") && num(m, "gb"),
        [c, g, m] => num(c, "c") && num(g, "g") && num(m, "gb"),
        _ => false,
    };
    let attrs_ok = s.find('+').is_none()
        || attrs
            .split('.')
            .all(|a| !a.is_empty() && a.bytes().all(|b| b.is_ascii_lowercase()));
    shape && attrs_ok
}

fn as_map<'a>(v: &'a Value, field: &str) -> Result<&'a serde_yaml_ng::Mapping, FieldError> {
    match v {
        Value::Mapping(m) => Ok(m),
        other => Err((
            field.to_string(),
            format!("{} is not a mapping", show(other)),
        )),
    }
}

/// A key of the mapping at `field`.
fn key<'a>(k: &'a Value, field: &str) -> Result<&'a str, FieldError> {
    match k {
        Value::String(s) => Ok(s),
        other => Err((
            field.to_string(),
            format!("key {} is not a string", show(other)),
        )),
    }
}

/// A value as the user wrote it, bounded so a hostile file cannot flood the message.
fn show(v: &Value) -> String {
    let text = match v {
        Value::String(s) => format!("`{s}`"),
        Value::Null => "null".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Sequence(_) => "a list".into(),
        other => serde_yaml_ng::to_string(other)
            .map(|s| format!("`{}`", s.trim()))
            .unwrap_or_default(),
    };
    if text.len() > 80 {
        let cut = (0..=80)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        format!("{}…", &text[..cut])
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mig-parted's examples/config.yaml, as published.
    pub(crate) const EXAMPLE: &str = include_str!("../../../tests/fixtures/mig-parted/config.yaml");

    #[test]
    fn parses_the_upstream_example() {
        let f = MigPartedFile::parse(EXAMPLE, "config.yaml").unwrap();
        assert_eq!(f.layouts.len(), 7);
        let custom = f.layout("custom-config").unwrap();
        assert_eq!(custom[0].devices, Devices::Indices(vec![0, 1, 2, 3]));
        assert!(!custom[0].mig_enabled);
        assert_eq!(custom[1].mig_devices["1g.5gb"], 7);
        assert_eq!(f.layout("all-enabled").unwrap()[0].mig_devices.len(), 0);
        let e = f.layout("nope").unwrap_err().to_string();
        assert!(e.contains("`nope`") && e.contains("all-balanced"), "{e}");
    }

    fn err(text: &str) -> String {
        MigPartedFile::parse(text, "f.yaml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn mig_parted_rules() {
        let e = err("mig-configs: {a: [{devices: all, mig-enabled: false}]}");
        assert!(e.contains("f.yaml") && e.contains("`version`"), "{e}");
        let e = err("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}");
        assert!(e.contains("`v2`"), "{e}");
        let e = err("version: v1\nmig-configs: {}");
        assert!(e.contains("at least one layout"), "{e}");
        let e = err("version: v1\nmig-configs: {a: []}");
        assert!(
            e.contains("mig-configs.a") && e.contains("at least one entry"),
            "{e}"
        );
        let e = err("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}");
        assert!(
            e.contains("mig-configs.a[0].mig-devices") && e.contains("required"),
            "{e}"
        );
        let e = err(
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}]}",
        );
        assert!(e.contains("`mig-enabled` is false"), "{e}");
        let e = err("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}");
        assert!(
            e.contains("mig-configs.a[0].devices") && e.contains("`some`"),
            "{e}"
        );
        let e = err("version: v1\nmig-configs: {a: [{mig-enabled: false}]}");
        assert!(
            e.contains("mig-configs.a[0].devices") && e.contains("missing"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e =
            err("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, colour: red}]}");
        assert!(
            e.contains("mig-configs.a[0].colour") && e.contains("unknown field"),
            "{e}"
        );
        let e =
            err("version: v1\nextra: 1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}");
        assert!(e.contains("`extra`"), "{e}");
        let e = err(
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {big.gpu: 1}}]}",
        );
        assert!(e.contains("mig-configs.a[0].mig-devices.big.gpu"), "{e}");
        let e = err(
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}]}",
        );
        assert!(e.contains("`-1`"), "{e}");
        let e = err("\tversion: v1");
        assert!(e.contains("not valid YAML"), "{e}");
        let big = format!("version: v1\n#{}", "x".repeat(MAX_FILE_BYTES));
        assert!(err(&big).contains("larger than"));
    }

    #[test]
    fn profile_names_and_filters() {
        for ok in [
            "1g.5gb",
            "1g.10gb+me",
            "1c.2g.10gb",
            "7g.141gb",
            "1g.10gb+me.all",
        ] {
            assert!(is_profile_name(ok), "{ok}");
        }
        for bad in ["1g", "g.5gb", "1g.5gb+", "1g.5GB", "1x.2g.3gb.4"] {
            assert!(!is_profile_name(bad), "{bad}");
        }
        let f = MigPartedFile::parse(
            "version: v1\nmig-configs:\n  a:\n    - {devices: [1], device-filter: [\"0x20B010DE\", A30], mig-enabled: false}\n",
            "f",
        )
        .unwrap();
        assert_eq!(f.layouts["a"][0].device_filter, vec!["0x20B010DE", "A30"]);
    }

    #[test]
    fn anchors_and_merge_keys() {
        let text = "version: v1\nmig-configs:\n  a:\n    - &e {devices: all, mig-enabled: true, mig-devices: {1g.5gb: 7}}\n  b:\n    - <<: *e\n      devices: [0]\n";
        let f = MigPartedFile::parse(text, "f").unwrap();
        assert_eq!(f.layouts["b"][0].devices, Devices::Indices(vec![0]));
        assert_eq!(f.layouts["b"][0].mig_devices["1g.5gb"], 7);
    }
}
