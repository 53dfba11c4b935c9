//! loadgen against real Postgres: prepare, fixed-rate runs, per-shard attribution checked
//! against the servers' own statistics, exact merges, a run through a real router, and a
//! run during which the servers stop.
//!
//! The runs are serialised (one at a time) so they do not disturb each other on a small
//! machine. No assertion is about speed except the issue's own: a modest fixed rate is
//! achieved within 2%.

mod common;

use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use common::{loadgen, loadgen_ok, read_report, Env, Router};
use shardmap::{Key, KeyType, ShardMap, Table};

const ROWS: usize = 2000;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shared 4-shard cluster, prepared once; the outputs of the first and second prepare.
struct Shared {
    env: Env,
    first: String,
    second: String,
}

fn shared() -> &'static Shared {
    static S: OnceLock<Shared> = OnceLock::new();
    S.get_or_init(|| {
        let env = Env::start(4, 2);
        let map = env.map_file.to_string_lossy().into_owned();
        let rows = ROWS.to_string();
        let args = [
            "prepare",
            "--shardmap",
            &map,
            "--rows-per-shard",
            &rows,
            "--quiet",
        ];
        let (_, first) = loadgen_ok(&args);
        let (_, second) = loadgen_ok(&args);
        Shared { env, first, second }
    })
}

/// Waits until a connection other than ours has run a statement on `kv` in each of `shards`
/// (`pg_stat_activity` keeps a backend's last statement).
/// Waits until loadgen's point selects have run on every one of `shards`: their index scans
/// counted past `before` (a statement's statistics are published within about a second of it).
/// A connection's Parse alone does not count: it runs nothing.
fn wait_until_queried(env: &Env, shards: &[usize], before: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !shards.iter().all(|&s| idx_scans(env, s) > before[s]) {
        assert!(
            Instant::now() < deadline,
            "loadgen never ran a statement on the shards"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn idx_scans(env: &Env, shard: usize) -> u64 {
    env.on_shard(
        shard,
        "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'kv'",
    )
    .trim()
    .parse()
    .unwrap_or(0)
}

#[test]
fn prepare_loads_exactly_n_rows_per_shard_and_a_rerun_is_a_no_op() {
    let _g = serial();
    let s = shared();
    assert!(
        s.first.contains(&format!("loaded {}", 4 * ROWS)),
        "{}",
        s.first
    );
    assert!(s.second.contains("nothing to do"), "{}", s.second);
    let keys = loadgen::keys::ShardKeys::assign(&s.env.map, ROWS).expect("keys");
    for shard in 0..4 {
        // Checked on each shard directly: the count, and that every row belongs there.
        assert_eq!(
            s.env.on_shard(shard, "SELECT count(*) FROM kv"),
            ROWS.to_string()
        );
        let ids: Vec<i64> = s
            .env
            .on_shard(shard, "SELECT id FROM kv ORDER BY id")
            .lines()
            .map(|l| l.trim().parse().expect("an id"))
            .collect();
        assert_eq!(ids, keys.of(shard).collect::<Vec<_>>(), "shard {shard}");
        assert!(ids
            .iter()
            .all(|&id| s.env.map.shard_for_key(&Key::Int(id)) == shard));
    }
    // A different row count for a loaded cluster is refused, not silently mixed.
    let map = s.env.map_file.to_string_lossy().into_owned();
    let out = loadgen(&[
        "prepare",
        "--shardmap",
        &map,
        "--rows-per-shard",
        "1500",
        "--quiet",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reset"));
}

#[test]
fn a_fixed_rate_is_achieved_and_every_request_is_attributed_to_its_shard() {
    let _g = serial();
    let s = shared();
    let env = &s.env;
    let before: Vec<u64> = (0..4).map(|i| idx_scans(env, i)).collect();
    let json = env.file("rate.json");
    let chart = env.file("rate.svg");
    let map = env.map_file.to_string_lossy().into_owned();
    let rows = ROWS.to_string();
    let (stdout, _) = loadgen_ok(&[
        "run",
        "--shardmap",
        &map,
        "--rows-per-shard",
        &rows,
        "--rate",
        "300",
        "--duration",
        "3s",
        "--connections",
        "4",
        "--json",
        json.to_str().expect("path"),
        "--chart",
        chart.to_str().expect("path"),
        "--quiet",
    ]);
    assert!(stdout.contains("p99.9"), "{stdout}");
    let r = read_report(&json);
    assert!(
        (r.qps - 300.0).abs() <= 6.0,
        "achieved {} qps, not 300 within 2%",
        r.qps
    );
    assert_eq!((r.counts.errors, r.counts.timeouts), (0, 0), "{stdout}");
    assert_eq!(r.target_qps, Some(300.0));
    let shard_total: u64 = r.shards.iter().map(|s| s.requests).sum();
    assert_eq!(shard_total, r.requests);
    assert_eq!(r.latency_us.count, r.counts.ok);
    let series_ok: u64 = r.series.iter().map(|p| p.counts.ok).sum();
    assert_eq!(series_ok, r.counts.ok);
    assert!(std::fs::read_to_string(&chart)
        .expect("chart")
        .contains("<svg"));
    // The servers' own count of primary-key lookups agrees with loadgen's attribution
    // (statistics are flushed when the backends exit, so wait for them a little).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let delta: Vec<u64> = (0..4).map(|i| idx_scans(env, i) - before[i]).collect();
        let ours: Vec<u64> = r.shards.iter().map(|s| s.counts.ok).collect();
        if delta == ours {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server-side lookups {delta:?}, loadgen's per-shard counts {ours:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn merged_reports_hold_exactly_the_combined_histogram() {
    let _g = serial();
    let s = shared();
    let env = &s.env;
    let map = env.map_file.to_string_lossy().into_owned();
    let rows = ROWS.to_string();
    let (a, b, m) = (
        env.file("a.json"),
        env.file("b.json"),
        env.file("merged.json"),
    );
    // Two "hosts" at the same time.
    std::thread::scope(|sc| {
        for (path, proto, label) in [(&a, "prepared", "host-a"), (&b, "extended", "host-b")] {
            let map = &map;
            let rows = &rows;
            sc.spawn(move || {
                loadgen_ok(&[
                    "run",
                    "--shardmap",
                    map,
                    "--rows-per-shard",
                    rows,
                    "--rate",
                    "150",
                    "--duration",
                    "2s",
                    "--protocol",
                    proto,
                    "--zipf",
                    "1.0",
                    "--label",
                    label,
                    "--json",
                    path.to_str().expect("path"),
                    "--quiet",
                ])
            });
        }
    });
    let (stdout, _) = loadgen_ok(&[
        "merge",
        a.to_str().expect("path"),
        b.to_str().expect("path"),
        "--json",
        m.to_str().expect("path"),
        "--chart",
        env.file("merged.svg").to_str().expect("path"),
    ]);
    assert!(stdout.contains("2 hosts"), "{stdout}");
    assert!(
        stdout.contains("per host") && stdout.contains("host-b"),
        "{stdout}"
    );
    let (ra, rb, rm) = (read_report(&a), read_report(&b), read_report(&m));
    let (ra_raw, rb_raw, rm_raw) = (
        ra.raw().expect("a"),
        rb.raw().expect("b"),
        rm.raw().expect("merged"),
    );
    let (ta, sa) = (ra_raw.totals, ra_raw.series);
    let (tb, sb) = (rb_raw.totals, rb_raw.series);
    let (tm, sm) = (rm_raw.totals, rm_raw.series);
    let mut combined = ta.hist.clone();
    combined.add(&tb.hist).expect("add");
    assert_eq!(tm.hist, combined);
    assert_eq!(tm.hist.len(), ta.hist.len() + tb.hist.len());
    for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
        assert_eq!(tm.hist.value_at_quantile(q), combined.value_at_quantile(q));
    }
    assert_eq!(rm.latency_us.p99, combined.value_at_quantile(0.99));
    assert_eq!(rm.counts.ok, ra.counts.ok + rb.counts.ok);
    for i in 0..4 {
        assert_eq!(
            rm.shards[i].counts.ok,
            ra.shards[i].counts.ok + rb.shards[i].counts.ok
        );
    }
    assert_eq!(rm.target_qps, Some(300.0));
    // Each host keeps its own figures in the merged report.
    let labels: Vec<&str> = rm.hosts.iter().map(|h| h.label()).collect();
    assert_eq!(labels, ["host-a", "host-b"]);
    assert_eq!(rm.hosts[1].latency_us, rb.latency_us);
    assert_eq!(rm.hosts[0].ok, ra.counts.ok);
    // Per-shard latency merges exactly too.
    for i in 0..4 {
        let h = |r: &loadgen::report::Report| {
            loadgen::stats::decode_shard(r.shards[i].histogram.as_deref().expect("format 2"))
                .expect("decode")
        };
        let mut both = h(&ra);
        both.add(h(&rb)).expect("add");
        assert_eq!(h(&rm), both, "shard {i}");
    }
    // Every second of both hosts lands in the merged series.
    let per_second =
        |s: &[loadgen::report::SeriesPoint]| s.iter().map(|p| p.totals.hist.len()).sum::<u64>();
    assert_eq!(per_second(&sm), per_second(&sa) + per_second(&sb));
}

#[test]
fn through_a_real_router() {
    let _g = serial();
    let s = shared();
    let env = &s.env;
    let router = Router::start(&env.map);
    let url = router.url();
    let map = env.map_file.to_string_lossy().into_owned();
    let rows = ROWS.to_string();
    // Prepare through the router: the shards were loaded directly, and the router's
    // per-shard counts agree, so there is nothing to do.
    let (_, err) = loadgen_ok(&[
        "prepare",
        "--target",
        &url,
        "--shardmap",
        &map,
        "--rows-per-shard",
        &rows,
        "--quiet",
    ]);
    assert!(
        err.contains("nothing to do"),
        "{err}\n{}",
        router.log_text()
    );
    let json = env.file("router.json");
    let (stdout, _) = loadgen_ok(&[
        "run",
        "--target",
        &url,
        "--shardmap",
        &map,
        "--rows-per-shard",
        &rows,
        "--rate-per-shard",
        "50",
        "--duration",
        "2s",
        "--connections",
        "3",
        "--pipeline",
        "2",
        "--protocol",
        "simple",
        "--mix",
        "read=80,update=10,insert=10",
        "--json",
        json.to_str().expect("path"),
        "--quiet",
    ]);
    let r = read_report(&json);
    assert_eq!(
        (r.counts.errors, r.counts.timeouts),
        (0, 0),
        "{stdout}\n{}",
        router.log_text()
    );
    assert_eq!(r.settings.mode, "router");
    assert_eq!(r.target_qps, Some(200.0));
    // Every block of 4 consecutive requests of the run visits each shard once: each got its
    // share within two (a partial block at each end of the window).
    let per: Vec<u64> = r.shards.iter().map(|s| s.requests).collect();
    let (lo, hi) = (
        per.iter().min().copied().unwrap_or(0),
        per.iter().max().copied().unwrap_or(0),
    );
    assert!(hi - lo <= 2, "{per:?}");
    // One router, and it carried everything.
    assert_eq!(r.routers.len(), 1, "{:?}", r.routers);
    assert_eq!(r.routers[0].counts, r.counts);
    assert!(!r.routers[0].target.contains(common::PASSWORD));
    assert_eq!(per.iter().sum::<u64>(), r.requests);
    assert!(
        r.ops.contains_key("insert") && r.ops.contains_key("update"),
        "{:?}",
        r.ops
    );
    // Inserted keys live above the prepared range and on the shard the map says.
    for shard in 0..4 {
        let ids = env.on_shard(shard, "SELECT id FROM kv WHERE id >= 1099511627776");
        for id in ids.lines().filter_map(|l| l.trim().parse::<i64>().ok()) {
            assert_eq!(env.map.shard_for_key(&Key::Int(id)), shard);
        }
    }
}

/// The same workload straight at the shards and through a router reached by two addresses
/// (two "routers" as far as loadgen can tell), then `compare`: its figures are exactly those
/// of the two reports, per router the shares add up, and its chart is drawn.
#[test]
fn compare_of_direct_and_through_the_router_matches_both_reports() {
    let _g = serial();
    let s = shared();
    let env = &s.env;
    let router = Router::start(&env.map);
    let url = router.url();
    let other = url.replace("127.0.0.1", "localhost");
    let map = env.map_file.to_string_lossy().into_owned();
    let rows = ROWS.to_string();
    let (direct, routed) = (env.file("cmp-direct.json"), env.file("cmp-router.json"));
    let run = |json: &Path, targets: &[&str]| {
        let mut args = vec![
            "run",
            "--shardmap",
            &map,
            "--rows-per-shard",
            &rows,
            "--rate-per-shard",
            "60",
            "--duration",
            "2s",
            "--connections",
            "4",
            "--json",
            json.to_str().expect("path"),
            "--quiet",
        ];
        for t in targets {
            args.extend(["--target", t]);
        }
        loadgen_ok(&args);
        read_report(json)
    };
    let before = run(&direct, &[]);
    let after = run(&routed, &[&url, &other]);
    assert_eq!(
        (after.counts.errors, after.counts.timeouts),
        (0, 0),
        "{}",
        router.log_text()
    );

    // Per router: both addresses carried half the connections, and the shares add up.
    assert_eq!(after.routers.len(), 2, "{:?}", after.routers);
    let ok: u64 = after.routers.iter().map(|r| r.counts.ok).sum();
    assert_eq!(ok, after.counts.ok);
    assert!(after.routers.iter().all(|r| r.counts.ok > 0));
    assert!(before.routers.is_empty());

    let cmp_json = env.file("cmp.json");
    let svg = env.file("cmp.svg");
    let (table, _) = loadgen_ok(&[
        "compare",
        direct.to_str().expect("path"),
        routed.to_str().expect("path"),
        "--json",
        cmp_json.to_str().expect("path"),
        "--chart",
        svg.to_str().expect("path"),
    ]);
    let cmp: loadgen::compare::Comparison =
        serde_json::from_str(&std::fs::read_to_string(&cmp_json).expect("read the comparison"))
            .expect("parse the comparison");
    let row = |m: &str| {
        cmp.row(m)
            .unwrap_or_else(|| panic!("no row {m}: {table}"))
            .clone()
    };
    let ms = |us: u64| us as f64 / 1000.0;
    assert_eq!(row("throughput").before, Some(before.qps));
    assert_eq!(row("throughput").after, Some(after.qps));
    for (metric, b, a) in [
        ("p50", before.latency_us.p50, after.latency_us.p50),
        ("p90", before.latency_us.p90, after.latency_us.p90),
        ("p95", before.latency_us.p95, after.latency_us.p95),
        ("p99", before.latency_us.p99, after.latency_us.p99),
        ("p99.9", before.latency_us.p999, after.latency_us.p999),
        ("max", before.latency_us.max, after.latency_us.max),
    ] {
        let r = row(metric);
        assert_eq!((r.before, r.after), (Some(ms(b)), Some(ms(a))), "{metric}");
        // (serde_json may round a float's last bit on the way back.)
        let ratio = r.ratio.unwrap_or(f64::NAN);
        assert!((ratio - ms(a) / ms(b)).abs() < 1e-9, "{metric}: {ratio}");
    }
    // Floats computed on both sides of a JSON round trip: equal to the last bits, not bitwise.
    let close = |got: Option<f64>, want: f64| {
        got.is_some_and(|g| (g - want).abs() <= 1e-9 * want.abs().max(1.0))
    };
    let mean = row("mean").before;
    assert!(
        close(mean, before.latency_us.mean / 1000.0),
        "mean {mean:?} vs {}",
        before.latency_us.mean
    );
    assert!(close(row("errors").after, after.errors_per_million));
    assert!(close(row("timeouts").before, before.timeouts_per_million));
    // Every shard, once, with each report's own per-shard figures.
    assert_eq!(cmp.shards.len(), 4);
    for sr in &cmp.shards {
        let (b, a) = (&before.shards[sr.index], &after.shards[sr.index]);
        assert_eq!(sr.before.qps, b.qps);
        assert_eq!(sr.after.qps, a.qps);
        assert_eq!(sr.before.p99_us, b.latency_us.map(|l| l.p99));
        assert_eq!(sr.after.p99_us, a.latency_us.map(|l| l.p99));
        assert!(sr.p99_ratio.is_some());
    }
    // Worst first (no shard failed, so by p99 ratio).
    let ratios: Vec<f64> = cmp.shards.iter().filter_map(|s| s.p99_ratio).collect();
    assert_eq!(ratios.len(), 4);
    assert!(ratios.windows(2).all(|w| w[0] >= w[1]), "{ratios:?}");
    assert!(
        table.contains("p99.9 (ms)") && table.contains("per shard, worst first"),
        "{table}"
    );
    let svg_text = std::fs::read_to_string(&svg).expect("read the chart");
    assert!(svg_text.contains("latency by percentile") && svg_text.contains("99%"));
}

#[test]
fn stopped_servers_show_up_as_errors_and_timeouts_not_a_hang() {
    let _g = serial();
    let mut env = Env::start(4, 2);
    let map = env.map_file.to_string_lossy().into_owned();
    loadgen_ok(&[
        "prepare",
        "--shardmap",
        &map,
        "--rows-per-shard",
        "300",
        "--quiet",
    ]);
    let json = env.file("stop.json");
    let json_arg = json.to_str().expect("path").to_string();
    let scans: Vec<u64> = (0..4).map(|i| idx_scans(&env, i)).collect();
    let started = Instant::now();
    let run = std::thread::spawn(move || {
        loadgen(&[
            "run",
            "--shardmap",
            &map,
            "--rows-per-shard",
            "300",
            "--rate",
            "400",
            "--duration",
            "4s",
            "--timeout",
            "500ms",
            "--json",
            &json_arg,
            "--quiet",
        ])
    });
    // Once each server has run loadgen's statements, server 0 freezes (SIGSTOP: connections
    // hang) and server 1 shuts down (connections fail).
    wait_until_queried(&env, &[0, 1, 2, 3], &scans);
    let frozen = common::process_tree(env.cluster.servers()[0].pid().expect("server 0 pid"));
    common::signal_all(&frozen, libc::SIGSTOP);
    env.cluster.servers_mut()[1].stop().expect("stop server 1");
    let out = run.join().expect("the run thread");
    let elapsed = started.elapsed();
    common::signal_all(&frozen, libc::SIGCONT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Not a hang: 4 s of load plus at most one timeout to drain (generous slack: shared machine).
    assert!(
        elapsed < Duration::from_secs(20),
        "the run took {elapsed:?}"
    );
    let r = read_report(Path::new(&json));
    assert!(r.counts.ok > 0, "nothing succeeded before the stop");
    assert!(r.counts.errors > 0, "no errors: {:?}", r.errors_by_sqlstate);
    assert!(r.counts.timeouts > 0, "no timeouts");
    // Shards 1 and 3 live on the stopped server 1, shards 0 and 2 on the frozen server 0.
    assert!(
        r.shards[1].counts.errors > 0 && r.shards[3].counts.errors > 0,
        "{:?}",
        r.shards
    );
    assert!(
        r.shards[0].counts.timeouts > 0 && r.shards[2].counts.timeouts > 0,
        "{:?}",
        r.shards
    );
    let codes: Vec<&String> = r.errors_by_sqlstate.keys().collect();
    assert!(codes.iter().all(|c| c.len() == 5), "{codes:?}");
}

/// Twenty reloads (SIGHUP) under steady load through the router, changing the pool size each
/// time, one of them (the last, or the one due after 3 s) also moving shard 0's range to another
/// server that holds the same rows: not one statement fails or times out, and after the move the
/// range is served there.
#[test]
fn reloads_under_load_fail_no_statement() {
    let _g = serial();
    // A cluster of its own: the load inserts rows and the test moves a range, which the
    // shared cluster's row-count checks must not see.
    let env = &Env::start(4, 2);
    loadgen_ok(&[
        "prepare",
        "--shardmap",
        env.map_file.to_str().expect("path"),
        "--rows-per-shard",
        &ROWS.to_string(),
        "--quiet",
    ]);
    // The new home of shard 0: a database on the other server, loaded with the same rows by
    // loadgen's own (deterministic) prepare against a map that points shard 0 there.
    let home = env.cluster.server_of(0).expect("server of shard 0").port();
    let other = env
        .cluster
        .servers()
        .iter()
        .find(|s| s.port() != home)
        .expect("a second server");
    other
        .create_databases(&["moved_000".to_string()])
        .expect("create the new home");
    other.psql("moved_000", common::SCHEMA).expect("schema");
    let mut urls = env.cluster.shard_urls();
    urls[0] = other.url("moved_000");
    let moved_map = ShardMap::even_split(&urls, vec![Table::new("kv", "id", KeyType::BigInt)])
        .expect("the moved map")
        .with_version(env.map.version() + 1);
    let moved_file = env.file("moved-shardmap.toml");
    std::fs::write(&moved_file, moved_map.to_toml()).expect("write the moved map");
    let rows = ROWS.to_string();
    loadgen_ok(&[
        "prepare",
        "--shardmap",
        moved_file.to_str().expect("path"),
        "--rows-per-shard",
        &rows,
        "--quiet",
    ]);
    let scans_at_new_home = || {
        other
            .psql(
                "moved_000",
                "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'kv'",
            )
            .expect("stats")
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    let router = Router::start(&env.map);
    let url = router.url();
    let map = env.map_file.to_string_lossy().into_owned();
    let rows = ROWS.to_string();
    let json = env.file("reloads.json");
    let json_arg = json.to_str().expect("path").to_string();
    let run = std::thread::spawn(move || {
        loadgen(&[
            "run",
            "--target",
            &url,
            "--shardmap",
            &map,
            "--rows-per-shard",
            &rows,
            "--rate-per-shard",
            "100",
            "--duration",
            "8s",
            "--connections",
            "4",
            "--mix",
            "read=80,update=10,insert=10",
            "--json",
            &json_arg,
            "--quiet",
        ])
    });
    let config = router.config_path();
    let text = std::fs::read_to_string(&config).expect("router.toml");
    let mut scans_before_move = 0;
    let mut moved = false;
    let started = Instant::now();
    for i in 0..20 {
        let size = if i % 2 == 0 { 3 } else { 8 };
        std::fs::write(
            &config,
            text.replace("max_size = 8", &format!("max_size = {size}")),
        )
        .expect("write router.toml");
        // The move comes with the last reload, or earlier on a slow machine: it must land
        // while the load still runs (the run lasts 8 s), or nothing could reach the new home.
        if !moved && (i == 19 || started.elapsed() > Duration::from_secs(3)) {
            assert!(!run.is_finished(), "the load ended before the move");
            scans_before_move = scans_at_new_home();
            std::fs::write(router.shardmap_path(), moved_map.to_toml()).expect("move shard 0");
            moved = true;
        }
        router.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(20);
        while router.log_text().matches("reloaded: shard map").count() < i + 1 {
            assert!(
                Instant::now() < deadline,
                "reload {i} not logged:\n{}",
                router.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    let out = run.join().expect("the run thread");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = read_report(Path::new(&json));
    assert!(r.counts.ok > 1000, "{:?}", r.counts);
    assert_eq!(
        (r.counts.errors, r.counts.timeouts),
        (0, 0),
        "{:?}\n{}",
        r.errors_by_sqlstate,
        router.log_text()
    );
    assert!(!router.log_text().contains("reload refused"));
    assert!(router.log_text().contains(&format!(
        "shard map version {} -> {}",
        env.map.version(),
        moved_map.version()
    )));
    // Postgres publishes table statistics within a second or so of a statement.
    let deadline = Instant::now() + Duration::from_secs(20);
    while scans_at_new_home() <= scans_before_move {
        assert!(
            Instant::now() < deadline,
            "no statement reached the new home of shard 0"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
