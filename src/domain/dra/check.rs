//! `dra check-claim`: what can be known about a ResourceClaim or ResourceClaimTemplate
//! before it is applied. Pure: the command (`crate::cli::dra`) reads the file and builds the
//! node's slices; this module takes the parsed documents and the names those slices publish.
//!
//! Checked, per document of kind `ResourceClaim` (`spec`) or `ResourceClaimTemplate`
//! (`spec.spec`); other kinds (a Pod beside its template) are skipped:
//!
//! - every `devices.config[].opaque` entry for this driver, with the parser Prepare uses
//!   ([`super::opaque::parse`]), and its kind against the class of the requests it names
//!   (`GpuConfig` for `gpu.<driver>`, `MigDeviceConfig` for `mig.<driver>`); the requests it
//!   names must exist;
//! - a `deviceClassName` in this driver's domain is one of its classes;
//! - attribute and capacity names in CEL selectors (`device.attributes['<domain>'].<name>`,
//!   `device.capacity['<domain>']['<name>']`) and in `matchAttribute` constraints, for this
//!   driver's domain and `resource.kubernetes.io`, are names the node publishes. Other
//!   drivers' names, and what a selector computes, are the scheduler's to judge.

use std::collections::BTreeSet;

use serde_json::Value;

use super::classes;
use super::opaque::{self, ConfigKind};
use super::slices::DeviceType;

/// The common attribute domain every driver may publish in.
const COMMON_DOMAIN: &str = "resource.kubernetes.io";

/// One thing wrong in a document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("document {doc} ({kind} {name}): field `{field}`: {message}")]
pub(crate) struct Problem {
    /// Index of the document in the file, from 0.
    pub(crate) doc: usize,
    /// Its kind.
    pub(crate) kind: String,
    /// Its `namespace/name` (or name).
    pub(crate) name: String,
    /// The field path, from the document's root.
    pub(crate) field: String,
    /// What is wrong, with the value as written.
    pub(crate) message: String,
}

/// The qualified attribute and capacity names (`<domain>/<name>`) a node publishes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Published {
    /// Attribute names.
    pub(crate) attributes: BTreeSet<String>,
    /// Capacity names.
    pub(crate) capacity: BTreeSet<String>,
}

impl Published {
    /// The names of `devices`, unqualified ones in `driver`'s domain (as the API reads them).
    pub(crate) fn of<'a>(
        devices: impl IntoIterator<Item = &'a super::model::Device>,
        driver: &str,
    ) -> Self {
        let qualify = |k: &String| {
            if k.contains('/') {
                k.clone()
            } else {
                format!("{driver}/{k}")
            }
        };
        let mut p = Published::default();
        for d in devices {
            p.attributes.extend(d.attributes.keys().map(qualify));
            p.capacity.extend(d.capacity.keys().map(qualify));
        }
        p
    }
}

/// What was checked in one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    /// Index of the document.
    pub(crate) doc: usize,
    /// Its kind.
    pub(crate) kind: String,
    /// Its `namespace/name`.
    pub(crate) name: String,
    /// Requests, opaque configs of ours, and CEL selectors looked at.
    pub(crate) requests: usize,
    /// Opaque configs of this driver.
    pub(crate) configs: usize,
    /// Selectors and constraints whose names were checked.
    pub(crate) selectors: usize,
}

/// Checks every claim document of `docs`: the claims checked, or every problem found.
pub(crate) fn check(
    docs: &[Value],
    driver: &str,
    published: &Published,
) -> Result<Vec<Checked>, Vec<Problem>> {
    let mut checked = Vec::new();
    let mut problems = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let (spec, prefix) = match kind {
            "ResourceClaim" => (&doc["spec"], "spec"),
            "ResourceClaimTemplate" => (&doc["spec"]["spec"], "spec.spec"),
            _ => continue,
        };
        let meta = &doc["metadata"];
        let name = match (meta["namespace"].as_str(), meta["name"].as_str()) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            (None, Some(n)) => n.to_string(),
            _ => "(no name)".to_string(),
        };
        let mut c = DocCheck {
            doc: i,
            kind,
            name: &name,
            driver,
            published,
            problems: Vec::new(),
            selectors: 0,
        };
        let (requests, configs) = c.spec(spec, prefix);
        let selectors = c.selectors;
        if c.problems.is_empty() {
            checked.push(Checked {
                doc: i,
                kind: kind.to_string(),
                name,
                requests,
                configs,
                selectors,
            });
        } else {
            problems.append(&mut c.problems);
        }
    }
    if problems.is_empty() {
        Ok(checked)
    } else {
        Err(problems)
    }
}

struct DocCheck<'a> {
    doc: usize,
    kind: &'a str,
    name: &'a str,
    driver: &'a str,
    published: &'a Published,
    problems: Vec<Problem>,
    selectors: usize,
}

impl DocCheck<'_> {
    fn problem(&mut self, field: String, message: String) {
        self.problems.push(Problem {
            doc: self.doc,
            kind: self.kind.to_string(),
            name: self.name.to_string(),
            field,
            message,
        });
    }

    /// The requests and configs of one claim spec; returns how many of each were seen.
    fn spec(&mut self, spec: &Value, prefix: &str) -> (usize, usize) {
        let devices = &spec["devices"];
        // Request name -> the device type its class gives (None: not one of our classes).
        let mut requests: Vec<(String, Option<DeviceType>)> = Vec::new();
        for (r, req) in array(&devices["requests"]).iter().enumerate() {
            let name = req["name"].as_str().unwrap_or_default().to_string();
            let base = format!("{prefix}.devices.requests[{r}]");
            let one = |this: &mut Self, field: String, exactly: &Value| {
                let class = exactly["deviceClassName"].as_str().unwrap_or_default();
                let kind = this.class(&format!("{field}.deviceClassName"), class);
                for (s, sel) in array(&exactly["selectors"]).iter().enumerate() {
                    if let Some(expr) = sel["cel"]["expression"].as_str() {
                        this.cel(&format!("{field}.selectors[{s}].cel.expression"), expr);
                    }
                }
                for cap in exactly["capacity"]["requests"]
                    .as_object()
                    .into_iter()
                    .flat_map(|m| m.keys())
                {
                    let q = qualify(cap, this.driver);
                    if kind.is_some() && !this.published.capacity.contains(&q) {
                        let known = names_in(&this.published.capacity, this.driver);
                        this.problem(
                            format!("{field}.capacity.requests"),
                            format!(
                                "`{cap}`: the node publishes no such capacity (it has {known})"
                            ),
                        );
                    }
                }
                kind
            };
            if req["exactly"].is_object() {
                let kind = one(self, format!("{base}.exactly"), &req["exactly"]);
                requests.push((name, kind));
            } else {
                for (s, sub) in array(&req["firstAvailable"]).iter().enumerate() {
                    let kind = one(self, format!("{base}.firstAvailable[{s}]"), sub);
                    let sub_name = sub["name"].as_str().unwrap_or_default();
                    requests.push((format!("{name}/{sub_name}"), kind));
                }
                requests.push((name, None));
            }
        }
        for (c, con) in array(&devices["constraints"]).iter().enumerate() {
            if let Some(attr) = con["matchAttribute"].as_str() {
                self.selectors += 1;
                self.name_known(
                    &format!("{prefix}.devices.constraints[{c}].matchAttribute"),
                    attr,
                    Names::Attributes,
                );
            }
        }
        let mut configs = 0;
        for (c, cfg) in array(&devices["config"]).iter().enumerate() {
            let field = format!("{prefix}.devices.config[{c}]");
            let named: Vec<String> = array(&cfg["requests"])
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            for (n, r) in named.iter().enumerate() {
                if !requests.iter().any(|(q, _)| q == r) {
                    self.problem(
                        format!("{field}.requests[{n}]"),
                        format!("`{r}` names no request of this claim"),
                    );
                }
            }
            let opaque = &cfg["opaque"];
            if opaque["driver"].as_str() != Some(self.driver) {
                continue;
            }
            configs += 1;
            let parsed = match opaque::parse(&opaque["parameters"], &named) {
                Ok(p) => p,
                Err(e) => {
                    self.problem(format!("{field}.opaque.{}", e.field), e.message);
                    continue;
                }
            };
            // The kind must fit every request it applies to whose class is ours.
            for (r, kind) in &requests {
                let applies = named.is_empty()
                    || named
                        .iter()
                        .any(|n| n == r || r.split('/').next() == Some(n.as_str()));
                let Some(kind) = kind.filter(|_| applies) else {
                    continue;
                };
                let expected = match kind {
                    DeviceType::Gpu => ConfigKind::Gpu,
                    DeviceType::Mig => ConfigKind::Mig,
                };
                if parsed.kind != expected {
                    self.problem(
                        format!("{field}.opaque.parameters.kind"),
                        format!(
                            "`{}` configures {}, but request {r} asks for {} (class {}): expected `{}`",
                            parsed.kind.name(),
                            parsed.kind.devices(),
                            expected.devices(),
                            classes::class_name(self.driver, kind),
                            expected.name()
                        ),
                    );
                }
            }
        }
        (requests.len(), configs)
    }

    /// The device type of `class` when it is one of ours; a problem when it is in our
    /// domain but not a class we install.
    fn class(&mut self, field: &str, class: &str) -> Option<DeviceType> {
        for kind in [DeviceType::Gpu, DeviceType::Mig] {
            if class == classes::class_name(self.driver, kind) {
                return Some(kind);
            }
        }
        if class.ends_with(&format!(".{}", self.driver)) {
            let ours = [DeviceType::Gpu, DeviceType::Mig]
                .map(|k| classes::class_name(self.driver, k))
                .join(", ");
            self.problem(
                field.to_string(),
                format!(
                    "`{class}` is not a class of {} (it has {ours})",
                    self.driver
                ),
            );
        }
        None
    }

    fn cel(&mut self, field: &str, expr: &str) {
        self.selectors += 1;
        for (names, domain, name) in references(expr) {
            let q = format!("{domain}/{name}");
            self.name_known(field, &q, names);
        }
    }

    /// `qualified` (`<domain>/<name>`) is published, when its domain is one we can judge.
    fn name_known(&mut self, field: &str, qualified: &str, names: Names) {
        let q = qualify(qualified, self.driver);
        let domain = q.rsplit_once('/').map_or("", |(d, _)| d);
        if domain != self.driver && domain != COMMON_DOMAIN {
            return;
        }
        let set = match names {
            Names::Attributes => &self.published.attributes,
            Names::Capacity => &self.published.capacity,
        };
        if !set.contains(&q) {
            let what = match names {
                Names::Attributes => "attribute",
                Names::Capacity => "capacity",
            };
            let known = names_in(set, domain);
            self.problem(
                field.to_string(),
                format!("`{qualified}`: the node publishes no such {what} (it has {known})"),
            );
        }
    }
}

/// Which map of a device a name refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Names {
    Attributes,
    Capacity,
}

fn array(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

fn qualify(name: &str, driver: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{driver}/{name}")
    }
}

/// The names of `set` in `domain`, unqualified, for a message.
fn names_in(set: &BTreeSet<String>, domain: &str) -> String {
    let prefix = format!("{domain}/");
    let v: Vec<&str> = set.iter().filter_map(|q| q.strip_prefix(&prefix)).collect();
    if v.is_empty() {
        format!("none in {domain}")
    } else {
        v.join(", ")
    }
}

/// The `(map, domain, name)` references of a CEL expression: `device.attributes['d'].n`,
/// `device.attributes['d']['n']` (either quote), and the same for `device.capacity`.
/// References it cannot read this way (a computed domain, `'n' in device.attributes['d']`)
/// are left out.
fn references(expr: &str) -> Vec<(Names, String, String)> {
    let mut out = Vec::new();
    for (needle, names) in [
        ("device.attributes[", Names::Attributes),
        ("device.capacity[", Names::Capacity),
    ] {
        let mut rest = expr;
        while let Some(at) = rest.find(needle) {
            rest = &rest[at + needle.len()..];
            let Some((domain, after)) = quoted(rest) else {
                continue;
            };
            let Some(after) = after.trim_start().strip_prefix(']') else {
                continue;
            };
            let name = if let Some(a) = after.strip_prefix('.') {
                let n: String = a
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // `.startsWith(` and friends follow a name, never stand for one.
                (!n.is_empty()).then_some(n)
            } else if let Some(a) = after.strip_prefix('[') {
                quoted(a).map(|(n, _)| n)
            } else {
                None
            };
            if let Some(name) = name {
                out.push((names, domain, name));
            }
        }
    }
    out
}

/// A string literal at the start of `s` (after blanks): its text and what follows it.
fn quoted(s: &str) -> Option<(String, &str)> {
    let s = s.trim_start();
    let q = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let body = &s[1..];
    let end = body.find(q)?;
    Some((body[..end].to_string(), &body[end + 1..]))
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
