//! Parser of glibc's `ld.so.cache` (what `ldconfig` writes and the dynamic loader reads).
//!
//! Pure: bytes in, entries out. [`super::discover`](fn@super::discover) reads the driver root's
//! `etc/ld.so.cache` through the in-root resolver and looks up the driver's libraries
//! here, as the loader would, instead of shelling out to `ldconfig -p` (whose output
//! format is not stable and which cannot read a cache under another root without a
//! chroot). Hand-written because no maintained crate parses this format; it is small.
//!
//! Layout (glibc `sysdeps/generic/dl-cache.h`), little-endian on every host we run on:
//! - new format: `"glibc-ld.so.cache" "1.1"`, `u32 nlibs`, `u32 len_strings`, `u8 flags`,
//!   3 bytes padding, `u32 extension_offset`, `3 × u32` unused (48 bytes), then `nlibs`
//!   entries of `i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap` (24 bytes).
//!   `key` (the soname) and `value` (the path) are offsets of NUL-terminated strings,
//!   counted from the start of this header.
//! - old format: `"ld.so-1.7.0"` (padded to 12), `u32 nlibs`, then `nlibs` 12-byte
//!   entries; glibc ≤ 2.31 wrote it followed by a new-format header at the next 8-byte
//!   boundary (`ldconfig -c compat`). Only the new-format part is read: its entries are
//!   the same libraries with hwcap and arch details.

use super::DriverError;

/// Magic and version of the new format.
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// Magic of the old format.
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;

/// `flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6`: a glibc ELF library.
pub(crate) const FLAG_ELF_LIBC6: i32 = 0x0003;
/// Required architecture bits of a 64-bit library of the arch this binary is built for;
/// `None` where we do not know them (every libc6 entry is then taken).
pub(crate) const NATIVE_ARCH_FLAGS: Option<i32> = if cfg!(target_arch = "x86_64") {
    Some(0x0300) // FLAG_X8664_LIB64
} else if cfg!(target_arch = "aarch64") {
    Some(0x0a00) // FLAG_AARCH64_LIB64
} else {
    None
};

/// One cache entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Type and architecture flags.
    pub(crate) flags: i32,
    /// The soname the loader looks up (`libcuda.so.1`).
    pub(crate) soname: String,
    /// The file it maps to (`/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14`).
    pub(crate) path: String,
    /// hwcap bits (non-zero for libraries in hwcap subdirectories).
    pub(crate) hwcap: u64,
}

impl Entry {
    /// A 64-bit glibc library of this binary's architecture, outside any hwcap
    /// subdirectory: what a container of the same architecture loads.
    pub(crate) fn is_native(&self) -> bool {
        let type_ok = self.flags & 0x00ff == FLAG_ELF_LIBC6;
        let arch_ok = NATIVE_ARCH_FLAGS.is_none_or(|a| self.flags & 0xff00 == a);
        type_ok && arch_ok && self.hwcap == 0
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parse a cache file's bytes. `source` names the file in errors.
pub(crate) fn parse(bytes: &[u8], source: &str) -> Result<Vec<Entry>, DriverError> {
    let bad = |why: String| DriverError::LdCache {
        path: source.to_string(),
        message: why,
    };
    let start = if bytes.starts_with(NEW_MAGIC) {
        0
    } else if bytes.starts_with(OLD_MAGIC) {
        let n = u32_at(bytes, 12).ok_or_else(|| bad("truncated old-format header".into()))?;
        let old_end = (n as usize)
            .checked_mul(OLD_ENTRY)
            .and_then(|e| e.checked_add(OLD_HEADER))
            .ok_or_else(|| bad(format!("old-format entry count {n} overflows")))?;
        // ALIGN_CACHE: the new header starts at the next multiple of its alignment (8).
        let aligned = old_end.div_ceil(8) * 8;
        if !bytes
            .get(aligned..)
            .is_some_and(|b| b.starts_with(NEW_MAGIC))
        {
            return Err(bad(
                "old-format (ld.so-1.7.0) cache without the glibc-ld.so.cache1.1 part: not supported"
                    .into(),
            ));
        }
        aligned
    } else {
        return Err(bad(
            "not a glibc ld.so cache (no glibc-ld.so.cache1.1 or ld.so-1.7.0 magic)".into(),
        ));
    };
    let new = &bytes[start..];
    let nlibs = u32_at(new, 20).ok_or_else(|| bad("truncated header".into()))? as usize;
    let entries_end = nlibs
        .checked_mul(NEW_ENTRY)
        .and_then(|e| e.checked_add(NEW_HEADER))
        .filter(|&e| e <= new.len())
        .ok_or_else(|| {
            bad(format!(
                "header claims {nlibs} entries but the file has {} bytes",
                bytes.len()
            ))
        })?;
    let string = |off: u32, what: &str, i: usize| -> Result<String, DriverError> {
        let off = off as usize;
        let tail = new
            .get(off..)
            .filter(|_| off >= entries_end)
            .ok_or_else(|| bad(format!("entry {i}: {what} offset {off} out of range")))?;
        let len = tail
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| bad(format!("entry {i}: {what} not NUL-terminated")))?;
        String::from_utf8(tail[..len].to_vec())
            .map_err(|_| bad(format!("entry {i}: {what} is not UTF-8")))
    };
    let mut out = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let at = NEW_HEADER + i * NEW_ENTRY;
        // In range: checked against entries_end above.
        let field = |o: usize| u32_at(new, at + o).unwrap_or_default();
        out.push(Entry {
            flags: field(0) as i32,
            soname: string(field(4), "key", i)?,
            path: string(field(8), "value", i)?,
            hwcap: u64_at(new, at + 16).unwrap_or_default(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    const LDCONFIG: &str = "/sbin/ldconfig";

    /// A library of the host's to put into test roots: the C library every test
    /// process has mapped.
    fn some_host_lib() -> std::path::PathBuf {
        let host = std::fs::read("/etc/ld.so.cache").expect("host /etc/ld.so.cache");
        let entries = parse(&host, "/etc/ld.so.cache").expect("host cache parses");
        let libc = entries
            .iter()
            .find(|e| e.soname == "libc.so.6" && e.is_native())
            .expect("libc.so.6 in the host cache");
        std::fs::canonicalize(&libc.path).expect("libc path exists")
    }

    #[test]
    fn parses_the_hosts_cache_and_agrees_with_ldconfig_p() {
        let bytes = std::fs::read("/etc/ld.so.cache").expect("host cache");
        let entries = parse(&bytes, "/etc/ld.so.cache").expect("parses");
        assert!(!entries.is_empty());
        // `ldconfig -p` prints "N libs found in cache" followed by one line per entry.
        let out = Command::new(LDCONFIG)
            .arg("-p")
            .output()
            .expect("ldconfig -p");
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().expect("header line");
        let n: usize = first
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .expect("count");
        assert_eq!(entries.len(), n, "{first}");
        for e in &entries {
            assert!(e.path.starts_with('/'), "{e:?}");
            assert!(
                text.contains(&format!("{} ", e.soname)) && text.contains(&e.path),
                "{e:?} not in ldconfig -p"
            );
        }
        assert!(
            entries
                .iter()
                .any(|e| e.soname == "libc.so.6" && e.is_native())
        );
    }

    fn cache_made_by_ldconfig(format: &str) -> (tempfile::TempDir, Vec<u8>) {
        let root = tempfile::tempdir().expect("tmp");
        let lib_dir = root.path().join("opt/drv/lib");
        std::fs::create_dir_all(&lib_dir).expect("mkdir");
        std::fs::create_dir_all(root.path().join("etc")).expect("etc");
        std::fs::copy(some_host_lib(), lib_dir.join("libfake.so.6")).expect("copy");
        std::fs::write(root.path().join("etc/ld.so.conf"), "/opt/drv/lib\n").expect("conf");
        let status = Command::new(LDCONFIG)
            .arg("-r")
            .arg(root.path())
            .args(["-c", format])
            .status()
            .expect("run ldconfig");
        assert!(status.success());
        let bytes = std::fs::read(root.path().join("etc/ld.so.cache")).expect("cache written");
        (root, bytes)
    }

    #[test]
    fn parses_new_and_compat_caches_made_by_ldconfig_in_a_temp_root() {
        let (root, new) = cache_made_by_ldconfig("new");
        assert!(new.starts_with(NEW_MAGIC));
        let (_root2, compat) = cache_made_by_ldconfig("compat");
        assert!(
            compat.starts_with(OLD_MAGIC),
            "ldconfig -c compat writes the old header"
        );
        for bytes in [new, compat] {
            let entries = parse(&bytes, "t").expect("parses");
            // The copied libc keeps its soname libc.so.6: the cache maps it to the soname
            // link ldconfig made in the configured folder, not to the file itself.
            let e = entries
                .iter()
                .find(|e| e.path == "/opt/drv/lib/libc.so.6")
                .unwrap_or_else(|| panic!("{entries:?}"));
            assert_eq!(e.soname, "libc.so.6");
            assert!(e.is_native(), "{e:?}");
        }
        let link = std::fs::read_link(root.path().join("opt/drv/lib/libc.so.6")).expect("link");
        assert_eq!(link, Path::new("libfake.so.6"));
    }

    #[test]
    fn hostile_bytes_are_errors_not_panics() {
        let (_root, good) = cache_made_by_ldconfig("new");
        assert!(parse(b"", "t").is_err());
        assert!(parse(b"hello world, not a cache", "t").is_err());
        // Every truncation fails cleanly or parses a prefix-consistent file.
        for len in [10, 20, 47, 48, 60, good.len() / 2] {
            let _ = parse(&good[..len], "t");
        }
        let mut huge = good.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = parse(&huge, "/x/ld.so.cache").expect_err("count past the end");
        assert!(e.to_string().contains("/x/ld.so.cache"), "{e}");
        let mut wild = good.clone();
        wild[NEW_HEADER + 4..NEW_HEADER + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            parse(&wild, "t")
                .expect_err("key offset")
                .to_string()
                .contains("out of range")
        );
        let mut old_only = OLD_MAGIC.to_vec();
        old_only.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(
            parse(&old_only, "t")
                .expect_err("old only")
                .to_string()
                .contains("not supported")
        );
        assert!(Path::new(LDCONFIG).exists());
    }
}
