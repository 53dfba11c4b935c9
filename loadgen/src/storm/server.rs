//! The server's side, read from /proc for `--router-pid` (its CPU time per login and its
//! memory), and this process's open-file limit, which thousands of connections need raised.

use std::io;

use serde::Serialize;

use super::SPARE_FILES;

/// The server's CPU time and memory, from /proc.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerUse {
    pub pid: u32,
    /// User + system CPU seconds over the phase (all threads).
    pub cpu_s: f64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// CPU per successful login (storm only).
    pub cpu_us_per_login: Option<f64>,
    /// Successful logins per CPU second of the server: logins a second one core sustains.
    pub logins_per_core_second: Option<f64>,
    /// VmHWM at the end of the phase: the process's peak resident memory over its whole life.
    pub vm_hwm_mib: Option<f64>,
    /// VmRSS at the end of the phase (the storm's clients still connected).
    pub vm_rss_mib: Option<f64>,
}

/// A process's user and system CPU time in clock ticks, from the text of `/proc/PID/stat`.
pub fn parse_stat_ticks(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces and parentheses: the
    // fields after the last ')' start with field 3 (state); utime is field 14, stime 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime = fields.next()?.parse().ok()?;
    let stime = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// A `Vm...:` line of `/proc/PID/status` (`VmHWM:\t  123456 kB`), in KiB.
pub fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Clock ticks a second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The server's CPU ticks now.
pub(crate) fn server_ticks(pid: u32) -> Result<(u64, u64), crate::Error> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!("--router-pid {pid}: cannot read {path}: {e} (is the process running, on this machine?)")
    })?;
    parse_stat_ticks(&text).ok_or_else(|| format!("--router-pid {pid}: cannot read {path}"))
}

/// What the server used between `before` (its ticks) and now; `logins` successful logins.
pub(crate) fn server_use(
    pid: u32,
    before: (u64, u64),
    logins: Option<u64>,
) -> Result<ServerUse, crate::Error> {
    let after = server_ticks(pid)?;
    let hz = ticks_per_second();
    let user = after.0.saturating_sub(before.0) as f64 / hz;
    let sys = after.1.saturating_sub(before.1) as f64 / hz;
    let cpu = user + sys;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mib = |field: &str| parse_status_kib(&status, field).map(|kib| kib as f64 / 1024.0);
    let per_login = logins.filter(|&n| n > 0 && cpu > 0.0);
    Ok(ServerUse {
        pid,
        cpu_s: cpu,
        cpu_user_s: user,
        cpu_sys_s: sys,
        cpu_us_per_login: per_login.map(|n| cpu * 1e6 / n as f64),
        logins_per_core_second: per_login.map(|n| n as f64 / cpu),
        vm_hwm_mib: mib("VmHWM"),
        vm_rss_mib: mib("VmRSS"),
    })
}

/// Raises this process's open-file soft limit to its hard limit and checks that `need`
/// descriptors fit; returns the limit.
pub fn raise_nofile(need: u64) -> Result<u64, crate::Error> {
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(format!(
            "cannot read RLIMIT_NOFILE: {}",
            io::Error::last_os_error()
        ));
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // A hard limit of "unlimited" cannot be a soft limit for files: keep the old one then.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    let limit: u64 = lim.rlim_cur;
    check_nofile(need, limit)?;
    Ok(limit)
}

/// Whether `need` file descriptors fit under the open-file limit `limit`.
pub fn check_nofile(need: u64, limit: u64) -> Result<(), crate::Error> {
    if need > limit {
        return Err(format!(
            "--logins + --silent + {SPARE_FILES} = {need} open files are needed, but this process's open-file limit (RLIMIT_NOFILE, raised to its hard limit) is {limit}: raise the hard limit (`ulimit -Hn {need}` as root, LimitNOFILE= in a systemd unit, /etc/security/limits.conf) or ask for fewer connections"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields_after_a_tricky_command_name() {
        let stat = "4242 (shard gate) (x)) S 1 4242 4242 0 -1 4194560 1200 0 0 0 731 205 0 0 20 0 3 0 100 0 0";
        assert_eq!(parse_stat_ticks(stat), Some((731, 205)));
        assert_eq!(parse_stat_ticks("garbage"), None);
        let own = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
        assert!(parse_stat_ticks(&own).is_some(), "{own}");
    }

    #[test]
    fn proc_status_memory() {
        let status =
            "Name:\tshardgate\nVmPeak:\t  999 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(204_800));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(102_400));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
        let own = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        assert!(parse_status_kib(&own, "VmHWM").is_some_and(|k| k > 0));
    }

    #[test]
    fn own_cpu_and_memory_read_as_a_server_would_be() {
        let pid = std::process::id();
        let before = server_ticks(pid).expect("own ticks");
        let mut x = 0u64;
        for i in 0..30_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let used = server_use(pid, before, Some(100)).expect("own use");
        assert!(used.vm_hwm_mib.is_some_and(|m| m > 0.0));
        assert!(used.vm_hwm_mib >= used.vm_rss_mib);
        if used.cpu_s > 0.0 {
            assert!(used.cpu_us_per_login.is_some());
        }
        assert!(server_ticks(u32::MAX).is_err());
    }

    #[test]
    fn the_open_file_limit_is_checked() {
        assert!(check_nofile(10_100, 20_000).is_ok());
        let err = check_nofile(30_100, 20_000).expect_err("too many");
        assert!(
            err.contains("RLIMIT_NOFILE") && err.contains("20000"),
            "{err}"
        );
        let limit = raise_nofile(10).expect("10 files fit");
        assert!(limit >= 10);
    }
}
