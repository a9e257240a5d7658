//! The DRA driver's core, shared by the v1 and v1beta1 services: NodePrepareResources and
//! NodeUnprepareResources per claim, over one snapshot of the state store.
//!
//! Calls are serialised by one async mutex around the prepared set, so two prepares of the
//! same claim (or of two claims for one device) cannot race: the second sees the first's
//! result. For each claim: already prepared → the same answer again (the kubelet repeats
//! calls); else GET it through the [`ClaimSource`], resolve it against the node's devices
//! ([`crate::domain::dra::claim::resolve`]: shares of a shared device are checked against what
//! is prepared on it), make the MIG instances of dynamic devices ([`super::instances`]), cut
//! its CDI spec from the node's spec (with the memory-limit hook and MPS limits of its
//! shares), write the spec, then the checkpoint, and only then answer; a failure after an
//! instance was made destroys it again. Unprepare destroys the claim's made instances before
//! it forgets the claim. Every claim gets an entry; a claim's failure is its own `error`,
//! never the call's. A newly prepared claim's `status.devices` (and their removal at
//! Unprepare) is queued for [`super::status`] to write afterwards.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Mutex;

use super::status::{StatusJob, StatusQueue};
use crate::domain::cdi::shares::HookSettings;
use crate::domain::dra::claim::{ClaimRef, NodeContext, resolve};
use crate::domain::dra::status::{DeviceStatus, device_status};
use crate::domain::dra::{cdi as dra_cdi, slices};
use crate::platform::claims::ClaimSource;
use crate::platform::dra_mig::InstanceOps;
use crate::platform::dra_state::{DraFiles, Prepared, PreparedClaim, PreparedDevice};
use crate::state::Store;

/// What binds shares and makes dynamic MIG devices, beside the claims and files.
#[derive(Debug, Clone, Default)]
pub(crate) struct DriverExtras {
    /// The memory-limit hook share devices run (`None`: claims that need it fail).
    pub(crate) hook: Option<HookSettings>,
    /// MIG instance operations for dynamic MIG (`None`: no NVML, such claims fail).
    pub(crate) instances: Option<Arc<dyn InstanceOps>>,
    /// Test-only fault point (`GPU_SLICER_FAULT=dra-after-mig-create`): SIGKILL this
    /// process right after a claim's MIG instances are made, before its spec and checkpoint.
    pub(crate) kill_after_mig_create: bool,
}

/// The outcome of one claim.
pub(crate) type ClaimOutcome = Result<Vec<PreparedDevice>, String>;

/// The driver core.
#[derive(Debug, Clone)]
pub(crate) struct Driver {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    driver: String,
    node: String,
    store: Store,
    claims: Arc<dyn ClaimSource>,
    files: DraFiles,
    prepared: Mutex<Prepared>,
    extras: DriverExtras,
    /// Where claim status writes are queued (none: status is not written).
    status: std::sync::OnceLock<StatusQueue>,
}

impl Driver {
    /// [`Driver::new`] with the hook and MIG instance operations shares and dynamic MIG
    /// devices need.
    pub(crate) fn with_extras(
        driver: &str,
        node: &str,
        store: Store,
        claims: Arc<dyn ClaimSource>,
        (files, prepared): (DraFiles, Prepared),
        extras: DriverExtras,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                driver: driver.to_string(),
                node: node.to_string(),
                store,
                claims,
                files,
                prepared: Mutex::new(prepared),
                extras,
                status: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Report prepared claims in their `status.devices` through `queue` (set once). The
    /// claims recovered from the checkpoint are queued at once: a crash may have come between
    /// a prepare's answer and its status write, and the kubelet does not prepare a running
    /// pod's claims again. The writer leaves alone a status that already says the same.
    pub(crate) async fn write_status_with(&self, queue: StatusQueue) {
        if self.inner.status.set(queue).is_err() {
            return;
        }
        let prepared = self.inner.prepared.lock().await;
        if prepared.claims.is_empty() {
            return;
        }
        let devices = slices::snapshot_devices(&self.inner.store.current());
        for (uid, claim) in &prepared.claims {
            let want = ClaimRef {
                namespace: claim.namespace.clone(),
                uid: uid.clone(),
                name: claim.name.clone(),
            };
            self.queue_status(&want, self.statuses(&devices, &claim.devices));
        }
    }

    /// What `status.devices` says of the devices `answer` prepared.
    fn statuses(
        &self,
        devices: &slices::NodeDevices,
        answer: &[PreparedDevice],
    ) -> Vec<DeviceStatus> {
        answer
            .iter()
            .filter_map(|a| {
                let d = devices.get(&a.device)?;
                let made = a.made.as_ref().map(|m| m.uuid.as_str());
                Some(
                    device_status(&self.inner.node, d, &a.cdi_ids)
                        .prepared_as(a.share_id.clone(), made),
                )
            })
            .collect()
    }

    fn queue_status(&self, claim: &ClaimRef, devices: Vec<DeviceStatus>) {
        if let Some(q) = self.inner.status.get() {
            q.push(StatusJob {
                claim: claim.clone(),
                devices,
            });
        }
    }

    /// Pool (node) name.
    pub(crate) fn pool(&self) -> &str {
        &self.inner.node
    }

    /// The state store.
    pub(crate) fn store(&self) -> &Store {
        &self.inner.store
    }

    #[cfg(test)]
    /// UIDs of the prepared claims.
    pub(crate) async fn prepared_claims(&self) -> Vec<String> {
        self.inner
            .prepared
            .lock()
            .await
            .claims
            .keys()
            .cloned()
            .collect()
    }

    /// Prepare every claim; one outcome per claim UID.
    pub(crate) async fn prepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, ClaimOutcome> {
        let mut prepared = self.inner.prepared.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let outcome = self.prepare_one(&mut prepared, c).await;
            if let Err(error) = &outcome {
                tracing::warn!(claim = %c, error = %error, "claim not prepared");
            }
            out.insert(c.uid.clone(), outcome);
        }
        out
    }

    async fn prepare_one(&self, prepared: &mut Prepared, want: &ClaimRef) -> ClaimOutcome {
        if let Some(done) = prepared.claims.get(&want.uid) {
            return Ok(done.devices.clone());
        }
        let claim = self
            .inner
            .claims
            .get(&want.namespace, &want.name)
            .await
            .map_err(|e| e.to_string())?;
        let snapshot = self.inner.store.current();
        let devices = slices::snapshot_devices(&snapshot);
        let taken = prepared.holdings();
        let ctx = NodeContext {
            driver: &self.inner.driver,
            pool: &self.inner.node,
            devices: &devices,
            prepared: &taken,
        };
        let resolved = resolve(want, &claim, &ctx).map_err(|e| e.to_string())?;
        let node_spec = snapshot
            .spec
            .as_ref()
            .ok_or_else(|| format!("claim {want}: the node's CDI spec is not written yet"))?;
        let ops = self.inner.extras.instances.as_ref();
        let made = super::instances::make(ops, &resolved.devices, &snapshot.config)
            .await
            .map_err(|e| format!("claim {want}: {e}"))?;
        if self.inner.extras.kill_after_mig_create && !made.records.is_empty() {
            tracing::error!(claim = %want, "fault point dra-after-mig-create: SIGKILL");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        let undo = |made: &super::instances::MadeForClaim| {
            let records: Vec<_> = made.records.values().cloned().collect();
            async move {
                if let Some(ops) = ops {
                    super::instances::undo(ops, records).await;
                }
            }
        };
        let inputs = dra_cdi::SpecInputs {
            node: node_spec,
            hook: self.inner.extras.hook.as_ref(),
            mps: &snapshot.mps,
            made: &made.edits,
        };
        let spec = match dra_cdi::claim_spec_with(&self.inner.driver, &inputs, &resolved) {
            Ok(s) => s,
            Err(e) => {
                undo(&made).await;
                return Err(e.to_string());
            }
        };
        let answer: Vec<PreparedDevice> = resolved
            .devices
            .iter()
            .map(|d| PreparedDevice {
                request: d.request.clone(),
                pool: self.inner.node.clone(),
                device: d.device.clone(),
                cdi_ids: vec![dra_cdi::qualified_resolved(
                    &self.inner.driver,
                    &want.uid,
                    d,
                )],
                share_id: d.share.as_ref().and_then(|s| s.share_id.clone()),
                consumed: d.share.as_ref().map(|s| s.consumed),
                made: made.records.get(&d.device).cloned(),
            })
            .collect();
        let mut next = prepared.clone();
        next.claims.insert(
            want.uid.clone(),
            PreparedClaim {
                namespace: want.namespace.clone(),
                name: want.name.clone(),
                devices: answer.clone(),
            },
        );
        if let Err(e) = self.persist(want, spec, &next).await {
            undo(&made).await;
            return Err(e);
        }
        *prepared = next;
        tracing::info!(claim = %want, devices = answer.len(), "claim prepared");
        self.queue_status(want, self.statuses(&devices, &answer));
        Ok(answer)
    }

    /// Write the claim's record, its spec, then the checkpoint: a crash between them leaves
    /// a spec the next load adopts from its record, never a checkpoint entry without its
    /// spec.
    async fn persist(
        &self,
        want: &ClaimRef,
        spec: crate::domain::cdi::Spec,
        next: &Prepared,
    ) -> Result<(), String> {
        let files = self.inner.files.clone();
        let (uid, to_save) = (want.uid.clone(), next.clone());
        tokio::task::spawn_blocking(move || {
            if let Some(claim) = to_save.claims.get(&uid) {
                files.write_record(&uid, &to_save.boot_id, claim)?;
            }
            files.write_spec(&uid, &spec)?;
            files.save(&to_save)
        })
        .await
        .map_err(|e| format!("claim {want}: write task failed: {e}"))?
        .map_err(|e| format!("claim {want}: {e}"))
    }

    /// Unprepare every claim: remove its spec and its entry. Unknown claims succeed.
    pub(crate) async fn unprepare(
        &self,
        claims: &[ClaimRef],
    ) -> BTreeMap<String, Result<(), String>> {
        let mut prepared = self.inner.prepared.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            // Its MIG instances go first: a claim whose instance is still there stays
            // prepared, so the kubelet's retry destroys it.
            if let Err(e) = self.destroy_made(prepared.claims.get(&c.uid)).await {
                let e = format!("claim {c}: {e}");
                tracing::warn!(claim = %c, error = %e, "claim not unprepared");
                out.insert(c.uid.clone(), Err(e));
                continue;
            }
            let mut next = prepared.clone();
            let known = next.claims.remove(&c.uid).is_some();
            let files = self.inner.files.clone();
            let uid = c.uid.clone();
            let result = tokio::task::spawn_blocking(move || {
                files.remove_spec(&uid)?;
                let saved = if known {
                    files.save(&next).map(|()| Some(next))
                } else {
                    Ok(None)
                };
                // Last: a crash before this leaves a record without its spec, dropped at load.
                files.remove_record(&uid)?;
                saved
            })
            .await
            .map_err(|e| format!("claim {c}: remove task failed: {e}"))
            .and_then(|r| r.map_err(|e| format!("claim {c}: {e}")));
            match result {
                Ok(Some(next)) => {
                    *prepared = next;
                    tracing::info!(claim = %c, "claim unprepared");
                    self.queue_status(c, Vec::new());
                    out.insert(c.uid.clone(), Ok(()));
                }
                Ok(None) => {
                    out.insert(c.uid.clone(), Ok(()));
                }
                Err(e) => {
                    tracing::warn!(claim = %c, error = %e, "claim not unprepared");
                    out.insert(c.uid.clone(), Err(e));
                }
            }
        }
        out
    }

    /// Destroy the MIG instances made for `claim`.
    async fn destroy_made(&self, claim: Option<&PreparedClaim>) -> Result<(), String> {
        let made: Vec<_> = claim
            .into_iter()
            .flat_map(|c| c.devices.iter())
            .filter_map(|d| d.made.clone())
            .collect();
        if made.is_empty() {
            return Ok(());
        }
        let ops = self.inner.extras.instances.as_ref().ok_or_else(|| {
            "its MIG instances were made through NVML, which this run does not have".to_string()
        })?;
        for m in &made {
            super::instances::destroy(ops, m)
                .await
                .map_err(|e| format!("MIG instance {} not destroyed: {e}", m.uuid))?;
            tracing::info!(gpu = m.gpu_index, gpu_instance = m.gpu_instance_id, mig = %m.uuid,
                "MIG instance of an unprepared claim destroyed");
        }
        Ok(())
    }
}
