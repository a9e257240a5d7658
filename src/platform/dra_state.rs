//! The DRA driver's files: the checkpoint of prepared claims (`<state dir>/dra-prepared.json`,
//! with the boot ID: entries of an earlier boot are void) and the per-claim CDI specs.
//!
//! Both are written with [`super::atomic_file`] before the kubelet gets an answer, so a
//! SIGKILL never loses a prepared claim. Beside its spec, each prepared claim has a record
//! `<cdi dir>/k8s.<driver>-claim-records/<claimUID>.json` (boot ID, namespace, name, and its
//! devices with request, pool and CDI IDs: the checkpoint's entry, alone), written before the
//! spec and removed after it. It is what the spec cannot carry for Podman 4.3 (spec
//! annotations need cdiVersion 0.6.0, which it refuses), so that a claim recovered from disk is
//! the claim as prepared, not only its device names. It lives with the specs rather than in
//! the state directory: it shares their fate (a reboot that empties `/var/run/cdi` voids both),
//! and on that tmpfs its durable write costs microseconds, not a second disk fsync per
//! prepare. CDI runtimes read only `*.json` / `*.yaml` files directly in the directory, never
//! a subdirectory.
//!
//! The checkpoint is a `platform::versioned` envelope (kind, schema version, SHA-256 of the
//! data). On load, the release before's bare file is read and written back in this schema; a
//! newer schema is an error (the driver does not start rather than forget its claims); a
//! checkpoint that does not parse or fails its checksum is kept aside as
//! `dra-prepared.json.corrupt-<unix seconds>[.<n>]` (never over an earlier one), so a bad
//! file never turns into a crash loop; then every per-claim spec on disk that the checkpoint
//! lacks is adopted from its record of this boot (a crash between the spec and the
//! checkpoint write, or the lost checkpoint), or, after a corrupt checkpoint and without a
//! record, from the spec alone (device names `<claimUID>-<device>`, request unknown).
//! Records and specs of an earlier boot are removed: their claims are void. Then the
//! checkpoint, records and specs are reconciled (an Unprepare cut short finished, strays
//! removed, a missing record written again) and the temp files of killed writes removed, each
//! a [`Repair`] logged once. Used by `crate::runtime::dra`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::atomic_file::{self, IoAt};
use super::versioned::{self, Decoded};

/// File name of the checkpoint inside `--state-dir`.
pub(crate) const CHECKPOINT_FILE: &str = "dra-prepared.json";

/// The checkpoint's kind in the state-file envelope (`platform::versioned`).
const KIND: &str = "gpu-slicer.io/dra-prepared-claims";

/// Suffix of the per-claim records' folder in the CDI directory, after `k8s.<driver>-claim`
/// (`<claimUID>.json` each).
pub(crate) const RECORDS_SUFFIX: &str = "-records";

/// Errors reading or writing the DRA driver's files.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DraStateError {
    /// A file could not be read, written or removed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Encoding failed.
    #[error("cannot encode {path}: {message}")]
    Encode { path: PathBuf, message: String },
    /// The checkpoint is intact but not one this release reads (a newer schema): the driver
    /// does not start rather than forget the claims it names.
    #[error("DRA checkpoint {path}: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: versioned::VersionedError,
    },
}

impl From<IoAt> for DraStateError {
    fn from(e: IoAt) -> Self {
        DraStateError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

/// One device of a prepared claim, as answered to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PreparedDevice {
    /// Request the device serves.
    pub(crate) request: String,
    /// Pool.
    pub(crate) pool: String,
    /// Device name.
    pub(crate) device: String,
    /// Fully qualified CDI IDs.
    pub(crate) cdi_ids: Vec<String>,
    /// The share of a shared device this is (the scheduler's share ID).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "shareID")]
    pub(crate) share_id: Option<String>,
    /// What the share takes of its device (shared devices only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) consumed: Option<crate::domain::dra::capacity::Consumed>,
    /// The MIG instance made for it (dynamic MIG devices only): Unprepare destroys it, a
    /// restart keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) made: Option<crate::domain::dra::partition::MadeInstance>,
}

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PreparedClaim {
    /// Namespace (empty when recovered from a spec file).
    #[serde(default)]
    pub(crate) namespace: String,
    /// Name (empty when recovered from a spec file).
    #[serde(default)]
    pub(crate) name: String,
    /// Its devices.
    pub(crate) devices: Vec<PreparedDevice>,
}

/// The checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Prepared {
    /// Boot the entries belong to.
    pub(crate) boot_id: String,
    /// Claims by UID.
    pub(crate) claims: BTreeMap<String, PreparedClaim>,
}

/// The checkpoint at `path` as this release reads it (tests look at what was written).
#[cfg(test)]
pub(crate) fn read_checkpoint_file(path: &Path) -> Option<Prepared> {
    let bytes = std::fs::read(path).ok()?;
    versioned::decode(KIND, &bytes)
        .ok()
        .map(Decoded::into_inner)
}

/// Device name → everything `claims` (UID and claim) hold on it: a whole-device holding per
/// claim of an exclusive device, one per share of a shared one.
pub(crate) fn holdings<'a>(
    claims: impl Iterator<Item = (&'a String, &'a PreparedClaim)>,
) -> BTreeMap<String, Vec<crate::domain::dra::capacity::Holding>> {
    let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for (uid, c) in claims {
        for d in &c.devices {
            out.entry(d.device.clone())
                .or_default()
                .push(crate::domain::dra::capacity::Holding {
                    claim: uid.clone(),
                    share_id: d.share_id.clone(),
                    consumed: d.consumed,
                });
        }
    }
    out
}

/// A claim's record (see the module header): the checkpoint entry with the boot it
/// belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimRecord {
    boot_id: String,
    #[serde(flatten)]
    claim: PreparedClaim,
}

/// How a load went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LoadOutcome {
    /// No checkpoint: a first start.
    Fresh,
    /// Read as written.
    Loaded,
    /// Written in another boot: its entries are void.
    OtherBoot,
    /// Unparsable: kept aside under this path, claims recovered from the spec files.
    Corrupt { kept_as: PathBuf },
}

/// What a start found half-done on disk and completed or removed (one log line each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Repair {
    /// Spec and record without a checkpoint entry (a Prepare cut before its commit, or a
    /// lost checkpoint): adopted.
    Adopted { claim: String },
    /// A checkpoint entry without its spec (an Unprepare cut before its commit): finished.
    UnprepareFinished { claim: String },
    /// A spec with neither record nor entry: removed.
    StraySpecRemoved { claim: String },
    /// A record with neither spec nor entry: removed.
    StrayRecordRemoved { claim: String },
    /// A checkpoint entry and its spec without the record: the record written again.
    RecordRewritten { claim: String },
    /// Temp files of killed atomic writes: removed.
    TempFilesRemoved { dir: PathBuf, count: usize },
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Repair::Adopted { claim } => {
                write!(
                    f,
                    "claim {claim}: spec and record without a checkpoint entry, adopted"
                )
            }
            Repair::UnprepareFinished { claim } => write!(
                f,
                "claim {claim}: checkpoint entry without its spec (an unprepare cut short), removed"
            ),
            Repair::StraySpecRemoved { claim } => {
                write!(
                    f,
                    "claim {claim}: spec without record or checkpoint entry, removed"
                )
            }
            Repair::StrayRecordRemoved { claim } => {
                write!(
                    f,
                    "claim {claim}: record without spec or checkpoint entry, removed"
                )
            }
            Repair::RecordRewritten { claim } => {
                write!(
                    f,
                    "claim {claim}: entry and spec without a record, record written"
                )
            }
            Repair::TempFilesRemoved { dir, count } => write!(
                f,
                "{count} temp file(s) of killed writes removed from {}",
                dir.display()
            ),
        }
    }
}

/// The checkpoint and spec files of one driver.
#[derive(Debug, Clone)]
pub(crate) struct DraFiles {
    /// `<state dir>/dra-prepared.json`.
    pub(crate) checkpoint: PathBuf,
    /// CDI directory of the per-claim specs.
    pub(crate) cdi_dir: PathBuf,
    /// The driver name (spec file prefix).
    pub(crate) driver: String,
}

impl DraFiles {
    /// The spec file of a claim.
    pub(crate) fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.cdi_dir.join(crate::domain::dra::cdi::spec_file_name(
            &self.driver,
            claim_uid,
        ))
    }

    /// [`DraFiles::load_reconciled`] without the list of repairs.
    #[cfg(test)]
    pub(crate) fn load(&self, boot_id: &str) -> Result<(Prepared, LoadOutcome), DraStateError> {
        self.load_reconciled(boot_id).map(|(p, o, _)| (p, o))
    }

    /// Load the checkpoint for `boot_id`, remove what killed writes left, and make the
    /// checkpoint, the records and the specs agree (see the module header): every repair is
    /// logged once and returned. A repaired checkpoint is written back at once (the corrupt
    /// case is the caller's, who reports it), so the next start has nothing to repair; not
    /// fatal: the next prepare or unprepare writes it too.
    pub(crate) fn load_reconciled(
        &self,
        boot_id: &str,
    ) -> Result<(Prepared, LoadOutcome, Vec<Repair>), DraStateError> {
        let mut repairs = self.remove_temps();
        let (mut prepared, outcome, legacy) = self.read_checkpoint(boot_id)?;
        let corrupt = matches!(outcome, LoadOutcome::Corrupt { .. });
        let before = prepared.claims.len();
        let claims = self.reconcile(&mut prepared, corrupt);
        if legacy {
            tracing::info!(
                from = 1,
                to = versioned::SCHEMA,
                claims = prepared.claims.len(),
                "DRA checkpoint rewritten in this release's schema"
            );
        }
        let changed = legacy || !claims.is_empty() || prepared.claims.len() != before;
        repairs.extend(claims);
        for r in &repairs {
            tracing::warn!(repair = %r, "DRA state repaired at start");
        }
        if changed
            && !corrupt
            && let Err(error) = self.save(&prepared)
        {
            tracing::warn!(%error, "checkpoint with the repaired DRA claims not written");
        }
        Ok((prepared, outcome, repairs))
    }

    /// Remove the temp files of killed atomic writes from the state dir, the CDI dir and the
    /// records folder (only names our writer makes), one repair per folder that had any.
    fn remove_temps(&self) -> Vec<Repair> {
        let state = self.checkpoint.parent().unwrap_or(Path::new("."));
        [state.to_path_buf(), self.cdi_dir.clone(), self.records_dir()]
            .into_iter()
            .filter_map(|dir| match atomic_file::remove_temps(&dir) {
                Ok(removed) if removed.is_empty() => None,
                Ok(removed) => Some(Repair::TempFilesRemoved {
                    dir,
                    count: removed.len(),
                }),
                Err(e) => {
                    tracing::warn!(dir = %e.path.display(), error = %e.source, "temp files of killed writes not removed");
                    None
                }
            })
            .collect()
    }

    /// The checkpoint for `boot_id`, and whether it was in the release before's schema.
    fn read_checkpoint(
        &self,
        boot_id: &str,
    ) -> Result<(Prepared, LoadOutcome, bool), DraStateError> {
        let fresh = || Prepared {
            boot_id: boot_id.to_string(),
            claims: BTreeMap::new(),
        };
        let bytes = match std::fs::read(&self.checkpoint) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((fresh(), LoadOutcome::Fresh, false));
            }
            Err(source) => {
                return Err(DraStateError::Io {
                    path: self.checkpoint.clone(),
                    source,
                });
            }
        };
        let (prepared, legacy) = match versioned::decode::<Prepared>(KIND, &bytes) {
            Ok(Decoded::Current(p)) => (p, false),
            Ok(Decoded::Legacy(p)) => (p, true),
            Err(e) if !e.is_damage() => {
                return Err(DraStateError::Format {
                    path: self.checkpoint.clone(),
                    source: e,
                });
            }
            Err(e) => {
                tracing::error!(path = %self.checkpoint.display(), error = %e, "DRA checkpoint damaged");
                return self.keep_aside(fresh());
            }
        };
        if prepared.boot_id == boot_id {
            Ok((prepared, LoadOutcome::Loaded, legacy))
        } else {
            Ok((fresh(), LoadOutcome::OtherBoot, legacy))
        }
    }

    /// Move a damaged checkpoint aside (never over an earlier aside file) and start `fresh`.
    fn keep_aside(&self, fresh: Prepared) -> Result<(Prepared, LoadOutcome, bool), DraStateError> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Never over an earlier aside file (two bad starts in one second).
        let kept_as = (0u32..)
            .map(|n| {
                let tail = if n == 0 {
                    String::new()
                } else {
                    format!(".{n}")
                };
                self.checkpoint
                    .with_extension(format!("json.corrupt-{secs}{tail}"))
            })
            .find(|p| !p.exists())
            .unwrap_or_else(|| self.checkpoint.with_extension("json.corrupt"));
        std::fs::rename(&self.checkpoint, &kept_as).map_err(|source| DraStateError::Io {
            path: self.checkpoint.clone(),
            source,
        })?;
        Ok((fresh, LoadOutcome::Corrupt { kept_as }, false))
    }

    /// The per-claim specs in the CDI directory: claim UID → path.
    fn claim_specs(&self) -> BTreeMap<String, PathBuf> {
        let prefix = format!(
            "{}-{}_",
            crate::domain::dra::cdi_vendor(&self.driver),
            crate::domain::dra::cdi::CLAIM_CLASS
        );
        let Ok(entries) = std::fs::read_dir(&self.cdi_dir) else {
            return BTreeMap::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let uid = name.strip_prefix(&prefix)?.strip_suffix(".json")?;
                Some((uid.to_string(), e.path()))
            })
            .collect()
    }

    /// A claim recovered from its spec alone: its device names and CDI IDs (the request is
    /// not in the spec and is left empty: the kubelet then hands every device to every
    /// container of the claim; the pool is left for the runtime to fill).
    fn claim_from_spec(&self, uid: &str, path: &Path) -> Option<PreparedClaim> {
        let text = std::fs::read_to_string(path).ok()?;
        let spec = crate::domain::cdi::Spec::parse(&text, path).ok()?;
        let kind = crate::domain::dra::cdi::claim_kind(&self.driver);
        let devices = spec
            .devices
            .iter()
            .filter_map(|d| {
                d.name
                    .strip_prefix(&format!("{uid}-"))
                    .map(|dev| (dev, &d.name))
            })
            .map(|(dev, full)| PreparedDevice {
                request: String::new(),
                pool: String::new(),
                device: dev.to_string(),
                cdi_ids: vec![format!("{kind}={full}")],
                share_id: None,
                consumed: None,
                made: None,
            })
            .collect();
        Some(PreparedClaim {
            namespace: String::new(),
            name: String::new(),
            devices,
        })
    }

    /// The record folder, beside the specs: `<cdi dir>/k8s.<driver>-claim-records`.
    pub(crate) fn records_dir(&self) -> PathBuf {
        self.cdi_dir.join(format!(
            "{}-{}{RECORDS_SUFFIX}",
            crate::domain::dra::cdi_vendor(&self.driver),
            crate::domain::dra::cdi::CLAIM_CLASS
        ))
    }

    /// The record of a claim (`/` in the UID as `_`, as in the spec's file name).
    pub(crate) fn record_path(&self, claim_uid: &str) -> PathBuf {
        self.records_dir()
            .join(format!("{}.json", claim_uid.replace('/', "_")))
    }

    /// Write a claim's record atomically (before its spec: see the module header); durable
    /// once [`DraFiles::sync_records`] has run.
    pub(crate) fn write_record(
        &self,
        claim_uid: &str,
        boot_id: &str,
        claim: &PreparedClaim,
    ) -> Result<(), DraStateError> {
        let path = self.record_path(claim_uid);
        let record = ClaimRecord {
            boot_id: boot_id.to_string(),
            claim: claim.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&record).map_err(|e| DraStateError::Encode {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let dir = self.records_dir();
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(|source| DraStateError::Io {
                path: dir.clone(),
                source,
            })?;
            // The folder's own entry must be durable before any record in it counts.
            atomic_file::sync_dir(&self.cdi_dir)?;
        }
        atomic_file::replace(&dir, &path, &bytes, 0o600)?;
        Ok(())
    }

    /// Make the records written or removed so far durable (one directory fsync for a whole
    /// batch of [`DraFiles::write_record`] / [`DraFiles::remove_record`]).
    pub(crate) fn sync_records(&self) -> Result<(), DraStateError> {
        match atomic_file::sync_dir(&self.records_dir()) {
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => Ok(other?),
        }
    }

    /// Make the specs written or removed so far durable (one directory fsync for a whole
    /// batch of [`DraFiles::write_spec`] / [`DraFiles::remove_spec`]).
    pub(crate) fn sync_specs(&self) -> Result<(), DraStateError> {
        match atomic_file::sync_dir(&self.cdi_dir) {
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => Ok(other?),
        }
    }

    /// Remove a claim's record (absent is fine).
    pub(crate) fn remove_record(&self, claim_uid: &str) -> Result<(), DraStateError> {
        atomic_file::remove_if_present(&self.record_path(claim_uid))?;
        Ok(())
    }

    /// Every record on disk (unreadable ones left out): claim UID → record.
    fn records(&self) -> BTreeMap<String, ClaimRecord> {
        let Ok(entries) = std::fs::read_dir(self.records_dir()) else {
            return BTreeMap::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let uid = name.strip_suffix(".json")?.to_string();
                let bytes = std::fs::read(e.path()).ok()?;
                Some((uid, serde_json::from_slice(&bytes).ok()?))
            })
            .collect()
    }

    /// Make `prepared` (the checkpoint as read), the records and the specs agree (module
    /// header), and remove what an earlier boot left; the repairs made. Best effort: a file
    /// that cannot be read is left out, one that cannot be removed stays.
    fn reconcile(&self, prepared: &mut Prepared, corrupt: bool) -> Vec<Repair> {
        let mut repairs = Vec::new();
        let boot = prepared.boot_id.clone();
        // An unreadable boot ID on either side: no reboot can be told, nothing is void.
        let earlier =
            |r: &ClaimRecord| !boot.is_empty() && !r.boot_id.is_empty() && r.boot_id != boot;
        let specs = self.claim_specs();
        let records = self.records();
        // A checkpoint entry whose spec is gone: an Unprepare removes the spec before the
        // entry, so it was cut in between; finish it (its record goes below, and a MIG
        // instance only it owned is destroyed by the caller's orphan sweep).
        if !corrupt {
            let unprepared: Vec<String> = prepared
                .claims
                .keys()
                .filter(|uid| !specs.contains_key(*uid))
                .cloned()
                .collect();
            for uid in unprepared {
                prepared.claims.remove(&uid);
                repairs.push(Repair::UnprepareFinished { claim: uid });
            }
        }
        for (uid, path) in &specs {
            if prepared.claims.contains_key(uid) {
                continue;
            }
            let claim = match records.get(uid) {
                Some(r) if earlier(r) => {
                    atomic_file::remove_if_present(path).ok();
                    None
                }
                Some(r) => Some(r.claim.clone()),
                None if corrupt => self.claim_from_spec(uid, path),
                None => {
                    // A spec with neither record nor entry: a Prepare writes the record
                    // first and an Unprepare removes it last, so nothing holds it.
                    if atomic_file::remove_if_present(path).unwrap_or(false) {
                        repairs.push(Repair::StraySpecRemoved { claim: uid.clone() });
                    }
                    None
                }
            };
            if let Some(claim) = claim {
                prepared.claims.insert(uid.clone(), claim);
                repairs.push(Repair::Adopted { claim: uid.clone() });
            }
        }
        // An entry with its spec but no record (a record removed by hand, or a checkpoint
        // from before records existed): the record is written again.
        for (uid, claim) in &prepared.claims {
            if !records.contains_key(uid) && specs.contains_key(uid) && !corrupt {
                match self.write_record(uid, &boot, claim) {
                    Ok(()) => repairs.push(Repair::RecordRewritten { claim: uid.clone() }),
                    Err(error) => tracing::warn!(claim = %uid, %error, "record not written again"),
                }
            }
        }
        if repairs
            .iter()
            .any(|r| matches!(r, Repair::RecordRewritten { .. }))
        {
            self.sync_records().ok();
        }
        for (uid, r) in &records {
            let stale = earlier(r) || !prepared.claims.contains_key(uid);
            if stale && self.remove_record(uid).is_ok() && !earlier(r) {
                repairs.push(Repair::StrayRecordRemoved { claim: uid.clone() });
            }
        }
        repairs
    }

    /// Write the checkpoint atomically.
    pub(crate) fn save(&self, prepared: &Prepared) -> Result<(), DraStateError> {
        let bytes = versioned::encode(KIND, prepared).map_err(|e| DraStateError::Encode {
            path: self.checkpoint.clone(),
            message: e.to_string(),
        })?;
        let dir = self.checkpoint.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|source| DraStateError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        atomic_file::replace(dir, &self.checkpoint, &bytes, 0o600)?;
        atomic_file::sync_dir(dir)?;
        Ok(())
    }

    /// Write a claim's spec atomically; durable once [`DraFiles::sync_specs`] has run.
    pub(crate) fn write_spec(
        &self,
        claim_uid: &str,
        spec: &crate::domain::cdi::Spec,
    ) -> Result<(), DraStateError> {
        let path = self.spec_path(claim_uid);
        let bytes = serde_json::to_vec_pretty(spec).map_err(|e| DraStateError::Encode {
            path: path.clone(),
            message: e.to_string(),
        })?;
        std::fs::create_dir_all(&self.cdi_dir).map_err(|source| DraStateError::Io {
            path: self.cdi_dir.clone(),
            source,
        })?;
        atomic_file::replace(&self.cdi_dir, &path, &bytes, 0o644)?;
        Ok(())
    }

    /// Remove a claim's spec (absent is fine).
    pub(crate) fn remove_spec(&self, claim_uid: &str) -> Result<(), DraStateError> {
        atomic_file::remove_if_present(&self.spec_path(claim_uid))?;
        Ok(())
    }
}

/// The boot ID under `proc_root` (`sys/kernel/random/boot_id`); empty when unreadable, so
/// entries are then kept across what may be a reboot rather than dropped for no reason.
pub(crate) fn boot_id(proc_root: &Path) -> String {
    std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> DraFiles {
        DraFiles {
            checkpoint: dir.join("state").join(CHECKPOINT_FILE),
            cdi_dir: dir.join("cdi"),
            driver: "gpu-slicer.io".into(),
        }
    }

    #[test]
    fn an_empty_or_cut_checkpoint_is_kept_aside_and_never_an_error() {
        for bytes in [&b""[..], b"{\"bootId\": \"b", b"\0\0\0\0", b"[]"] {
            let dir = tempfile::tempdir().unwrap();
            let f = files(dir.path());
            std::fs::create_dir_all(f.checkpoint.parent().unwrap()).unwrap();
            std::fs::write(&f.checkpoint, bytes).unwrap();
            // An earlier aside file from the same second is not overwritten.
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            for s in [secs, secs + 1] {
                std::fs::write(
                    f.checkpoint.with_extension(format!("json.corrupt-{s}")),
                    "old",
                )
                .unwrap();
            }
            let (prepared, outcome) = f.load("boot-1").unwrap();
            let LoadOutcome::Corrupt { kept_as } = outcome else {
                panic!("{bytes:?}: {outcome:?}")
            };
            assert_eq!(std::fs::read(&kept_as).unwrap(), bytes);
            for s in [secs, secs + 1] {
                let earlier = f.checkpoint.with_extension(format!("json.corrupt-{s}"));
                assert_eq!(std::fs::read_to_string(earlier).unwrap(), "old");
            }
            assert!(!f.checkpoint.exists());
            assert_eq!(prepared.boot_id, "boot-1");
            assert!(prepared.claims.is_empty());
            // What gets written back loads as written.
            f.save(&prepared).unwrap();
            assert_eq!(f.load("boot-1").unwrap(), (prepared, LoadOutcome::Loaded));
        }
    }

    const UID: &str = "00000000-0000-4000-8000-000000000009";

    fn claim() -> PreparedClaim {
        PreparedClaim {
            namespace: "ml".into(),
            name: "train".into(),
            devices: vec![PreparedDevice {
                request: "gpu".into(),
                pool: "node-a".into(),
                device: "gpu-2".into(),
                cdi_ids: vec![format!("k8s.gpu-slicer.io/claim={UID}-gpu-2")],
                share_id: None,
                consumed: None,
                made: None,
            }],
        }
    }

    /// A checkpoint that still parses but whose data was changed after its write (an edit by
    /// hand, bits gone bad) is damaged like a cut one: kept aside, the claim recovered whole
    /// from its record and spec.
    #[test]
    fn a_checkpoint_whose_checksum_fails_is_kept_aside_and_its_claims_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        prepared_on_disk(&f, "boot-1");
        let mut prepared = Prepared {
            boot_id: "boot-1".into(),
            claims: BTreeMap::from([(UID.to_string(), claim())]),
        };
        f.save(&prepared).unwrap();
        let text = std::fs::read_to_string(&f.checkpoint).unwrap();
        // Still valid JSON of the right shape: only the checksum tells.
        let edited = text.replacen("\"train\"", "\"other\"", 1);
        assert_ne!(edited, text);
        std::fs::write(&f.checkpoint, &edited).unwrap();
        let (loaded, outcome) = f.load("boot-1").unwrap();
        let LoadOutcome::Corrupt { kept_as } = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(std::fs::read_to_string(kept_as).unwrap(), edited);
        prepared.claims.get_mut(UID).unwrap().name = "train".into();
        assert_eq!(loaded, prepared, "recovered from the record, not the edit");
    }

    /// What a prepare leaves on disk before its checkpoint write: the record and the spec.
    fn prepared_on_disk(f: &DraFiles, boot: &str) {
        f.write_record(UID, boot, &claim()).unwrap();
        let spec = crate::domain::cdi::Spec {
            cdi_version: "0.5.0".into(),
            kind: "k8s.gpu-slicer.io/claim".into(),
            devices: vec![crate::domain::cdi::Device {
                name: format!("{UID}-gpu-2"),
                container_edits: crate::domain::cdi::ContainerEdits {
                    env: vec!["A=1".into()],
                    ..Default::default()
                },
            }],
            container_edits: crate::domain::cdi::ContainerEdits::default(),
        };
        f.write_spec(UID, &spec).unwrap();
    }

    #[test]
    fn a_claim_whose_checkpoint_write_was_lost_is_adopted_whole_and_written_back() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        f.save(&Prepared {
            boot_id: "boot-1".into(),
            claims: BTreeMap::new(),
        })
        .unwrap();
        prepared_on_disk(&f, "boot-1");
        let (prepared, outcome) = f.load("boot-1").unwrap();
        assert_eq!(outcome, LoadOutcome::Loaded);
        assert_eq!(prepared.claims[UID], claim());
        // The checkpoint now holds it: the next load needs no adoption.
        let saved = read_checkpoint_file(&f.checkpoint).unwrap();
        assert_eq!(saved, prepared);
    }

    #[test]
    fn a_corrupt_checkpoint_is_recovered_from_the_records_or_else_the_specs() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        prepared_on_disk(&f, "boot-1");
        std::fs::create_dir_all(f.checkpoint.parent().unwrap()).unwrap();
        std::fs::write(&f.checkpoint, "{\"bootId\": \"boot-1\", \"cla").unwrap();
        let (prepared, outcome) = f.load("boot-1").unwrap();
        assert!(
            matches!(outcome, LoadOutcome::Corrupt { .. }),
            "{outcome:?}"
        );
        assert_eq!(
            prepared.claims[UID],
            claim(),
            "namespace, name, request, pool kept"
        );

        // Without its record only the spec speaks: device and CDI ID, no request or name.
        f.remove_record(UID).unwrap();
        std::fs::write(&f.checkpoint, "not json").unwrap();
        let (prepared, _) = f.load("boot-1").unwrap();
        let mut bare = claim();
        bare.namespace.clear();
        bare.name.clear();
        bare.devices[0].request.clear();
        bare.devices[0].pool.clear();
        assert_eq!(prepared.claims[UID], bare);
    }

    #[test]
    fn what_an_earlier_boot_left_is_removed_and_records_without_specs_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        prepared_on_disk(&f, "boot-0");
        let (prepared, outcome) = f.load("boot-1").unwrap();
        assert_eq!(outcome, LoadOutcome::Fresh);
        assert!(prepared.claims.is_empty());
        assert!(!f.spec_path(UID).exists() && !f.record_path(UID).exists());

        // A record whose spec never got written (a crash in between): dropped, not adopted.
        f.write_record(UID, "boot-1", &claim()).unwrap();
        let (prepared, _) = f.load("boot-1").unwrap();
        assert!(prepared.claims.is_empty());
        assert!(!f.record_path(UID).exists());

        // A spec with no record, and no corrupt checkpoint to recover: nothing holds it (a
        // prepare writes the record first, an unprepare removes it last), so it goes.
        prepared_on_disk(&f, "boot-1");
        f.remove_record(UID).unwrap();
        let (prepared, _) = f.load("boot-1").unwrap();
        assert!(prepared.claims.is_empty());
        assert!(!f.spec_path(UID).exists());
    }
}
