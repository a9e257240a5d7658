//! The unix sockets both front-ends serve on: bound fresh (a stale socket of an earlier run
//! replaced, mode 0600, the path checked against `sun_path`), their clients read through
//! `platform::uds_authority`, and unlinked when serving stops. `runtime::plugin` (one socket
//! per resource) and `runtime::dra` (the DRA service and registration sockets) both use it
//! and name nothing of each other.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::UnixListener;

pub(crate) use crate::platform::uds_authority::incoming;

/// Longest unix socket path (`sun_path` is 108 bytes including the terminator).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// Why a socket could not be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketError {
    /// The socket path does not fit in `sun_path`.
    #[error(
        "socket path {path} is {len} bytes, longer than the {MAX_SOCKET_PATH} a unix socket allows"
    )]
    PathTooLong { path: String, len: usize },
    /// Socket directory, stale socket removal, bind or chmod failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Bind a fresh socket at `path` (its directory made, a stale socket replaced), mode 0600.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    let shown = || path.display().to_string();
    let io = |action: &'static str| {
        move |source| SocketError::Io {
            action,
            path: shown(),
            source,
        }
    };
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(SocketError::PathTooLong { path: shown(), len });
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("create directory for"))?;
    }
    remove(path).map_err(io("remove stale socket"))?;
    let listener = UnixListener::bind(path).map_err(io("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io("chmod"))?;
    Ok(listener)
}

/// Remove a socket file; it being gone already (the kubelet deletes sockets) is fine.
pub(crate) fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[tokio::test]
    async fn bind_refuses_paths_longer_than_sun_path() {
        let long = PathBuf::from(format!("/tmp/{}/x.sock", "d".repeat(110)));
        assert!(matches!(bind(&long), Err(SocketError::PathTooLong { .. })));
    }

    #[tokio::test]
    async fn bind_replaces_a_stale_socket_with_mode_0600() {
        let dir = tempfile::Builder::new()
            .prefix("gsp")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let path = dir.path().join("s.sock");
        let stale = std::os::unix::net::UnixListener::bind(&path).expect("stale");
        drop(stale);
        let _listener = bind(&path).expect("bind over stale socket");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        remove(&path).expect("remove");
        remove(&path).expect("already gone is fine");
    }
}
