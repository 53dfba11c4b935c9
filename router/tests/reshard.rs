//! `shardgate reshard` as an operator runs it, against real servers: a shard split in two
//! while clients read, update and insert through two routers, with a cut-over that one router
//! cannot follow rolled back first; then every row checked on every database, the fence on the
//! source, and no slot left. And a split abandoned after its target was killed.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{tables, Router, SCHEMA};
use shardmap::{predicate, Reference, ShardMap};
use tokio_postgres::Client;

const ADMIN: &str = "[[users]]\nname = \"ops\"\npassword = \"ops-secret\"\nadmin = true\n[pool]\nmax_size = 4\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\npause_timeout_ms = 30000\n";

/// Source shards on a server with wal_level = logical, and a router-less map over them.
fn source_cluster(shards: usize) -> (pgharness::Cluster, ShardMap) {
    let mut server = pgharness::ServerOptions::default();
    server.settings.push(("wal_level".into(), "logical".into()));
    let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
        shards,
        servers: 1,
        schema_sql: Some(pgharness::Schema::Sql(SCHEMA.into())),
        server,
        ..Default::default()
    })
    .expect("start the source cluster");
    // `settings` is a reference table: whole on every shard, copied whole to the new ones.
    let map = ShardMap::even_split(&cluster.shard_urls(), tables())
        .and_then(|m| m.with_references(vec![Reference::new("settings")]))
        .expect("shard map");
    (cluster, map)
}

/// An empty server with the target databases.
fn target_server(names: &[&str]) -> pgharness::Server {
    let server =
        pgharness::Server::start(&pgharness::ServerOptions::default()).expect("target server");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    server.create_databases(&names).expect("target databases");
    server
}

/// `shardgate reshard cutover` of `plan` through every admin console, rewriting `maps`.
fn cutover(plan: &str, admin: &[String], maps: &[&PathBuf]) -> (bool, String) {
    let mut args = vec!["cutover", "--plan", plan];
    for a in admin {
        args.extend(["--router", a.as_str()]);
    }
    for m in maps {
        args.extend(["--shardmap", path(m)]);
    }
    reshard(&args)
}

/// `shardgate reshard ARGS`: success, and everything it printed.
fn reshard(args: &[&str]) -> (bool, String) {
    let out = Command::new(common::shardgate_bin())
        .arg("reshard")
        .args(args)
        .output()
        .expect("run shardgate reshard");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("$ shardgate reshard {}\n{text}", args.join(" "));
    (out.status.success(), text)
}

fn wait_ready(plan: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (ok, _) = reshard(&["status", "--plan", plan]);
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "the split never became ready");
        std::thread::sleep(Duration::from_millis(300));
    }
}

async fn db(url: &str) -> Client {
    common::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Clients that read, update and insert through the routers, each owning its keys, so each
/// knows exactly what every one of its rows must hold.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Outcome>>,
}

#[derive(Default)]
struct Outcome {
    ops: u64,
    errors: Vec<String>,
    max: Duration,
    /// Every key the client owns and the value it last wrote.
    rows: HashMap<i64, String>,
}

const TASKS: i64 = 6;

impl Load {
    fn start(urls: &[String], keys: &[i64]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..TASKS)
            .map(|k| {
                let url = urls[k as usize % urls.len()].clone();
                let mine: HashMap<i64, String> = keys
                    .iter()
                    .filter(|key| *key % TASKS == k)
                    .map(|key| (*key, format!("initial-{key}")))
                    .collect();
                let stop = stop.clone();
                tokio::spawn(async move { drive(url, k, mine, stop).await })
            })
            .collect();
        Load { stop, tasks }
    }

    async fn finish(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Outcome::default();
        for t in self.tasks {
            let o = t.await.expect("load task");
            all.ops += o.ops;
            all.errors.extend(o.errors);
            all.max = all.max.max(o.max);
            all.rows.extend(o.rows);
        }
        all
    }
}

async fn drive(
    url: String,
    k: i64,
    mut rows: HashMap<i64, String>,
    stop: Arc<AtomicBool>,
) -> Outcome {
    let mut out = Outcome::default();
    let client = db(&url).await;
    let keys: Vec<i64> = {
        let mut v: Vec<i64> = rows.keys().copied().collect();
        v.sort();
        v
    };
    let mut next_new = 1_000_000 + k;
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = keys[(n as usize * 7919) % keys.len()];
        let started = Instant::now();
        let result = match n % 10 {
            0..=5 => client
                .query_opt("SELECT v FROM kv WHERE id = $1", &[&key])
                .await
                .map(|row| {
                    let got: Option<String> = row.map(|r| r.get(0));
                    if got.as_ref() != rows.get(&key) {
                        out.errors.push(format!(
                            "read of {key}: {got:?}, expected {:?}",
                            rows.get(&key)
                        ));
                    }
                }),
            6..=8 => {
                let v = format!("t{k}-{n}");
                let r = client
                    .execute("UPDATE kv SET v = $2 WHERE id = $1", &[&key, &v])
                    .await;
                if let Ok(1) = r {
                    rows.insert(key, v);
                } else if let Ok(count) = r {
                    out.errors
                        .push(format!("update of {key} changed {count} rows"));
                }
                r.map(|_| ())
            }
            _ => {
                let key = next_new;
                next_new += TASKS;
                let v = format!("new-{key}");
                let r = client
                    .execute("INSERT INTO kv (id, v) VALUES ($1, $2)", &[&key, &v])
                    .await;
                if r.is_ok() {
                    rows.insert(key, v);
                }
                r.map(|_| ())
            }
        };
        out.max = out.max.max(started.elapsed());
        out.ops += 1;
        if let Err(e) = result {
            out.errors
                .push(format!("{e} (SQLSTATE {})", common::sqlstate(&e)));
        }
        // Paced lightly: the point is many statements around the cut-over, not throughput.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    out.rows = rows;
    out
}

/// Every kv row of a database.
async fn kv_rows(url: &str) -> Vec<(i64, String)> {
    db(url)
        .await
        .query("SELECT id, v FROM kv", &[])
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn slots(source_url: &str) -> Vec<String> {
    db(source_url)
        .await
        .query("SELECT slot_name::text FROM pg_replication_slots", &[])
        .await
        .expect("slots")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_splits_under_load_with_nothing_lost_and_nothing_failed() {
    let (cluster, map) = source_cluster(2);
    let split = 1;
    let range = map.shards()[split].range.to_string();
    let source_url = cluster.shard_urls()[split].clone();
    // Rows on the shard to split and on the other one, and in the other sharded tables.
    let keys: Vec<i64> = (1..=1200).collect();
    for (i, url) in cluster.shard_urls().iter().enumerate() {
        let mine: Vec<String> = keys
            .iter()
            .filter(|k| map.shard_for_key(&shardmap::Key::Int(**k)) == i)
            .map(|k| format!("({k}, 'initial-{k}')"))
            .collect();
        db(url)
            .await
            .batch_execute(&format!(
                "INSERT INTO kv VALUES {}; CREATE SEQUENCE kv_seq; SELECT setval('kv_seq', 4242); \
                 INSERT INTO settings VALUES ('mode', 'split'), ('color', 'blue')",
                mine.join(", ")
            ))
            .await
            .expect("load rows");
    }
    let names: Vec<String> = (1..=300).map(|g| format!("n{g}")).collect();
    for name in &names {
        let shard = map.shard_for_key(&shardmap::Key::Text(name));
        db(&cluster.shard_urls()[shard])
            .await
            .execute("INSERT INTO names VALUES ($1, 1)", &[name])
            .await
            .expect("names row");
    }
    let targets = target_server(&["low", "high"]);
    let (low_url, high_url) = (targets.url("low"), targets.url("high"));

    let routers = [
        Router::start_with(&map, ADMIN),
        Router::start_with(&map, ADMIN),
    ];
    let admin: Vec<String> = routers
        .iter()
        .map(|r| r.url_as("ops", "ops-secret", "shardgate"))
        .collect();
    let map_files: Vec<PathBuf> = routers
        .iter()
        .map(|r| r.dir.join("shardmap.toml"))
        .collect();
    let work = routers[0].dir.join("split.toml");
    let plan = path(&work);
    // Rows with lookup values (`handles.handle`), so that the split moves lookup rows too.
    let handles: Vec<String> = (0..60).map(|i| format!("h{i}")).collect();
    let writer = db(&routers[0].url()).await;
    for h in &handles {
        writer
            .execute("INSERT INTO handles (handle, n) VALUES ($1, 1)", &[h])
            .await
            .expect("a row with a lookup value");
    }

    // Plan: checks, then the plan file. A target that is not empty is refused first.
    db(&high_url)
        .await
        .batch_execute("CREATE TABLE stray (x int)")
        .await
        .expect("stray table");
    let plan_args = [
        "plan",
        "--shardmap",
        path(&map_files[0]),
        "--range",
        &range,
        "--into",
        &low_url,
        "--into",
        &high_url,
        "--out",
        plan,
    ];
    let (ok, text) = reshard(&plan_args);
    assert!(!ok && text.contains("not empty (1 tables)"), "{text}");
    db(&high_url)
        .await
        .batch_execute("DROP TABLE stray")
        .await
        .expect("drop stray");
    let (ok, text) = reshard(&plan_args);
    assert!(ok, "{text}");

    // Start, and wait for the copy; verify while nothing writes.
    let (ok, text) = reshard(&["start", "--plan", plan]);
    assert!(ok, "{text}");
    wait_ready(plan);
    let (ok, text) = reshard(&["verify", "--plan", plan]);
    assert!(ok && text.contains("every table matches"), "{text}");

    let urls: Vec<String> = routers.iter().map(|r| r.url()).collect();
    let load = Load::start(&urls, &keys);
    tokio::time::sleep(Duration::from_millis(800)).await;

    // A cut-over one router cannot follow (its map file is not rewritten) rolls back.
    let (ok, text) = cutover(plan, &admin, &[&map_files[0]]);
    assert!(
        !ok && text.contains("does not show shard") && text.contains("rolled back"),
        "{text}"
    );
    for r in &routers {
        let shards = common::rows(
            &db(&r.url_as("ops", "ops-secret", "shardgate"))
                .await
                .simple_query("SHOW SHARDS")
                .await
                .expect("show shards"),
        );
        assert!(
            shards.iter().any(|s| s[1] == range && s[3] == "up"),
            "{shards:?}"
        );
    }
    let fence_gone = db(&source_url)
        .await
        .query_one(
            "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'sg_fence%'",
            &[],
        )
        .await
        .expect("triggers");
    assert_eq!(
        fence_gone.get::<_, i64>(0),
        0,
        "the rollback drops the fence"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The real cut-over, both maps rewritten.
    let (ok, text) = cutover(plan, &admin, &[&map_files[0], &map_files[1]]);
    assert!(ok && text.contains("cut over: shard"), "{text}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let outcome = load.finish().await;
    println!("{} statements, max latency {:?}", outcome.ops, outcome.max);
    assert!(
        outcome.errors.is_empty(),
        "{} errors: {:?}",
        outcome.errors.len(),
        &outcome.errors[..outcome.errors.len().min(10)]
    );
    assert!(
        outcome.ops > 500,
        "the load ran: {} statements",
        outcome.ops
    );

    // The new map is what both routers read, and each of its shards holds only its rows.
    let new_map = shardmap::load(&map_files[1]).expect("new map");
    assert_eq!(new_map.shards().len(), 3);
    assert_eq!(new_map.version(), map.version() + 1);
    for shard in new_map.shards() {
        let client = db(shard.primary.url()).await;
        for table in new_map.tables() {
            if table.name == "users" {
                continue;
            }
            let sql = format!(
                "SELECT count(*) FROM {} WHERE NOT ({})",
                table.name,
                predicate::predicate(table, &shard.range)
            );
            let misplaced: i64 = client.query_one(&sql, &[]).await.expect("misplaced").get(0);
            assert_eq!(misplaced, 0, "{sql} on {}", shard.primary);
        }
    }
    // Lookup rows moved with the halves of their values, and reads by the lookup column find
    // every row through the new map.
    let mut lookup_rows = 0;
    for shard in new_map.shards() {
        let client = db(shard.primary.url()).await;
        for (_, _, lt) in new_map.lookup_tables() {
            let sql = format!(
                "SELECT count(*), count(*) FILTER (WHERE NOT ({})) FROM {}",
                predicate::predicate(&lt, &shard.range),
                lt.quoted_name()
            );
            let row = client.query_one(&sql, &[]).await.expect("lookup rows");
            assert_eq!(row.get::<_, i64>(1), 0, "{sql} on {}", shard.primary);
            lookup_rows += row.get::<_, i64>(0);
        }
    }
    assert_eq!(lookup_rows, handles.len() as i64);
    let reader = db(&routers[1].url()).await;
    for h in &handles {
        let n: i32 = reader
            .query_one("SELECT n FROM handles WHERE handle = $1", &[h])
            .await
            .expect("found by its handle after the split")
            .get(0);
        assert_eq!(n, 1, "{h}");
    }
    // The source refuses writes of moved rows (a router that missed the switch).
    let moved = keys
        .iter()
        .copied()
        .find(|k| map.shard_for_key(&shardmap::Key::Int(*k)) == split)
        .expect("a moved key");
    let refused = db(&source_url)
        .await
        .execute("UPDATE kv SET v = 'stale' WHERE id = $1", &[&moved])
        .await;
    assert_eq!(
        refused.as_ref().map_err(common::sqlstate).err().as_deref(),
        Some("25006"),
        "{refused:?}"
    );
    // The sequence followed.
    let seq: i64 = db(&high_url)
        .await
        .query_one("SELECT last_value FROM kv_seq", &[])
        .await
        .expect("seq")
        .get(0);
    assert_eq!(seq, 4242);

    // A reference table's write after the cut-over reaches every new shard once (the source
    // no longer streams it on top).
    routers[0]
        .connect()
        .await
        .batch_execute("INSERT INTO settings VALUES ('after', 'cutover')")
        .await
        .expect("insert into the reference table");
    routers[1]
        .connect()
        .await
        .batch_execute("UPDATE settings SET v = 'green' WHERE k = 'color'")
        .await
        .expect("update the reference table");

    // Cleanup: the moved rows deleted from the source, no slot left.
    let (ok, text) = reshard(&["cleanup", "--plan", plan, "--delete-moved"]);
    assert!(ok, "{text}");
    for shard in new_map.shards() {
        let settings: String = db(shard.primary.url())
            .await
            .query_one(
                "SELECT string_agg(k || '=' || v, ',' ORDER BY k) FROM settings",
                &[],
            )
            .await
            .expect("settings")
            .get(0);
        assert_eq!(
            settings, "after=cutover,color=green,mode=split",
            "on {}",
            shard.primary
        );
    }
    assert_eq!(slots(&source_url).await, Vec::<String>::new());
    // Every row exactly once over all databases, with the value its client last wrote.
    let mut seen: HashMap<i64, Vec<String>> = HashMap::new();
    for url in cluster.shard_urls().iter().chain([&low_url, &high_url]) {
        for (id, v) in kv_rows(url).await {
            seen.entry(id).or_default().push(v);
        }
    }
    assert_eq!(
        seen.len(),
        outcome.rows.len(),
        "keys present vs keys written"
    );
    for (key, want) in &outcome.rows {
        assert_eq!(seen.get(key), Some(&vec![want.clone()]), "key {key}");
    }
    let names_seen: i64 = {
        let mut n = 0;
        for url in cluster.shard_urls().iter().chain([&low_url, &high_url]) {
            n += db(url)
                .await
                .query_one("SELECT count(*) FROM names", &[])
                .await
                .expect("names")
                .get::<_, i64>(0);
        }
        n
    };
    assert_eq!(names_seen, names.len() as i64, "names rows exactly once");
    // And the routers serve every key through the new map.
    let client = routers[1].connect().await;
    for (key, want) in outcome.rows.iter().take(200) {
        let got: String = client
            .query_one("SELECT v FROM kv WHERE id = $1", &[key])
            .await
            .expect("read")
            .get(0);
        assert_eq!(&got, want);
    }
    drop(targets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_abandoned_after_its_target_died_leaves_the_source_serving_and_no_slot() {
    let (cluster, map) = source_cluster(1);
    let range = map.shards()[0].range.to_string();
    let source_url = cluster.shard_urls()[0].clone();
    let keys: Vec<i64> = (1..=300).collect();
    let values: Vec<String> = keys
        .iter()
        .map(|k| format!("({k}, 'initial-{k}')"))
        .collect();
    db(&source_url)
        .await
        .batch_execute(&format!("INSERT INTO kv VALUES {}", values.join(", ")))
        .await
        .expect("rows");
    let mut targets = target_server(&["low", "high"]);
    let router = Router::start_with(&map, ADMIN);
    let work = router.dir.join("split.toml");
    let plan = path(&work);
    let map_file = router.dir.join("shardmap.toml");
    let (ok, text) = reshard(&[
        "plan",
        "--shardmap",
        path(&map_file),
        "--range",
        &range,
        "--into",
        &targets.url("low"),
        "--into",
        &targets.url("high"),
        "--out",
        plan,
    ]);
    assert!(ok, "{text}");
    let (ok, text) = reshard(&["start", "--plan", plan]);
    assert!(ok, "{text}");
    let load = Load::start(&[router.url()], &keys);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A pause the routers would not hold statements through is refused before anything pauses.
    let admin = router.url_as("ops", "ops-secret", "shardgate");
    wait_ready(plan);
    let mut long = vec!["cutover", "--plan", plan, "--router", admin.as_str()];
    long.extend(["--shardmap", path(&map_file), "--max-pause", "40s"]);
    let (ok, text) = reshard(&long);
    assert!(
        !ok && text.contains("pause_timeout_ms is 30000 ms"),
        "{text}"
    );

    targets.stop().expect("kill the targets");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A cut-over now refuses before pausing anything.
    let (ok, text) = cutover(plan, &[admin], &[&map_file]);
    assert!(!ok, "{text}");
    let (ok, text) = reshard(&["cleanup", "--plan", plan]);
    assert!(ok && text.contains("not cut over"), "{text}");
    assert_eq!(slots(&source_url).await, Vec::<String>::new());
    let publications: i64 = db(&source_url)
        .await
        .query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .expect("pubs")
        .get(0);
    assert_eq!(publications, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let outcome = load.finish().await;
    assert!(
        outcome.errors.is_empty(),
        "{:?}",
        &outcome.errors[..outcome.errors.len().min(10)]
    );
    assert!(outcome.ops > 100, "{}", outcome.ops);
    let rows = kv_rows(&source_url).await;
    assert_eq!(rows.len(), outcome.rows.len());
    let shards = shardmap::load(&map_file).expect("map");
    assert_eq!(shards.version(), map.version(), "the map is untouched");
}
