//! The envelope of gpu-slicer's own state files (`held.json`, `dra-prepared.json`): a kind, a
//! schema version and a SHA-256 of the payload. A rolling upgrade reads what the release
//! before wrote (schema 1: the bare payload, no envelope) and the caller writes it back in
//! this schema; a file from a newer release is refused rather than misread (the agent must not
//! start and forget what that release held); a torn or edited file is told apart from a valid
//! one by its checksum even where it still parses.
//!
//! Pure encode/decode over bytes: `platform::checkpoint` and `platform::dra_state` do the IO
//! and decide what each refusal means for their file.

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// The schema this release writes. 1 was the payload alone, before envelopes.
pub(crate) const SCHEMA: u64 = 2;

/// Why a state file was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VersionedError {
    #[error("not a state file: {0}")]
    Json(#[from] serde_json::Error),
    #[error("kind is {found:?}, expected {expected:?}")]
    Kind { expected: String, found: String },
    #[error("checksum {written} does not match its data (sha256:{actual}): torn or edited")]
    Checksum { written: String, actual: String },
    #[error(
        "schema version {found} was written by a newer gpu-slicer (this one reads up to {SCHEMA}); \
         refusing to start rather than forget what it holds: run that release again, or move \
         the file aside by hand"
    )]
    Future { found: u64 },
    #[error("schema version {found} is not one gpu-slicer ever wrote")]
    Unknown { found: u64 },
}

impl VersionedError {
    /// Whether the file's bytes are damaged (as opposed to written by another release).
    pub(crate) fn is_damage(&self) -> bool {
        matches!(self, Self::Json(_) | Self::Checksum { .. })
    }
}

/// A file read, and in which schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoded<T> {
    /// This release's schema.
    Current(T),
    /// Schema 1 (the release before envelopes): the caller writes it back as [`SCHEMA`].
    Legacy(T),
}

#[cfg(test)]
impl<T> Decoded<T> {
    pub(crate) fn into_inner(self) -> T {
        match self {
            Self::Current(t) | Self::Legacy(t) => t,
        }
    }
}

#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    version: Option<u64>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    kind: String,
    checksum: String,
    #[serde(borrow)]
    data: &'a RawValue,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `data` in the envelope of `kind`, pretty-printed. The payload is written as serialized,
/// once: the checksum covers exactly the bytes [`decode`] reads back as the raw `data`.
pub(crate) fn encode<T: Serialize>(kind: &str, data: &T) -> Result<Vec<u8>, serde_json::Error> {
    let payload = serde_json::to_string_pretty(data)?;
    let head = format!(
        "{{\n  \"kind\": {},\n  \"version\": {SCHEMA},\n  \"checksum\": \"sha256:{}\",\n  \"data\": ",
        serde_json::to_string(kind)?,
        sha256_hex(payload.as_bytes())
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(payload.as_bytes());
    bytes.extend_from_slice(b"\n}\n");
    Ok(bytes)
}

/// Read a file of `kind`: this schema (checksum verified) or schema 1.
pub(crate) fn decode<T: DeserializeOwned>(
    kind: &str,
    bytes: &[u8],
) -> Result<Decoded<T>, VersionedError> {
    match serde_json::from_slice::<Probe>(bytes)?.version {
        // Schema 1 payloads have no `version` key (held: `resources`; DRA: `bootId`, `claims`).
        None => Ok(Decoded::Legacy(serde_json::from_slice(bytes)?)),
        Some(SCHEMA) => {
            let envelope: Envelope<'_> = serde_json::from_slice(bytes)?;
            if envelope.kind != kind {
                return Err(VersionedError::Kind {
                    expected: kind.to_string(),
                    found: envelope.kind,
                });
            }
            let actual = sha256_hex(envelope.data.get().as_bytes());
            if envelope.checksum != format!("sha256:{actual}") {
                return Err(VersionedError::Checksum {
                    written: envelope.checksum,
                    actual,
                });
            }
            Ok(Decoded::Current(serde_json::from_str(envelope.data.get())?))
        }
        Some(found) if found > SCHEMA => Err(VersionedError::Future { found }),
        Some(found) => Err(VersionedError::Unknown { found }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    type Data = BTreeMap<String, Vec<u32>>;

    fn data() -> Data {
        BTreeMap::from([("a".to_string(), vec![1, 2]), ("b".to_string(), vec![])])
    }

    #[test]
    fn round_trip_and_the_release_before() {
        let bytes = encode("test/kind", &data()).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains("\"version\": 2") && text.contains("\"checksum\": \"sha256:"),
            "{text}"
        );
        assert_eq!(
            decode::<Data>("test/kind", &bytes).unwrap(),
            Decoded::Current(data())
        );
        let legacy = serde_json::to_vec_pretty(&data()).unwrap();
        assert_eq!(
            decode::<Data>("test/kind", &legacy).unwrap(),
            Decoded::Legacy(data())
        );
    }

    #[test]
    fn damage_another_kind_and_a_newer_release_are_each_told() {
        let bytes = String::from_utf8(encode("test/kind", &data()).unwrap()).unwrap();
        // Still valid JSON, still the right shape: only the checksum tells.
        let edited = bytes.replacen("1,", "7,", 1);
        let e = decode::<Data>("test/kind", edited.as_bytes()).unwrap_err();
        assert!(
            matches!(e, VersionedError::Checksum { .. }) && e.is_damage(),
            "{e}"
        );
        let torn = &bytes.as_bytes()[..bytes.len() / 2];
        assert!(decode::<Data>("test/kind", torn).unwrap_err().is_damage());
        let e = decode::<Data>("other/kind", bytes.as_bytes()).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"kind is "test/kind", expected "other/kind""#
        );
        let future = bytes.replacen("\"version\": 2", "\"version\": 3", 1);
        let e = decode::<Data>("test/kind", future.as_bytes()).unwrap_err();
        assert!(
            matches!(e, VersionedError::Future { found: 3 }) && !e.is_damage(),
            "{e}"
        );
        assert!(e.to_string().contains("newer gpu-slicer"), "{e}");
    }
}
