//! `loadgen merge`: one fleet report from the JSON reports of several loadgen hosts that ran
//! at the same time. Counts add up and histograms are added bucket by bucket (HdrHistogram
//! addition), so merged percentiles are exactly those of all requests together, never an
//! average of percentiles. Seconds of the time series are aligned on wall-clock time. The
//! per-host breakdown is the hosts' own figures; the per-router one adds up every host's
//! share of each router (the same `--target` on several hosts is one router).

use std::collections::BTreeMap;

use crate::report::{Cpu, Parts, Report, SeriesPoint};
use crate::stats::{Tally, Totals};

/// Merges `(name, report)` pairs (the name, usually the file, is used in messages).
pub fn merge(reports: &[(String, Report)]) -> Result<Report, crate::Error> {
    let Some((first_name, first)) = reports.first() else {
        return Err("give at least one report to merge".into());
    };
    let ranges: Vec<String> = first.shards.iter().map(|s| s.range.clone()).collect();
    let mut totals = Totals::new(ranges.len());
    let mut seconds: BTreeMap<u64, (f64, Tally)> = BTreeMap::new();
    let mut routers: Vec<(String, Tally)> = Vec::new();
    let mut hosts = Vec::new();
    let mut warnings = Vec::new();
    let mut settings = first.settings.clone();
    settings.connections = 0;
    let mut target = Some(0.0);
    let mut duration_s: f64 = 0.0;
    let mut cpu = Cpu::default();
    for (name, r) in reports {
        let these: Vec<&str> = r.shards.iter().map(|s| s.range.as_str()).collect();
        if these != ranges.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(format!(
                "{name} has shards {} but {first_name} has {}: only reports against the same shard map merge",
                these.join(","),
                ranges.join(",")
            ));
        }
        let differs = |a: &str, b: &str| a != b;
        if differs(&r.settings.mix, &first.settings.mix)
            || differs(&r.settings.protocol, &first.settings.protocol)
            || r.settings.timeout_ms != first.settings.timeout_ms
        {
            warnings.push(format!(
                "{name} ran mix {} protocol {} timeout {} ms, {first_name} mix {} protocol {} timeout {} ms: the merged figures mix different workloads",
                r.settings.mix, r.settings.protocol, r.settings.timeout_ms,
                first.settings.mix, first.settings.protocol, first.settings.timeout_ms
            ));
        }
        let raw = r.raw().map_err(|e| format!("{name}: {e}"))?;
        totals.add(&raw.totals)?;
        for (target, tally) in raw.routers {
            match routers.iter_mut().find(|(t, _)| *t == target) {
                Some((_, sum)) => sum.add(&tally)?,
                None => routers.push((target, tally)),
            }
        }
        for p in raw.series {
            let slot = seconds
                .entry(p.unix_s)
                .or_insert_with(|| (0.0, Tally::default()));
            slot.0 = slot.0.max(p.seconds);
            slot.1.add(&p.totals)?;
        }
        settings.connections += r.settings.connections;
        target = match (target, r.target_qps) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        duration_s = duration_s.max(r.duration_s);
        cpu.user_s += r.cpu.user_s;
        cpu.sys_s += r.cpu.sys_s;
        cpu.cores_used += r.cpu.cores_used;
        cpu.cores_available += r.cpu.cores_available;
        for w in &r.warnings {
            let host = r.hosts.first().map_or(name.as_str(), |h| h.label());
            warnings.push(format!("{host}: {w}"));
        }
        hosts.extend(r.hosts.iter().cloned());
    }
    // Each host's rate was its own share; the merged report's is the fleet's.
    if reports.len() > 1 {
        settings.rate = match target {
            Some(t) => format!("{t}/s total over {} hosts", reports.len()),
            None => "max (closed loop) on every host".into(),
        };
    }
    let starts = hosts.iter().map(|h| h.started_unix_ms);
    let spread = starts.clone().max().unwrap_or(0) - starts.min().unwrap_or(0);
    if spread > 1000 {
        warnings.push(format!(
            "the hosts' measured windows started {:.1} s apart: their figures do not cover the same time; start them together with --start-at",
            spread as f64 / 1000.0
        ));
    }
    let requests = totals.counts.requests();
    if requests > 0 {
        cpu.us_per_query = (cpu.user_s + cpu.sys_s) * 1e6 / requests as f64;
    }
    let first_second = seconds.keys().next().copied().unwrap_or(0);
    let series: Vec<SeriesPoint> = seconds
        .into_iter()
        .map(|(unix_s, (len, totals))| SeriesPoint {
            unix_s,
            t: unix_s - first_second + 1,
            seconds: len,
            totals,
        })
        .collect();
    // Send lag, per-router and per-shard latency are exact only if every host measured them:
    // reports of older loadgens (format 1) have none.
    let old: Vec<&str> = reports
        .iter()
        .filter(|(_, r)| r.format < 2)
        .map(|(n, _)| n.as_str())
        .collect();
    if !old.is_empty() {
        totals.send_lag.reset();
        routers.clear();
        warnings.push(format!(
            "{} {} written by an older loadgen (report format 1): the merged report has no send lag, per-router or per-shard latency",
            old.join(", "),
            if old.len() == 1 { "was" } else { "were" }
        ));
    }
    let unmeasured = |r: &Report| r.shards.iter().any(|s| s.histogram.is_none());
    if !old.is_empty() || reports.iter().any(|(_, r)| unmeasured(r)) {
        totals.shard_hists.clear();
    }
    Report::build(Parts {
        settings,
        hosts,
        routers,
        ranges,
        duration_s,
        target_qps: target,
        totals: &totals,
        series: &series,
        cpu,
        warnings,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::{Host, Settings};
    use crate::stats::tests::sample;
    use crate::stats::{new_hist, Outcome};
    use crate::workload::Op;

    pub(crate) fn settings() -> Settings {
        Settings {
            mode: "direct".into(),
            targets: "t".into(),
            shardmap: None,
            connections: 2,
            pipeline: 1,
            protocol: "prepared".into(),
            mix: "read=100".into(),
            keys: "uniform".into(),
            rows_per_shard: 10,
            rate: "10/s total".into(),
            duration_s: 2.0,
            warmup_s: 0.0,
            timeout_ms: 1000,
            threads: 1,
            start_at: None,
        }
    }

    pub(crate) fn report_of(samples: &[(usize, u64)], unix: u64) -> Report {
        let mut t = Totals::new(2);
        let mut second = Tally::default();
        for &(shard, us) in samples {
            t.record(&sample(shard, Op::Read, &Outcome::Ok, us));
            second.hist.record(us).expect("record");
            second.counts.ok += 1;
        }
        t.record(&sample(1, Op::Read, &Outcome::Error("57P01".into()), 0));
        let series = vec![SeriesPoint {
            unix_s: unix,
            t: 1,
            seconds: 1.0,
            totals: second,
        }];
        let host = Host::new(
            format!("h{unix}"),
            format!("h{unix}"),
            unix * 1000,
            2.0,
            &t,
            Cpu::default(),
        )
        .expect("host");
        Report::build(Parts {
            settings: settings(),
            hosts: vec![host],
            routers: vec![("r1".into(), Tally::of(&t))],
            ranges: vec!["-80".into(), "80-".into()],
            duration_s: 2.0,
            target_qps: Some(10.0),
            totals: &t,
            series: &series,
            cpu: Cpu::default(),
            warnings: vec![],
        })
        .expect("report")
    }

    #[test]
    fn merged_histogram_is_that_of_all_samples() {
        let a: Vec<(usize, u64)> = (0..1000).map(|i| (i % 2, 100 + i as u64 * 7)).collect();
        let b: Vec<(usize, u64)> = (0..333).map(|i| (i % 2, 5_000 + i as u64 * 131)).collect();
        let ra = report_of(&a, 100);
        let rb = report_of(&b, 100);
        let merged = merge(&[("a".into(), ra), ("b".into(), rb)]).expect("merge");

        let mut all = new_hist();
        for &(_, us) in a.iter().chain(&b) {
            all.record(us).expect("record");
        }
        let raw = merged.raw().expect("raw");
        let (t, series) = (raw.totals, raw.series);
        assert_eq!(t.hist, all);
        assert_eq!(
            raw.routers.len(),
            1,
            "the same target on two hosts is one router"
        );
        assert_eq!(raw.routers[0].1.hist, all);
        assert_eq!(merged.hosts[1].latency_us.p50, {
            let mut hb = new_hist();
            for &(_, us) in &b {
                hb.record(us).expect("record");
            }
            hb.value_at_quantile(0.5)
        });
        assert_eq!(merged.latency_us.p99, all.value_at_quantile(0.99));
        assert_eq!(merged.latency_us.p50, all.value_at_quantile(0.5));
        assert_eq!(merged.counts.ok, 1333);
        assert_eq!(merged.counts.errors, 2);
        assert_eq!(merged.errors_by_sqlstate["57P01"], 2);
        assert_eq!(
            merged.shards[0].counts.ok + merged.shards[1].counts.ok,
            1333
        );
        assert_eq!(merged.target_qps, Some(20.0));
        assert_eq!(merged.settings.rate, "20/s total over 2 hosts");
        assert_eq!(merged.hosts.len(), 2);
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].totals.hist, all);
    }

    #[test]
    fn seconds_align_on_wall_clock() {
        let merged = merge(&[
            ("a".into(), report_of(&[(0, 10)], 100)),
            ("b".into(), report_of(&[(0, 20)], 101)),
        ])
        .expect("merge");
        assert_eq!(merged.series.len(), 2);
        assert_eq!(merged.series[1].t, 2);
    }

    #[test]
    fn windows_that_do_not_line_up_are_pointed_out() {
        let merged = merge(&[
            ("a".into(), report_of(&[(0, 10)], 100)),
            ("b".into(), report_of(&[(0, 20)], 100)),
        ])
        .expect("merge");
        assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
        let merged = merge(&[
            ("a".into(), report_of(&[(0, 10)], 100)),
            ("b".into(), report_of(&[(0, 20)], 103)),
        ])
        .expect("merge");
        assert!(
            merged.warnings.iter().any(|w| w.contains("3.0 s apart")),
            "{:?}",
            merged.warnings
        );
    }

    #[test]
    fn an_old_report_drops_what_it_lacks_and_says_so() {
        let new = report_of(&[(0, 10)], 100);
        let mut old = report_of(&[(0, 20)], 100);
        old.format = 1;
        old.routers.clear();
        let merged = merge(&[("new.json".into(), new), ("old.json".into(), old)]).expect("merge");
        assert!(merged.routers.is_empty(), "{:?}", merged.routers);
        assert!(merged.send_lag_us.is_none());
        assert!(
            merged
                .warnings
                .iter()
                .any(|w| w.contains("old.json was written by an older loadgen")),
            "{:?}",
            merged.warnings
        );
    }

    #[test]
    fn refuses_different_shard_maps() {
        let a = report_of(&[(0, 10)], 100);
        let mut b = a.clone();
        b.shards[1].range = "80-c0".into();
        let err = merge(&[("a".into(), a), ("b".into(), b)]).expect_err("must refuse");
        assert!(err.contains("same shard map"), "{err}");
    }
}
