//! The DRA driver's files: the checkpoint of prepared claims (`<state dir>/dra-prepared.json`,
//! with the boot ID: entries of an earlier boot are void) and the per-claim CDI specs.
//!
//! Both are written with [`super::atomic_file`] before the kubelet gets an answer, so a
//! SIGKILL never loses a prepared claim. A checkpoint that does not parse is kept aside as
//! `dra-prepared.json.corrupt-<unix seconds>[.<n>]` (never over an earlier one) and the prepared claims are recovered from the
//! per-claim specs still on disk (their device names are `<claimUID>-<device>`), so a bad
//! file never turns into a crash loop. Used by `crate::runtime::dra`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::atomic_file::{self, IoAt};

/// File name of the checkpoint inside `--state-dir`.
pub const CHECKPOINT_FILE: &str = "dra-prepared.json";

/// Errors reading or writing the DRA driver's files.
#[derive(Debug, thiserror::Error)]
pub enum DraStateError {
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
pub struct PreparedDevice {
    /// Request the device serves.
    pub request: String,
    /// Pool.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// Fully qualified CDI IDs.
    pub cdi_ids: Vec<String>,
    /// The share of a shared device this is (the scheduler's share ID).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "shareID")]
    pub share_id: Option<String>,
    /// What the share takes of its device (shared devices only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed: Option<crate::domain::dra::capacity::Consumed>,
    /// The MIG instance made for it (dynamic MIG devices only): Unprepare destroys it, a
    /// restart keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<crate::domain::dra::partition::MadeInstance>,
}

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// Namespace (empty when recovered from a spec file).
    #[serde(default)]
    pub namespace: String,
    /// Name (empty when recovered from a spec file).
    #[serde(default)]
    pub name: String,
    /// Its devices.
    pub devices: Vec<PreparedDevice>,
}

/// The checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prepared {
    /// Boot the entries belong to.
    pub boot_id: String,
    /// Claims by UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Prepared {
    /// Device name → UID of the claim it is prepared for.
    pub fn devices(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (uid, c) in &self.claims {
            for d in &c.devices {
                out.insert(d.device.clone(), uid.clone());
            }
        }
        out
    }

    /// Device name → everything prepared on it: a whole-device holding per claim of an
    /// exclusive device, one per share of a shared one.
    pub fn holdings(&self) -> BTreeMap<String, Vec<crate::domain::dra::capacity::Holding>> {
        let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for (uid, c) in &self.claims {
            for d in &c.devices {
                out.entry(d.device.clone()).or_default().push(
                    crate::domain::dra::capacity::Holding {
                        claim: uid.clone(),
                        share_id: d.share_id.clone(),
                        consumed: d.consumed.unwrap_or_default(),
                    },
                );
            }
        }
        out
    }
}

/// How a load went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No checkpoint: a first start.
    Fresh,
    /// Read as written.
    Loaded,
    /// Written in another boot: its entries are void.
    OtherBoot,
    /// Unparsable: kept aside under this path, claims recovered from the spec files.
    Corrupt { kept_as: PathBuf },
}

/// The checkpoint and spec files of one driver.
#[derive(Debug, Clone)]
pub struct DraFiles {
    /// `<state dir>/dra-prepared.json`.
    pub checkpoint: PathBuf,
    /// CDI directory of the per-claim specs.
    pub cdi_dir: PathBuf,
    /// The driver name (spec file prefix).
    pub driver: String,
}

impl DraFiles {
    /// The spec file of a claim.
    pub fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.cdi_dir.join(crate::domain::dra::cdi::spec_file_name(
            &self.driver,
            claim_uid,
        ))
    }

    /// Load the checkpoint for `boot_id` (see the module header for the corrupt case).
    pub fn load(&self, boot_id: &str) -> Result<(Prepared, LoadOutcome), DraStateError> {
        let fresh = || Prepared {
            boot_id: boot_id.to_string(),
            claims: BTreeMap::new(),
        };
        let bytes = match std::fs::read(&self.checkpoint) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((fresh(), LoadOutcome::Fresh));
            }
            Err(source) => {
                return Err(DraStateError::Io {
                    path: self.checkpoint.clone(),
                    source,
                });
            }
        };
        match serde_json::from_slice::<Prepared>(&bytes) {
            Ok(p) if p.boot_id == boot_id => Ok((p, LoadOutcome::Loaded)),
            Ok(_) => Ok((fresh(), LoadOutcome::OtherBoot)),
            Err(_) => {
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
                std::fs::rename(&self.checkpoint, &kept_as).map_err(|source| {
                    DraStateError::Io {
                        path: self.checkpoint.clone(),
                        source,
                    }
                })?;
                let mut p = fresh();
                p.claims = self.recover_from_specs();
                Ok((p, LoadOutcome::Corrupt { kept_as }))
            }
        }
    }

    /// Claims whose per-claim spec is on disk, with their device names (the request and
    /// pool are not in the spec: the request is left empty, the pool is unknown too).
    pub fn recover_from_specs(&self) -> BTreeMap<String, PreparedClaim> {
        let prefix = format!(
            "{}-{}_",
            crate::domain::dra::cdi_vendor(&self.driver),
            crate::domain::dra::cdi::CLAIM_CLASS
        );
        let mut out = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(&self.cdi_dir) else {
            return out;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(uid) = name
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(".json"))
            else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let Ok(spec) = crate::domain::cdi::Spec::parse(&text, &e.path()) else {
                continue;
            };
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
            out.insert(
                uid.to_string(),
                PreparedClaim {
                    namespace: String::new(),
                    name: String::new(),
                    devices,
                },
            );
        }
        out
    }

    /// Write the checkpoint atomically.
    pub fn save(&self, prepared: &Prepared) -> Result<(), DraStateError> {
        let bytes = serde_json::to_vec_pretty(prepared).map_err(|e| DraStateError::Encode {
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

    /// Write a claim's spec atomically.
    pub fn write_spec(
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
        atomic_file::sync_dir(&self.cdi_dir)?;
        Ok(())
    }

    /// Remove a claim's spec (absent is fine).
    pub fn remove_spec(&self, claim_uid: &str) -> Result<(), DraStateError> {
        atomic_file::remove_if_present(&self.spec_path(claim_uid))?;
        Ok(())
    }
}

/// The boot ID under `proc_root` (`sys/kernel/random/boot_id`); empty when unreadable, so
/// entries are then kept across what may be a reboot rather than dropped for no reason.
pub fn boot_id(proc_root: &Path) -> String {
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
}
