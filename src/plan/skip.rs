//! Config entries that name nothing on this node: skipped with a warning, not refused.
//!
//! One ConfigMap usually serves a whole, mixed cluster: a `sharing` entry for
//! `nvidia.com/mig-1g.10gb` means nothing on a node without MIG, and `devices: [4, 5]` means
//! nothing on a node with four GPUs. NVIDIA's plugin applies such entries where they match
//! and ignores them elsewhere; refusing them would crash-loop the agent on every node they
//! do not fit. Malformed entries (bad syntax, bad values) are still errors in
//! `crate::config`. Pure: [`super::build_with_skips`] returns these, [`super::build`] logs
//! them, and the daemon counts them by [`SkipReason::code`].

use std::fmt;

use crate::config::DeviceSelector;

/// Why an entry was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// The entry's resource (`name`) is not advertised on this node.
    NoSuchResource,
    /// One `devices` reference names no device on this node (the others still apply).
    NoSuchDevice,
    /// The entry's `devices` select none of the resource's devices here.
    NoMatchingDevice,
}

impl SkipReason {
    /// Short, stable code for metric labels and log fields.
    pub fn code(self) -> &'static str {
        match self {
            Self::NoSuchResource => "no-such-resource",
            Self::NoSuchDevice => "no-such-device",
            Self::NoMatchingDevice => "no-matching-device",
        }
    }
}

/// One skipped entry or reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The config it came from.
    pub source: String,
    /// Dotted path of the field (`sharing.timeSlicing.resources[0].name`).
    pub field: String,
    /// The value as written.
    pub value: String,
    /// Why it matches nothing here.
    pub reason: SkipReason,
    /// What the node has instead (resource names), when that helps.
    pub available: Option<String>,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.reason {
            SkipReason::NoSuchResource => "this node has no resource of that name",
            SkipReason::NoSuchDevice => "no such device on this node",
            SkipReason::NoMatchingDevice => "selects no device of this resource on this node",
        };
        write!(
            f,
            "config {}: field `{}` = `{}`: {why}",
            self.source, self.field, self.value
        )?;
        if let Some(a) = &self.available {
            write!(f, " (it has: {a})")?;
        }
        f.write_str("; skipped on this node")
    }
}

/// A `devices` selector as a user writes it.
pub(crate) fn selector_text(selector: &DeviceSelector) -> String {
    match selector {
        DeviceSelector::All => "all".into(),
        DeviceSelector::Count(n) => n.to_string(),
        DeviceSelector::List(refs) => format!(
            "[{}]",
            refs.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
