//! What Linux's `/proc/PID/stat` says about a process: its state, parent, CPU time and start
//! time. The one reader of that file for the harness, the cluster tool, loadgen's tests and the
//! benchmarks (`cluster cpu PID`).

/// The fields of `/proc/PID/stat` the tools use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    pub ppid: u32,
    /// CPU time in user and kernel mode, in clock ticks ([`ticks_per_second`]).
    pub utime: u64,
    pub stime: u64,
    /// When the process started, in clock ticks since boot: with the pid it names the process
    /// even after the pid is reused.
    pub start: u64,
}

impl Stat {
    /// Running, or at least not exited (a zombie has exited but not been reaped).
    pub fn alive(&self) -> bool {
        self.state != 'Z' && self.state != 'X'
    }
}

/// The stat of process `pid`; `None` when there is no such process.
pub fn stat(pid: u32) -> Option<Stat> {
    parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses the text of a stat file. The command name (field 2) may contain spaces and
/// parentheses: the fields are read after its last `)`.
pub fn parse(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is index 0 here; ppid is field 4, utime 14, stime 15, starttime 22.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: u32::try_from(num(1)?).ok()?,
        utime: num(11)?,
        stime: num(12)?,
        start: num(19)?,
    })
}

/// Whether `pid` runs (exists and has not exited).
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.alive())
}

/// The pids whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| stat(child).is_some_and(|s| s.ppid == pid))
        .collect()
}

/// Clock ticks per second, the unit of [`Stat`]'s times.
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parentheses() {
        let s = parse(
            "42 (my (odd) name) S 7 42 42 0 -1 4194560 100 0 0 0 15 3 0 0 20 0 1 0 12345 1000 10",
        )
        .unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'S',
                ppid: 7,
                utime: 15,
                stime: 3,
                start: 12345
            }
        );
        assert!(parse("garbage").is_none());
    }

    #[test]
    fn reads_this_process() {
        let me = stat(std::process::id()).expect("our own stat");
        assert!(me.alive());
        assert!(ticks_per_second() >= 1);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let found = children(std::process::id()).contains(&child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(found, "a child this test started");
        assert!(!alive(child.id()), "reaped");
    }
}
