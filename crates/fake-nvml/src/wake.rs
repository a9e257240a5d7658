//! Waking an event wait at once, as the kernel's signal wakes a real `nvmlEventSetWait`:
//! every event set owns an `eventfd`, written when an event is queued for it (injection from
//! any thread, a due node-file event), and, when `FAKE_NVML_EVENT_FILE` is set, an inotify
//! watch on that file's folder (a line file closed after writing or renamed into place, from
//! any process). A wait blocks in `poll(2)` on both until one is readable or its timeout
//! passes. The library still starts no threads: the waiting thread is the caller's.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// The wake-up sources of one event set.
#[derive(Debug)]
pub(crate) struct Waker {
    /// Counter written by [`Waker::wake`].
    event: OwnedFd,
    /// Watch on the event file's folder; `None`: no event file, or its folder cannot be
    /// watched (the wait then looks at the file every [`crate::WAIT_STEP`]).
    file: Option<OwnedFd>,
    /// An event file is configured but not watched.
    file_unwatched: bool,
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl Waker {
    /// A waker for one set; `event_file`: the `FAKE_NVML_EVENT_FILE` path, if any.
    pub(crate) fn new(event_file: Option<&Path>) -> io::Result<Self> {
        // SAFETY: plain syscall without pointers; the fd is owned at once below.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = event_file.and_then(|p| watch_folder(p).ok());
        Ok(Self {
            event,
            file_unwatched: event_file.is_some() && file.is_none(),
            file,
        })
    }

    /// Make the set's current or next wait return.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter (EAGAIN)
        // means a wake-up is pending already, so the result needs no handling.
        let _ = unsafe {
            libc::write(
                self.event.as_raw_fd(),
                (&raw const one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Block until woken, the event file's folder changes, or `timeout` passes; then clear
    /// what woke it. The caller re-checks its queue afterwards, so a spurious return is fine.
    pub(crate) fn wait(&self, timeout: Duration) {
        let timeout = if self.file_unwatched {
            timeout.min(crate::WAIT_STEP)
        } else {
            timeout
        };
        let mut fds = vec![libc::pollfd {
            fd: self.event.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        if let Some(f) = &self.file {
            fds.push(libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // Round up so a sub-millisecond remainder does not spin.
        let ms = libc::c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs for the whole call.
        let _ = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        drain(&self.event);
        if let Some(f) = &self.file {
            drain(f);
        }
    }
}

/// Read a non-blocking fd until it is empty.
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reads at most `buf.len()` bytes into a live buffer from our own fd.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return;
        }
    }
}

/// An inotify fd watching the folder of `path` for files written or moved in.
fn watch_folder(path: &Path) -> io::Result<OwnedFd> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: plain syscall without pointers; the fd is owned at once below.
    let fd = check(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by inotify_init1 and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `dir` is a NUL-terminated path alive for the call; `fd` is ours.
    check(unsafe {
        libc::inotify_add_watch(
            fd.as_raw_fd(),
            dir.as_ptr(),
            libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO,
        )
    })?;
    Ok(fd)
}
