//! Making sure throw-away servers do not outlive their test process: a registry of live
//! non-persistent servers stopped by an `atexit` hook (tests keep clusters in never-dropped
//! statics), and a sweep of directories left behind by test processes that crashed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// Prefix of the temp-dir entries of non-persistent servers: `shardgate-test-<pid>-<seq>`.
pub(crate) const TEST_DIR_PREFIX: &str = "shardgate-test-";
/// Prefix of fallback socket directories: `shardgate-sock-<hash>`.
pub(crate) const SOCK_DIR_PREFIX: &str = "shardgate-sock-";

/// What must be cleaned up for one server.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub data_dir: PathBuf,
    /// Directories to delete once the server is down (server dir, fallback socket dir).
    pub remove: Vec<PathBuf>,
}

static REGISTRY: Mutex<Vec<(u64, Entry)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static ATEXIT: Once = Once::new();

/// Records a server to stop at process exit; returns the id to [`unregister`] it with.
pub(crate) fn register(entry: Entry) -> u64 {
    ATEXIT.call_once(|| {
        // SAFETY: at_exit is an `extern "C" fn()` that never unwinds.
        unsafe {
            libc::atexit(at_exit);
        }
    });
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((id, entry));
    id
}

/// Forgets a server (it was stopped and removed by its owner).
pub(crate) fn unregister(id: u64) {
    REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(i, _)| *i != id);
}

extern "C" fn at_exit() {
    // Never unwind across the C boundary.
    let _ = std::panic::catch_unwind(|| {
        let deadline = Instant::now() + Duration::from_secs(2);
        let entries = loop {
            match REGISTRY.try_lock() {
                Ok(mut guard) => break std::mem::take(&mut *guard),
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    break std::mem::take(&mut *p.into_inner())
                }
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(std::sync::TryLockError::WouldBlock) => return,
            }
        };
        // Signal every postmaster first, then wait: shutdowns overlap.
        let pids: Vec<Option<u32>> = entries
            .iter()
            .map(|(_, e)| signal_postmaster(&e.data_dir))
            .collect();
        for ((_, entry), pid) in entries.iter().zip(pids) {
            if let Some(pid) = pid {
                wait_for_exit(pid, Duration::from_secs(5));
            }
            for dir in &entry.remove {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    });
}

/// The postmaster pid recorded in `data_dir/postmaster.pid`, if that process is alive.
pub(crate) fn postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    (pid > 1 && pid_alive(pid)).then_some(pid)
}

/// Sends SIGQUIT (immediate shutdown) to the postmaster of `data_dir`; returns its pid.
pub(crate) fn signal_postmaster(data_dir: &Path) -> Option<u32> {
    let pid = postmaster_pid(data_dir)?;
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGQUIT);
    }
    Some(pid)
}

/// Immediate shutdown of the postmaster of `data_dir`, escalating to SIGKILL after `timeout`.
/// Returns whether a running postmaster was found.
pub(crate) fn kill_postmaster(data_dir: &Path, timeout: Duration) -> bool {
    match signal_postmaster(data_dir) {
        Some(pid) => {
            wait_for_exit(pid, timeout);
            true
        }
        None => false,
    }
}

/// Waits for `pid` to exit; SIGKILLs it after `timeout`.
pub(crate) fn wait_for_exit(pid: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while pid_alive(pid) {
        if Instant::now() >= deadline {
            // SAFETY: see above.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `pid` is a live (not zombie) process.
pub(crate) fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    // A zombie (exited, not yet reaped, e.g. when pid 1 does not reap) counts as dead.
    crate::proc::stat(pid).is_none_or(|s| s.alive())
}

/// Start time (clock ticks since boot) of this process; with the pid it identifies the process
/// even after the pid is reused.
pub(crate) fn own_start_time() -> u64 {
    crate::proc::stat(std::process::id()).map_or(0, |s| s.start)
}

/// Whether the process `pid` that started at `start` (0 = unknown) still runs.
pub(crate) fn owner_alive(pid: u32, start: u64) -> bool {
    if !pid_alive(pid) {
        return false;
    }
    match (start, crate::proc::stat(pid)) {
        (0, _) | (_, None) => true,
        (start, Some(s)) => s.start == start,
    }
}

/// Removes what crashed test processes left in `tmp`: server directories of dead owners (stopping
/// their postmasters first), half-built templates, and orphaned socket directories.
pub(crate) fn sweep_stale(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Some(rest) = name.strip_prefix(TEST_DIR_PREFIX) {
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let info = crate::server::Info::read(&path).ok();
            let start = info.as_ref().map(|i| i.owner_start).unwrap_or(0);
            if owner_alive(pid, start) {
                continue;
            }
            kill_postmaster(&path.join("data"), Duration::from_secs(5));
            if let Some(info) = info {
                if info.socket_dir.starts_with(tmp) && !info.socket_dir.starts_with(&path) {
                    let _ = std::fs::remove_dir_all(&info.socket_dir);
                }
            }
            let _ = std::fs::remove_dir_all(&path);
        } else if name.starts_with(crate::template::TEMPLATE_PREFIX) {
            // `<template>.tmp-<pid>-<nanos>` / `.pw-<pid>-<nanos>` / `.trash-<pid>-<nanos>`
            let Some((_, tail)) = name
                .rsplit_once(".tmp-")
                .or_else(|| name.rsplit_once(".pw-"))
                .or_else(|| name.rsplit_once(".trash-"))
            else {
                continue;
            };
            let Some(pid) = tail.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if !pid_alive(pid) {
                let _ = std::fs::remove_dir_all(&path);
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// 64-bit FNV-1a: a hash that is stable across Rust versions, for directory names.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for part in parts {
        for b in part.iter().chain(std::iter::once(&0u8)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}
