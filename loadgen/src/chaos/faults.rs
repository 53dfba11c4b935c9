//! The fault schedule: what to break, when, and what happened when it was broken.
//!
//! A fault is a shell command run at a known second of the load (`AT NAME COMMAND`, one per
//! line of `--faults FILE` or one per `--fault`). loadgen does not know how to kill a router or
//! promote a standby; the script that built the fleet does, and hands loadgen the commands.
//! Keeping the clock here means each fault's start and end are measured on the same clock as
//! the latencies, so its window in the timeline is exact.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::AsyncWriteExt;

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Seconds after the start of the load.
    pub at: f64,
    /// A short name for tables and the chart (`router-kill`, `failover`).
    pub name: String,
    /// Run with `sh -c`.
    pub command: String,
}

/// A fault that ran: when, for how long, and whether its command succeeded.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    pub name: String,
    pub command: String,
    /// Seconds after the start of the load.
    pub start_s: f64,
    pub end_s: f64,
    /// `None` when the command succeeded; its exit status or failure otherwise.
    pub failure: Option<String>,
}

/// Parses `AT NAME COMMAND...` (AT in seconds, or with an `s`/`m`/`h` suffix).
pub fn parse_line(line: &str) -> Result<Fault, String> {
    let line = line.trim();
    let mut parts = line.splitn(3, char::is_whitespace);
    let (Some(at), Some(name), Some(command)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!(
            "{line:?}: a fault is `AT NAME COMMAND` (e.g. `30s router-kill kill -9 1234`)"
        ));
    };
    let at = seconds(at).ok_or_else(|| {
        format!("{line:?}: {at:?} is not a time (seconds, or a number with s, m or h)")
    })?;
    Ok(Fault {
        at,
        name: name.to_string(),
        command: command.trim().to_string(),
    })
}

fn seconds(text: &str) -> Option<f64> {
    let (num, unit) = match text.char_indices().last()? {
        (i, 's') => (&text[..i], 1.0),
        (i, 'm') => (&text[..i], 60.0),
        (i, 'h') => (&text[..i], 3600.0),
        _ => (text, 1.0),
    };
    let v: f64 = num.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v * unit)
}

/// The faults of a schedule file (blank lines and `#` comments skipped), each error naming
/// the file and line, plus those given one by one; sorted by time.
pub fn schedule(file: Option<&Path>, one_by_one: &[String]) -> Result<Vec<Fault>, String> {
    let mut faults = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fault =
                parse_line(line).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            faults.push(fault);
        }
    }
    for f in one_by_one {
        faults.push(parse_line(f).map_err(|e| format!("--fault {e}"))?);
    }
    faults.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(faults)
}

/// Runs every fault at its time, one after the other (a fault that is still running when the
/// next is due delays it: faults never overlap, so each window has one cause). Each command's
/// output goes to `log`.
pub async fn run(faults: Vec<Fault>, start: Instant, log: &Path) -> Result<Vec<Applied>, String> {
    let mut out = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .await
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let mut applied = Vec::with_capacity(faults.len());
    for fault in faults {
        tokio::time::sleep_until((start + Duration::from_secs_f64(fault.at)).into()).await;
        let began = Instant::now();
        let header = format!(
            "=== {:.1}s {}: {}\n",
            began.duration_since(start).as_secs_f64(),
            fault.name,
            fault.command
        );
        let _ = out.write_all(header.as_bytes()).await;
        let result = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&fault.command)
            .stdin(Stdio::null())
            .output()
            .await;
        let failure = match &result {
            Ok(o) => {
                let _ = out.write_all(&o.stdout).await;
                let _ = out.write_all(&o.stderr).await;
                (!o.status.success()).then(|| format!("exited with {}", o.status))
            }
            Err(e) => Some(format!("could not run sh: {e}")),
        };
        let ended = Instant::now();
        eprintln!(
            "loadgen chaos: {:.1}s {} took {:.1}s{}",
            began.duration_since(start).as_secs_f64(),
            fault.name,
            ended.duration_since(began).as_secs_f64(),
            failure
                .as_deref()
                .map(|f| format!(" and FAILED ({f})"))
                .unwrap_or_default()
        );
        applied.push(Applied {
            name: fault.name,
            command: fault.command,
            start_s: began.duration_since(start).as_secs_f64(),
            end_s: ended.duration_since(start).as_secs_f64(),
            failure,
        });
    }
    let _ = out.flush().await;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_units() {
        let f = parse_line("1.5m router-kill kill -9 $(cat r1.pid)").unwrap();
        assert_eq!(f.at, 90.0);
        assert_eq!(f.name, "router-kill");
        assert_eq!(f.command, "kill -9 $(cat r1.pid)");
        assert_eq!(parse_line("12 x true").unwrap().at, 12.0);
        assert_eq!(parse_line("1h x true").unwrap().at, 3600.0);
        assert!(parse_line("soon x true")
            .unwrap_err()
            .contains("not a time"));
        assert!(parse_line("-3 x true").is_err());
        assert!(parse_line("12 lonely")
            .unwrap_err()
            .contains("AT NAME COMMAND"));
    }

    #[test]
    fn a_schedule_file_names_its_bad_line_and_sorts() {
        let dir = std::env::temp_dir().join(format!("chaos-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("faults");
        std::fs::write(&path, "# comment\n\n20 b true\n10 a true\n").unwrap();
        let s = schedule(Some(&path), &["5 c true".to_string()]).unwrap();
        let names: Vec<&str> = s.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["c", "a", "b"]);
        std::fs::write(&path, "10 a true\nbad\n").unwrap();
        let e = schedule(Some(&path), &[]).unwrap_err();
        assert!(e.contains(&format!("{}:2:", path.display())), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn faults_run_in_order_and_failures_are_kept() {
        let dir = std::env::temp_dir().join(format!("chaos-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("faults.log");
        let faults = vec![
            parse_line("0 first echo one").unwrap(),
            parse_line("0.05 second exit 3").unwrap(),
        ];
        let applied = run(faults, Instant::now(), &log).await.unwrap();
        assert_eq!(applied.len(), 2);
        assert!(applied[0].failure.is_none());
        assert!(applied[1].failure.as_deref().unwrap().contains('3'));
        assert!(applied[1].start_s >= 0.05);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("first: echo one\none\n"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
