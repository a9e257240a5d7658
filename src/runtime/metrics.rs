//! Metrics: every figure an operator graphs, in one explicitly owned Prometheus registry
//! (no globals).
//!
//! The device plugin records RPC latencies and rule violations, the supervisor records
//! reloads and registrations, the health loop and the ledger publish per-device and per-pod
//! state. The HTTP server (`crate::runtime::http`) only encodes this registry.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::allocate::ResourceView;
use crate::domain::dra::claim_error::ClaimError;
use crate::domain::inventory::Health;
use crate::state::Store;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub(crate) mod usage;

/// Labels naming a resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ResourceLabels {
    /// Extended resource name, e.g. `nvidia.com/gpu`.
    pub(crate) resource: String,
}

/// Labels naming an allocation held by a container (from the PodResources ledger).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct PodLabels {
    /// Pod namespace.
    pub(crate) namespace: String,
    /// Pod name.
    pub(crate) pod: String,
    /// Container name.
    pub(crate) container: String,
    /// Extended resource name.
    pub(crate) resource: String,
    /// Kubelet device ID.
    pub(crate) device: String,
}

/// Labels of a rejected Allocate.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RuleLabels {
    /// Extended resource name.
    pub(crate) resource: String,
    /// The rule that was broken (`unknown-device`, `unhealthy`, `duplicate`, …).
    pub(crate) rule: String,
}

/// Labels of a reload outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    /// `ok` or `failed`.
    pub(crate) outcome: String,
}

/// Labels of `dra_claim_refusals_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ClaimRuleLabels {
    /// The rule the claim broke ([`ClaimError::rule`]).
    pub(crate) rule: String,
}

/// Labels of `config_entries_skipped`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct SkipLabels {
    /// [`crate::domain::plan::SkipReason`] code (`resource-not-on-node`, …).
    pub(crate) reason: String,
}

/// Labels of `mig_layout_pending`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct GpuLabels {
    /// GPU UUID.
    pub(crate) gpu: String,
}

/// Labels of `build_info`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct BuildLabels {
    /// Crate version (`0.1.0`).
    pub(crate) version: String,
    /// CPU architecture the binary was built for (`x86_64`).
    pub(crate) arch: String,
    /// `release` or `debug`.
    pub(crate) profile: String,
}

/// Reason codes of unhealthy devices that are label-safe as they are: lower-case letters,
/// digits and `-`, a letter first, at most 32 characters (`xid-79`, `gpu-lost`,
/// `mps-down`).
fn is_reason_code(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 32
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && text.starts_with(|c: char| c.is_ascii_lowercase())
}

/// The `reason` label for a device's health reason: a short code, never free text (free
/// text would put UUIDs and error strings into label values, one series per message).
/// The health state keys an override set on a physical device as `<uuid>: <code>` for
/// the devices it covers, so the code after the last `: ` is used; anything else is
/// `other` (the full text is in the log line of the transition).
pub(crate) fn reason_code(reason: &str) -> String {
    if reason.is_empty() || is_reason_code(reason) {
        return reason.to_string();
    }
    if let Some((_, tail)) = reason.rsplit_once(": ")
        && is_reason_code(tail)
    {
        return tail.to_string();
    }
    // The inventory's own verdict (crate::domain::allocate's "unhealthy at discovery").
    if reason == "unhealthy at discovery" {
        return "at-discovery".to_string();
    }
    "other".to_string()
}

/// All metrics of one agent.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Devices the kubelet can allocate, per resource.
    pub(crate) allocatable: Family<ResourceLabels, Gauge>,
    /// Devices held by containers, per resource (from the PodResources ledger; absent when
    /// the ledger is disabled).
    pub(crate) allocated: Family<ResourceLabels, Gauge>,
    /// Unhealthy devices, per resource.
    pub(crate) unhealthy: Family<ResourceLabels, Gauge>,
    /// 1 when healthy, 0 when not, per device, with the reason.
    pub(crate) device_healthy: DeviceHealthSeries,
    /// 1 per device a container holds.
    pub(crate) pod_allocation: Family<PodLabels, Gauge>,
    /// Allocate latency in seconds.
    pub(crate) allocate_seconds: Family<ResourceLabels, Histogram>,
    /// GetPreferredAllocation latency in seconds.
    pub(crate) preferred_seconds: Family<ResourceLabels, Histogram>,
    /// Allocate requests refused, by rule.
    pub(crate) allocate_errors: Family<RuleLabels, Counter>,
    /// Config reloads by outcome.
    pub(crate) reloads: Family<OutcomeLabels, Counter>,
    /// Registrations with the kubelet, per resource (the first and every re-registration).
    pub(crate) registrations: Family<ResourceLabels, Counter>,
    /// 1 while the PodResources ledger can reach the kubelet.
    pub(crate) ledger_up: Gauge,
    /// Devices in drift at the last reconciliation (`crate::runtime::ledger::Drift`: held but not
    /// planned or unhealthy, or allocatable on one side only).
    pub(crate) ledger_drift: Gauge,
    /// Config entries (or device references) skipped on this node at the last plan, by
    /// reason; every reason is present, 0 when nothing was skipped.
    pub(crate) config_entries_skipped: Family<SkipLabels, Gauge>,
    /// Always 1; the labels say which build runs.
    pub(crate) build_info: Family<BuildLabels, Gauge>,
    /// Usage: utilisation, memory, shares, idle shares, placeable requests.
    pub(crate) usage: usage::UsageMetrics,
    /// 1 for a GPU whose `flags.migLayouts` layout is not applied yet (busy, MIG mode, a
    /// failed step), 0 once it is; only GPUs the layout has been planned for have a series.
    pub(crate) mig_layout_pending: Family<GpuLabels, Gauge>,
    /// DRA checkpoints (`dra-prepared.json`) found unreadable at start, kept aside and
    /// rebuilt from the per-claim CDI specs on disk.
    pub(crate) dra_checkpoint_recoveries: Counter,
    /// NodePrepareResources calls by outcome (`ok`: every claim prepared; `failed`: any not).
    pub(crate) dra_prepare_seconds: Family<OutcomeLabels, Histogram>,
    /// NodeUnprepareResources calls by outcome.
    pub(crate) dra_unprepare_seconds: Family<OutcomeLabels, Histogram>,
    /// Claims the DRA driver refused to prepare or unprepare, by rule; every rule is
    /// present from the start.
    pub(crate) dra_claim_refusals: Family<ClaimRuleLabels, Counter>,
    /// Claims prepared on this node (checkpointed), after the last call or the start.
    pub(crate) dra_prepared_claims: Gauge,
    /// Devices those claims hold.
    pub(crate) dra_prepared_devices: Gauge,
    /// Serialises encoding so a scrape sees one consistent snapshot per family.
    encode_lock: Mutex<()>,
}

/// The `device_healthy` family, encoded at scrape time from the view last published for
/// each resource: one series per device, its `reason` label following the device. A stored
/// series per device (512 on an 8-GPU node at 64 replicas) cost a hashed insert per device
/// at every publication, at start and on every health event, and the old series had to be
/// tracked to remove them; a view is published by swapping one `Arc`, and a device whose
/// reason changed, or a resource a reload removed, never leaves a stale series behind.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeviceHealthSeries(Arc<Mutex<BTreeMap<String, Arc<ResourceView>>>>);

impl DeviceHealthSeries {
    fn views(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<ResourceView>>> {
        // Only `Arc`s are swapped under the lock: a panic leaves nothing half-done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl EncodeMetric for DeviceHealthSeries {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let views: Vec<Arc<ResourceView>> = self.views().values().cloned().collect();
        for view in &views {
            for (d, h) in view.devices() {
                let healthy = h.health == Health::Healthy;
                let reason = if healthy {
                    String::new()
                } else {
                    reason_code(h.reason.as_deref().unwrap_or(""))
                };
                let labels = [
                    ("resource", view.resource.name.as_str()),
                    ("device", d.id.as_str()),
                    ("reason", reason.as_str()),
                ];
                encoder
                    .encode_family(&labels)?
                    .encode_gauge(&i64::from(healthy))?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Registers metrics so that each family is written (`# HELP`, `# TYPE`) from the first
/// scrape, series or not: the encoder leaves out a family with no series, and an alert on a
/// family's absence, or a dashboard query, must find it before the first share is held.
pub(crate) struct Declare<'a>(&'a mut Registry);

impl Declare<'_> {
    /// Register `metric` under `name` and hand back the handle the agent records through.
    pub(crate) fn add<M>(&mut self, name: &str, help: &str, metric: M) -> M
    where
        M: EncodeMetric + Clone + Send + Sync + std::fmt::Debug + 'static,
    {
        self.0.register(name, help, Declared(metric.clone()));
        metric
    }
}

/// A metric encoded whether or not it has series (see [`Declare`]).
#[derive(Debug)]
struct Declared<M>(M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// Buckets for a DRA call: 100 µs to 13 s (a Prepare waits for claim reads from the API
/// server and for MIG instances to be made).
fn claim_call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 2.0, 18))
}

fn latency_histogram() -> Histogram {
    // 10 µs … ~330 ms: Allocate targets are in the hundreds of microseconds.
    Histogram::new(exponential_buckets(1e-5, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Create and register every metric under the `gpu_slicer` prefix.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_slicer");
        let mut r = Declare(&mut registry);
        let metrics = Self {
            allocatable: r.add(
                "allocatable_devices",
                "Devices advertised to the kubelet as healthy",
                Family::default(),
            ),
            allocated: r.add(
                "allocated_devices",
                "Devices held by containers",
                Family::default(),
            ),
            unhealthy: r.add(
                "unhealthy_devices",
                "Devices advertised as unhealthy",
                Family::default(),
            ),
            device_healthy: r.add(
                "device_healthy",
                "1 if the device is healthy, 0 if not; the reason label says why",
                DeviceHealthSeries::default(),
            ),
            pod_allocation: r.add(
                "pod_device_allocation",
                "1 for each device a container holds, from the kubelet's PodResources API",
                Family::default(),
            ),
            allocate_seconds: r.add(
                "allocate_duration_seconds",
                "Time to answer Allocate",
                Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            ),
            preferred_seconds: r.add(
                "preferred_allocation_duration_seconds",
                "Time to answer GetPreferredAllocation",
                Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            ),
            allocate_errors: r.add(
                "allocate_rejections",
                "Allocate requests refused, by the rule they broke",
                Family::default(),
            ),
            reloads: r.add(
                "config_reloads",
                "Config reloads by outcome",
                Family::default(),
            ),
            registrations: r.add(
                "kubelet_registrations",
                "Registrations with the kubelet",
                Family::default(),
            ),
            ledger_up: r.add(
                "ledger_up",
                "1 while the PodResources ledger reaches the kubelet",
                Gauge::default(),
            ),
            ledger_drift: r.add(
                "ledger_drift_devices",
                "Devices in drift: held but not planned or unhealthy, or allocatable on one side only",
                Gauge::default(),
            ),
            config_entries_skipped: r.add(
                "config_entries_skipped",
                "Config sharing entries or device references this node has nothing for, skipped at the last plan",
                Family::default(),
            ),
            mig_layout_pending: r.add(
                "mig_layout_pending",
                "1 while a GPU waits for its MIG layout (flags.migLayouts): busy, MIG mode differs, or a step failed",
                Family::default(),
            ),
            dra_checkpoint_recoveries: r.add(
                "dra_checkpoint_recoveries",
                "DRA checkpoints found unreadable at start, kept aside and rebuilt from the per-claim CDI specs",
                Counter::default(),
            ),
            dra_prepare_seconds: r.add(
                "dra_prepare_duration_seconds",
                "Time to answer NodePrepareResources, by outcome (failed: any claim refused)",
                Family::new_with_constructor(claim_call_histogram as fn() -> Histogram),
            ),
            dra_unprepare_seconds: r.add(
                "dra_unprepare_duration_seconds",
                "Time to answer NodeUnprepareResources, by outcome (failed: any claim not unprepared)",
                Family::new_with_constructor(claim_call_histogram as fn() -> Histogram),
            ),
            dra_claim_refusals: r.add(
                "dra_claim_refusals",
                "Claims the DRA driver refused to prepare or unprepare, by the rule they broke",
                Family::default(),
            ),
            dra_prepared_claims: r.add(
                "dra_prepared_claims",
                "DRA claims prepared on this node",
                Gauge::default(),
            ),
            dra_prepared_devices: r.add(
                "dra_prepared_devices",
                "Devices the prepared DRA claims hold",
                Gauge::default(),
            ),
            build_info: r.add(
                "build_info",
                "Always 1; labels name the running build",
                Family::default(),
            ),
            usage: {
                let usage = usage::UsageMetrics::default();
                usage.register(&mut r);
                usage
            },
            encode_lock: Mutex::new(()),
            // Last: the declarations above borrow it.
            registry,
        };
        metrics.seed();
        metrics
    }

    /// The series present from the start, so an alert on absence (or on a rate of a counter
    /// that has never moved) can be written; per-resource series appear when the resource is
    /// first published.
    fn seed(&self) {
        self.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                arch: std::env::consts::ARCH.to_string(),
                profile: if cfg!(debug_assertions) {
                    "debug".to_string()
                } else {
                    "release".to_string()
                },
            })
            .set(1);
        for outcome in ["ok", "failed"] {
            let labels = OutcomeLabels {
                outcome: outcome.into(),
            };
            drop(self.reloads.get_or_create(&labels));
            drop(self.dra_prepare_seconds.get_or_create(&labels));
            drop(self.dra_unprepare_seconds.get_or_create(&labels));
        }
        for rule in ClaimError::RULES {
            drop(
                self.dra_claim_refusals
                    .get_or_create(&ClaimRuleLabels { rule: rule.into() }),
            );
        }
        self.record_skipped(&[]);
    }

    /// Count one refused claim under its rule.
    pub(crate) fn record_dra_refusal(&self, error: &ClaimError) {
        self.dra_claim_refusals
            .get_or_create(&ClaimRuleLabels {
                rule: error.rule().into(),
            })
            .inc();
    }

    /// Record a NodePrepareResources (`prepare`) or NodeUnprepareResources call.
    pub(crate) fn record_dra_call(&self, prepare: bool, elapsed: Duration, ok: bool) {
        let family = if prepare {
            &self.dra_prepare_seconds
        } else {
            &self.dra_unprepare_seconds
        };
        let outcome = if ok { "ok" } else { "failed" };
        family
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Set the prepared-claims gauges.
    pub(crate) fn set_dra_prepared(&self, claims: usize, devices: usize) {
        self.dra_prepared_claims
            .set(i64::try_from(claims).unwrap_or(i64::MAX));
        self.dra_prepared_devices
            .set(i64::try_from(devices).unwrap_or(i64::MAX));
    }

    /// Record a config reload's outcome (`config_reloads_total{outcome="ok"|"failed"}`).
    pub(crate) fn record_reload(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.reloads
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Record what the last plan skipped (`crate::domain::plan::Planned::skipped`): one gauge per
    /// reason, every reason set (0 when none).
    pub(crate) fn record_skipped(&self, skipped: &[crate::domain::plan::Skipped]) {
        for reason in crate::domain::plan::SkipReason::ALL {
            let n = skipped.iter().filter(|s| s.reason == reason).count();
            self.config_entries_skipped
                .get_or_create(&SkipLabels {
                    reason: reason.as_str().into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Count a registration (first or re-registration) of `resource` with the kubelet.
    pub(crate) fn record_registration(&self, resource: &str) {
        self.registrations
            .get_or_create(&ResourceLabels {
                resource: resource.into(),
            })
            .inc();
    }

    /// Record an Allocate: its latency, and the broken rule when it was refused.
    pub(crate) fn record_allocate(&self, resource: &str, elapsed: Duration, refused: Option<&str>) {
        self.allocate_seconds
            .get_or_create(&ResourceLabels {
                resource: resource.into(),
            })
            .observe(elapsed.as_secs_f64());
        if let Some(rule) = refused {
            self.allocate_errors
                .get_or_create(&RuleLabels {
                    resource: resource.into(),
                    rule: rule.into(),
                })
                .inc();
        }
    }

    /// Record a GetPreferredAllocation's latency.
    pub(crate) fn record_preferred(&self, resource: &str, elapsed: Duration) {
        self.preferred_seconds
            .get_or_create(&ResourceLabels {
                resource: resource.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Publish a resource's health view: allocatable (healthy) and unhealthy counts, and
    /// one `device_healthy` series per device whose `reason` label follows the device.
    pub(crate) fn publish_view(&self, view: &Arc<ResourceView>) {
        let resource = view.resource.name.clone();
        let healthy = i64::try_from(view.healthy_count()).unwrap_or(i64::MAX);
        let total = i64::try_from(view.health.len()).unwrap_or(i64::MAX);
        let key = ResourceLabels {
            resource: resource.clone(),
        };
        self.allocatable.get_or_create(&key).set(healthy);
        self.unhealthy.get_or_create(&key).set(total - healthy);
        let first = self
            .device_healthy
            .views()
            .insert(resource.clone(), view.clone())
            .is_none();
        if first {
            // First publication: zero-valued series for this resource's event families, so
            // they exist before the first event.
            drop(self.registrations.get_or_create(&key));
            drop(self.allocate_seconds.get_or_create(&key));
            drop(self.preferred_seconds.get_or_create(&key));
            for rule in crate::domain::allocate::AllocateError::RULES {
                drop(self.allocate_errors.get_or_create(&RuleLabels {
                    resource: resource.clone(),
                    rule: rule.into(),
                }));
            }
        }
    }

    /// Remove every per-resource series of `resource` (a reload removed it): allocatable,
    /// unhealthy, per-device health and latency histograms. Counters of past events
    /// (rejections, registrations) stay, as Prometheus counters must not go backwards.
    /// Allocated and per-pod series are the ledger's: it drops them once nothing is held.
    pub(crate) fn forget_resource(&self, resource: &str) {
        let key = ResourceLabels {
            resource: resource.into(),
        };
        self.allocatable.remove(&key);
        self.unhealthy.remove(&key);
        self.allocate_seconds.remove(&key);
        self.preferred_seconds.remove(&key);
        self.device_healthy.views().remove(resource);
    }
}

/// Mirror every resource's view into `metrics` as the store changes (no polling) until
/// `token` is cancelled: a view that changed (by identity) is published again, a resource
/// that left the plan has its series forgotten.
pub(crate) async fn follow_store(store: Store, metrics: Arc<Metrics>, token: CancellationToken) {
    let mut rx = store.subscribe();
    let mut last: BTreeMap<String, Arc<ResourceView>> = BTreeMap::new();
    loop {
        let snapshot = rx.borrow_and_update().clone();
        for (name, view) in snapshot.views.iter() {
            if last.get(name).is_none_or(|old| !Arc::ptr_eq(old, view)) {
                metrics.publish_view(view);
            }
        }
        for gone in last.keys().filter(|n| !snapshot.views.contains_key(*n)) {
            metrics.forget_resource(gone);
        }
        last = snapshot.views.as_ref().clone();
        tokio::select! {
            () = token.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
    }
}

impl Metrics {
    /// Encode in the OpenMetrics text format.
    pub(crate) fn encode_openmetrics(&self) -> String {
        let _guard = self.encode_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Encode in the classic Prometheus text format (0.0.4), which every scraper and
    /// `promtool check metrics` read.
    pub(crate) fn encode_prometheus(&self) -> String {
        openmetrics_to_prometheus(&self.encode_openmetrics())
    }
}

/// Convert OpenMetrics text to the classic Prometheus format: counter families are named
/// with their `_total` suffix (OpenMetrics names the family without it), and the `# EOF`
/// and `# UNIT` lines, which the classic format lacks, are dropped.
pub(crate) fn openmetrics_to_prometheus(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match rewritten {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Store;

    fn health() -> Store {
        crate::testkit::fixtures::store("mixed-a100", "flags: {migStrategy: mixed}\n")
    }

    fn series(m: &Metrics, prefix: &str) -> Vec<String> {
        m.encode_prometheus()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect()
    }

    #[test]
    fn views_publish_counts_and_move_the_reason_label() {
        let m = Metrics::new();
        let h = health();
        let name = "nvidia.com/mig-1g.10gb";
        m.publish_view(&h.view(name).unwrap());
        let total = h.view(name).unwrap().health.len();
        let dev = h.view(name).unwrap().resource.devices[0].id.clone();
        let on = |r: &str| format!("{{resource=\"{name}\"}} {r}");
        assert!(
            series(&m, "gpu_slicer_allocatable_devices").contains(&format!(
                "gpu_slicer_allocatable_devices{}",
                on(&total.to_string())
            ))
        );
        h.set_health(&dev, Health::Unhealthy, "xid-79").unwrap();
        m.publish_view(&h.view(name).unwrap());
        let devs = series(
            &m,
            &format!("gpu_slicer_device_healthy{{resource=\"{name}\""),
        );
        assert_eq!(devs.len(), total, "no stale series: {devs:?}");
        assert!(
            devs.iter()
                .any(|l| l.contains(&dev) && l.contains("reason=\"xid-79\"") && l.ends_with(" 0"))
        );
        assert!(
            series(&m, "gpu_slicer_unhealthy_devices")
                .contains(&format!("gpu_slicer_unhealthy_devices{}", on("1")))
        );
        // Recovery drops the reason: the xid series goes away, the device is back at 1.
        h.set_health(&dev, Health::Healthy, "").unwrap();
        m.publish_view(&h.view(name).unwrap());
        let devs = series(&m, "gpu_slicer_device_healthy{");
        assert!(!devs.iter().any(|l| l.contains("xid-79")), "{devs:?}");
    }

    #[test]
    fn forgetting_a_resource_removes_its_series_only() {
        let m = Metrics::new();
        let h = health();
        for r in h.resource_names() {
            m.publish_view(&h.view(&r).unwrap());
        }
        m.record_allocate(
            "nvidia.com/gpu",
            Duration::from_micros(50),
            Some("unknown-device"),
        );
        assert!(
            m.encode_prometheus()
                .contains("gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"}"),
            "published before"
        );
        m.forget_resource("nvidia.com/gpu");
        let text = m.encode_prometheus();
        for family in [
            "allocatable_devices",
            "unhealthy_devices",
            "device_healthy",
            "allocate_duration_seconds_count",
        ] {
            assert!(
                !text.contains(&format!("gpu_slicer_{family}{{resource=\"nvidia.com/gpu\"")),
                "{family}: {text}"
            );
        }
        assert!(
            text.contains("gpu_slicer_allocatable_devices{resource=\"nvidia.com/mig-1g.10gb\"}")
        );
        // A counter of past events never goes backwards.
        assert!(text.contains("gpu_slicer_allocate_rejections_total{resource=\"nvidia.com/gpu\",rule=\"unknown-device\"} 1"));
    }

    #[test]
    fn encodes_families_with_labels() {
        let m = Metrics::new();
        m.allocatable
            .get_or_create(&ResourceLabels {
                resource: "nvidia.com/gpu".into(),
            })
            .set(8);
        m.allocate_seconds
            .get_or_create(&ResourceLabels {
                resource: "nvidia.com/gpu".into(),
            })
            .observe(0.000_05);
        let text = m.encode_openmetrics();
        assert!(
            text.contains("gpu_slicer_allocatable_devices{resource=\"nvidia.com/gpu\"} 8"),
            "{text}"
        );
        assert!(
            text.contains("gpu_slicer_allocate_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        m.reloads
            .get_or_create(&OutcomeLabels {
                outcome: "ok".into(),
            })
            .inc();
        let classic = m.encode_prometheus();
        assert!(
            classic.contains("# TYPE gpu_slicer_config_reloads_total counter"),
            "{classic}"
        );
        assert!(classic.contains("gpu_slicer_config_reloads_total{outcome=\"ok\"} 1"));
        assert!(!classic.contains("# EOF"));
    }

    #[test]
    fn a_fresh_registry_has_build_info_and_zero_valued_series() {
        let text = Metrics::new().encode_prometheus();
        assert!(
            text.contains(&format!(
                "gpu_slicer_build_info{{version=\"{}\",arch=\"{}\"",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::ARCH
            )),
            "{text}"
        );
        for line in [
            "gpu_slicer_config_reloads_total{outcome=\"ok\"} 0",
            "gpu_slicer_config_reloads_total{outcome=\"failed\"} 0",
            "gpu_slicer_config_entries_skipped{reason=\"resource-not-on-node\"} 0",
            "gpu_slicer_config_entries_skipped{reason=\"no-matching-devices\"} 0",
            "gpu_slicer_config_entries_skipped{reason=\"device-not-on-node\"} 0",
            "gpu_slicer_ledger_up 0",
        ] {
            assert!(text.contains(line), "missing {line}: {text}");
        }
    }

    #[test]
    fn every_family_is_declared_before_it_has_a_series() {
        let fresh = Metrics::new().encode_prometheus();
        for family in [
            "gpu_slicer_share_memory_used_bytes gauge",
            "gpu_slicer_share_memory_granted_bytes gauge",
            "gpu_slicer_mig_layout_pending gauge",
            "gpu_slicer_device_healthy gauge",
            "gpu_slicer_allocate_duration_seconds histogram",
            "gpu_slicer_allocate_rejections_total counter",
        ] {
            assert!(
                fresh.contains(&format!("# TYPE {family}\n")),
                "{family}: {fresh}"
            );
        }
        // The families a busy agent writes are the ones a fresh one declares.
        let busy = Metrics::new();
        busy.record_allocate(
            "nvidia.com/gpu",
            Duration::from_micros(40),
            Some("duplicate"),
        );
        busy.record_preferred("nvidia.com/gpu", Duration::from_micros(40));
        busy.record_registration("nvidia.com/gpu");
        busy.publish_view(&health().view("nvidia.com/gpu").unwrap());
        let types = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with("# TYPE "))
                .map(String::from)
                .collect()
        };
        assert_eq!(types(&fresh), types(&busy.encode_prometheus()));
    }

    #[test]
    fn skipped_entries_are_counted_by_reason_and_reset() {
        let m = Metrics::new();
        let skipped = |reason| crate::domain::plan::Skipped {
            field: "sharing.timeSlicing.resources[0].name".into(),
            value: "nvidia.com/mig-1g.10gb".into(),
            reason,
            node_has: String::new(),
        };
        use crate::domain::plan::SkipReason::*;
        m.record_skipped(&[
            skipped(ResourceNotOnNode),
            skipped(ResourceNotOnNode),
            skipped(DeviceNotOnNode),
        ]);
        let text = m.encode_prometheus();
        assert!(
            text.contains("gpu_slicer_config_entries_skipped{reason=\"resource-not-on-node\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("gpu_slicer_config_entries_skipped{reason=\"device-not-on-node\"} 1"),
            "{text}"
        );
        m.record_skipped(&[]);
        assert!(
            m.encode_prometheus()
                .contains("gpu_slicer_config_entries_skipped{reason=\"resource-not-on-node\"} 0")
        );
    }

    #[test]
    fn reason_labels_are_short_codes() {
        assert_eq!(reason_code("xid-79"), "xid-79");
        assert_eq!(reason_code("mps-down"), "mps-down");
        assert_eq!(reason_code(""), "");
        // An override set on the GPU, seen on one of its replicas.
        assert_eq!(reason_code("GPU-0000-1111: xid-79"), "xid-79");
        assert_eq!(reason_code("unhealthy at discovery"), "at-discovery");
        assert_eq!(
            reason_code("MPS control daemon for GPU-1 is down: exit status: 1"),
            "other"
        );
    }

    #[test]
    fn the_reason_label_of_a_replica_of_a_sick_gpu_is_the_code() {
        let m = Metrics::new();
        let h = health();
        let gpu = h.view("nvidia.com/gpu").unwrap().resource.devices[0]
            .physical
            .gpu_uuid
            .clone();
        h.set_health(&gpu, Health::Unhealthy, "xid-79").unwrap();
        m.publish_view(&h.view("nvidia.com/gpu").unwrap());
        let devs = series(&m, "gpu_slicer_device_healthy{");
        assert!(
            devs.iter().any(|l| l.contains("reason=\"xid-79\"")),
            "{devs:?}"
        );
        assert!(
            devs.iter()
                .all(|l| !l.contains("GPU-") || !l.contains(": ")),
            "{devs:?}"
        );
    }
}

#[cfg(test)]
mod monitoring_tests;
