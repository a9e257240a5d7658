//! Fleets as code, the decisions: which named config a Node's labels select (NVIDIA's
//! `config-manager` fallbacks), which MIG layout, the state labels that report the outcome,
//! which GPU Feature Discovery labels to put on or take off the Node (only keys this agent
//! wrote), whether a watched Node change needs anything (our own patch echoed back does not),
//! and the jittered reconnect backoff. Pure: the runtime watcher and patcher feed it the
//! Node's labels and the ConfigMap's keys and send what it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The label that names the config (`--config-label` default, NVIDIA's).
pub(crate) const CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";
/// The label that names the MIG layout (mig-manager's).
pub(crate) const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// mig-manager's state label: `pending` | `success` | `failed`.
pub(crate) const MIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Our config state label: `success` | `failed`.
pub(crate) const CONFIG_STATE_LABEL: &str = "gpu-slicer.io/config.state";
/// The name of the config in force.
pub(crate) const CONFIG_APPLIED_LABEL: &str = "gpu-slicer.io/config.applied";

/// Why no config could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FleetError {
    /// The label names a key the config directory does not have.
    #[error("label {label}={value}: no key {value:?} in the config directory (keys: {keys})")]
    MissingKey {
        label: String,
        value: String,
        keys: String,
    },
    /// `--config-default` names a key the config directory does not have.
    #[error("--config-default {value}: no key {value:?} in the config directory (keys: {keys})")]
    MissingDefault { value: String, keys: String },
    /// No label, no `--config-default`, and neither a `default` key nor a single key.
    #[error(
        "label {label} is not set and there is no --config-default, no key \"default\" and more than one key ({keys})"
    )]
    NoDefault { label: String, keys: String },
}

/// How the config was chosen, for logs and Events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The node label named it.
    Label,
    /// `--config-default`.
    Flag,
    /// A key named `default` (NVIDIA's `named` fallback).
    NamedDefault,
    /// The only key (NVIDIA's `single` fallback).
    OnlyKey,
}

/// The chosen key and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Choice {
    pub(crate) key: String,
    pub(crate) reason: Reason,
}

fn join(keys: &BTreeSet<String>) -> String {
    if keys.is_empty() {
        return "none".into();
    }
    keys.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// The config key for a Node whose `label` is `value`, given the directory's `keys`.
pub(crate) fn choose_config(
    label: &str,
    value: Option<&str>,
    default_flag: Option<&str>,
    keys: &BTreeSet<String>,
) -> Result<Choice, FleetError> {
    let pick = |key: &str, reason| Choice {
        key: key.to_owned(),
        reason,
    };
    if let Some(value) = value.filter(|v| !v.is_empty()) {
        return match keys.contains(value) {
            true => Ok(pick(value, Reason::Label)),
            false => Err(FleetError::MissingKey {
                label: label.into(),
                value: value.into(),
                keys: join(keys),
            }),
        };
    }
    if let Some(d) = default_flag.filter(|v| !v.is_empty()) {
        return match keys.contains(d) {
            true => Ok(pick(d, Reason::Flag)),
            false => Err(FleetError::MissingDefault {
                value: d.into(),
                keys: join(keys),
            }),
        };
    }
    if keys.contains("default") {
        return Ok(pick("default", Reason::NamedDefault));
    }
    match keys.iter().next() {
        Some(only) if keys.len() == 1 => Ok(pick(only, Reason::OnlyKey)),
        _ => Err(FleetError::NoDefault {
            label: label.into(),
            keys: join(keys),
        }),
    }
}

/// The MIG layout to apply: the label wins over `flags.migLayouts.layout`.
pub(crate) fn choose_layout<'a>(
    label: Option<&'a str>,
    configured: Option<&'a str>,
) -> Option<&'a str> {
    label.filter(|v| !v.is_empty()).or(configured)
}

/// What happened to a config switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfigOutcome {
    /// `name` is in force.
    Applied { name: String },
    /// The choice failed; `kept` (the last good config) stays in force, if any.
    Refused { kept: Option<String> },
}

/// What happened to the MIG layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MigOutcome {
    /// Busy GPUs still wait for their release.
    Pending,
    Success,
    Failed,
}

impl MigOutcome {
    /// mig-manager's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MigOutcome::Pending => "pending",
            MigOutcome::Success => "success",
            MigOutcome::Failed => "failed",
        }
    }
}

/// The state labels for the outcomes (`None` in the map: leave that label alone).
pub(crate) fn state_labels(
    config: Option<&ConfigOutcome>,
    mig: Option<MigOutcome>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match config {
        Some(ConfigOutcome::Applied { name }) => {
            out.insert(CONFIG_STATE_LABEL.into(), "success".into());
            out.insert(CONFIG_APPLIED_LABEL.into(), name.clone());
        }
        Some(ConfigOutcome::Refused { kept }) => {
            out.insert(CONFIG_STATE_LABEL.into(), "failed".into());
            if let Some(kept) = kept {
                out.insert(CONFIG_APPLIED_LABEL.into(), kept.clone());
            }
        }
        None => {}
    }
    if let Some(mig) = mig {
        out.insert(MIG_STATE_LABEL.into(), mig.as_str().into());
    }
    out
}

/// The merge patch that makes the Node carry `desired` (state and, with `--labels-to-node`,
/// GFD labels): keys whose value differs are set; keys in `written` (what this agent put there
/// before) that are no longer desired are removed (`None`); keys it never wrote are never
/// touched. Empty when the Node already agrees, so our own patch echoed back by the watch
/// leads to no new patch.
pub(crate) fn label_patch(
    on_node: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
    written: &BTreeSet<String>,
) -> BTreeMap<String, Option<String>> {
    let mut patch = BTreeMap::new();
    for (k, v) in desired {
        if on_node.get(k) != Some(v) {
            patch.insert(k.clone(), Some(v.clone()));
        }
    }
    for k in written {
        if !desired.contains_key(k) && on_node.contains_key(k) {
            patch.insert(k.clone(), None);
        }
    }
    patch
}

/// The Node annotation listing (comma-separated, sorted) the GPU Feature Discovery label keys
/// `--labels-to-node` put on the Node. Kept on the Node itself rather than in `--state-dir`:
/// it is set in the same merge patch as the labels, so the record and the labels can never
/// disagree after a crash between two writes, and it survives a lost or wiped state
/// directory (a node reinstalled, the agent moved to a new host path), which would otherwise
/// leave labels nobody removes.
pub(crate) const OWNED_LABELS_ANNOTATION: &str = "gpu-slicer.io/labels-owned";

/// The keys [`OWNED_LABELS_ANNOTATION`] lists (empty when absent).
pub(crate) fn owned_keys(annotation: Option<&str>) -> BTreeSet<String> {
    annotation
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The GFD labels to own, the patch that puts them on the Node and the annotation value that
/// records them. `owned` is what the annotation lists now. A key already on the Node that we
/// do not own (GPU Feature Discovery itself, an operator) is left as it is and not claimed;
/// keys we own and no longer want are removed.
pub(crate) fn owned_label_patch(
    on_node: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
    owned: &BTreeSet<String>,
) -> OwnedPatch {
    let mine: BTreeMap<String, String> = desired
        .iter()
        .filter(|(k, _)| owned.contains(*k) || !on_node.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let foreign = desired
        .keys()
        .filter(|k| !mine.contains_key(*k))
        .cloned()
        .collect();
    let labels = label_patch(on_node, &mine, owned);
    let keys: BTreeSet<&String> = mine.keys().collect();
    let annotation = (keys != owned.iter().collect()).then(|| {
        keys.into_iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(",")
    });
    OwnedPatch {
        labels,
        annotation,
        foreign,
    }
}

/// What [`owned_label_patch`] decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct OwnedPatch {
    /// Labels to set (`Some`) and remove (`None`).
    pub(crate) labels: BTreeMap<String, Option<String>>,
    /// The new value of [`OWNED_LABELS_ANNOTATION`], when it changes.
    pub(crate) annotation: Option<String>,
    /// Desired keys left alone because someone else's label holds them.
    pub(crate) foreign: BTreeSet<String>,
}

impl OwnedPatch {
    /// Whether the Node already agrees.
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotation.is_none()
    }
}

/// The labels a watched Node change is about: a new value of either selecting label means
/// a decision; anything else (our own state labels echoed back, other controllers' labels)
/// means nothing.
pub(crate) fn selection_changed(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    config_label: &str,
) -> bool {
    [config_label, MIG_CONFIG_LABEL]
        .iter()
        .any(|k| before.get(*k) != after.get(*k))
}

/// The delay before reconnect attempt `attempt` (0-based): exponential from `base`, capped
/// at `cap`, times a jitter factor in [0.5, 1.0] from `sample` ∈ [0, 1), so that many agents
/// cut off by one API restart do not come back in step.
pub(crate) fn backoff(attempt: u32, base: Duration, cap: Duration, sample: f64) -> Duration {
    let exp = base.saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX));
    let capped = exp.min(cap);
    capped.mul_f64(0.5 + 0.5 * sample.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> BTreeSet<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
    }
    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn owned_labels_are_set_removed_and_foreign_ones_left() {
        let on_node = map(&[
            ("nvidia.com/gpu.product", "GFD-wrote-this"),
            ("nvidia.com/gpu.count", "2"),
            ("nvidia.com/gpu.memory", "40960"),
            ("team", "ml"),
        ]);
        let owned = keys(&["nvidia.com/gpu.count", "nvidia.com/gpu.memory"]);
        let desired = map(&[
            ("nvidia.com/gpu.product", "A100"),
            ("nvidia.com/gpu.count", "4"),
            ("nvidia.com/gpu.present", "true"),
        ]);
        let p = owned_label_patch(&on_node, &desired, &owned);
        assert_eq!(
            p.labels,
            BTreeMap::from([
                ("nvidia.com/gpu.count".to_owned(), Some("4".to_owned())),
                ("nvidia.com/gpu.memory".to_owned(), None),
                ("nvidia.com/gpu.present".to_owned(), Some("true".to_owned())),
            ])
        );
        assert_eq!(
            p.annotation.as_deref(),
            Some("nvidia.com/gpu.count,nvidia.com/gpu.present")
        );
        assert_eq!(p.foreign, keys(&["nvidia.com/gpu.product"]));
        // Applied: nothing more to do.
        let after = map(&[
            ("nvidia.com/gpu.product", "GFD-wrote-this"),
            ("nvidia.com/gpu.count", "4"),
            ("nvidia.com/gpu.present", "true"),
            ("team", "ml"),
        ]);
        let owned = owned_keys(p.annotation.as_deref());
        assert!(owned_label_patch(&after, &desired, &owned).is_empty());
        assert_eq!(owned_keys(Some(" a, ,b ")), keys(&["a", "b"]));
        assert!(owned_keys(None).is_empty());
    }

    #[test]
    fn label_then_flag_then_named_then_single() {
        let ks = keys(&["default", "inference", "training"]);
        let c = |v, d| choose_config(CONFIG_LABEL, v, d, &ks);
        assert_eq!(
            c(Some("inference"), Some("training")).unwrap().reason,
            Reason::Label
        );
        assert_eq!(
            c(None, Some("training")).unwrap(),
            Choice {
                key: "training".into(),
                reason: Reason::Flag
            }
        );
        assert_eq!(c(Some(""), None).unwrap().reason, Reason::NamedDefault);
        let one = keys(&["only"]);
        assert_eq!(
            choose_config(CONFIG_LABEL, None, None, &one)
                .unwrap()
                .reason,
            Reason::OnlyKey
        );
    }

    #[test]
    fn refusals_name_the_label_value_and_keys() {
        let ks = keys(&["inference", "training"]);
        let e = choose_config(CONFIG_LABEL, Some("infrence"), None, &ks).unwrap_err();
        assert_eq!(
            e.to_string(),
            "label nvidia.com/device-plugin.config=infrence: no key \"infrence\" in the config directory (keys: inference, training)"
        );
        let e = choose_config(CONFIG_LABEL, None, Some("x"), &ks).unwrap_err();
        assert!(e.to_string().starts_with("--config-default x:"), "{e}");
        let e = choose_config(CONFIG_LABEL, None, None, &ks).unwrap_err();
        assert!(matches!(e, FleetError::NoDefault { .. }), "{e}");
        let e = choose_config(CONFIG_LABEL, None, None, &keys(&[])).unwrap_err();
        assert!(e.to_string().contains("(none)"), "{e}");
    }

    #[test]
    fn layout_label_wins() {
        assert_eq!(
            choose_layout(Some("all-1g"), Some("all-7g")),
            Some("all-1g")
        );
        assert_eq!(choose_layout(Some(""), Some("all-7g")), Some("all-7g"));
        assert_eq!(choose_layout(None, None), None);
    }

    #[test]
    fn state_values_are_mig_managers_and_ours() {
        let applied = state_labels(
            Some(&ConfigOutcome::Applied {
                name: "inference".into(),
            }),
            Some(MigOutcome::Pending),
        );
        assert_eq!(
            applied,
            map(&[
                (CONFIG_APPLIED_LABEL, "inference"),
                (CONFIG_STATE_LABEL, "success"),
                (MIG_STATE_LABEL, "pending")
            ])
        );
        let refused = state_labels(
            Some(&ConfigOutcome::Refused {
                kept: Some("training".into()),
            }),
            None,
        );
        assert_eq!(
            refused,
            map(&[
                (CONFIG_APPLIED_LABEL, "training"),
                (CONFIG_STATE_LABEL, "failed")
            ])
        );
    }

    #[test]
    fn patch_sets_differences_and_removes_only_what_we_wrote() {
        let on_node = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.product", "A100"),
            ("team", "ml"),
        ]);
        let desired = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/mig.capable", "true"),
        ]);
        let written = keys(&[
            "nvidia.com/gpu.count",
            "nvidia.com/gpu.product",
            "nvidia.com/gone",
        ]);
        let p = label_patch(&on_node, &desired, &written);
        assert_eq!(
            p,
            BTreeMap::from([
                ("nvidia.com/gpu.product".to_owned(), None),
                ("nvidia.com/mig.capable".to_owned(), Some("true".to_owned())),
            ])
        );
        // The echo of our own patch: nothing more to do.
        let after = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/mig.capable", "true"),
            ("team", "ml"),
        ]);
        assert!(label_patch(&after, &desired, &written).is_empty());
        assert!(!selection_changed(&on_node, &after, CONFIG_LABEL));
        let relabelled = map(&[(CONFIG_LABEL, "inference")]);
        assert!(selection_changed(&on_node, &relabelled, CONFIG_LABEL));
    }

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let (b, cap) = (Duration::from_millis(100), Duration::from_secs(30));
        assert_eq!(backoff(0, b, cap, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(3, b, cap, 1.0), Duration::from_millis(800));
        assert_eq!(backoff(40, b, cap, 1.0), cap);
        assert_eq!(backoff(3, b, cap, 0.0), Duration::from_millis(400));
        assert!(backoff(3, b, cap, 0.3) < backoff(3, b, cap, 0.9));
    }
}
