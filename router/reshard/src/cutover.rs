//! `reshard cutover`: the switch from the source shard to its two halves, with nothing lost
//! and no statement failed.
//!
//! 1. PAUSE on every router: the new ranges first (no shard has them yet; the pause waits for
//!    the reload that brings them), then the source's range; PAUSE returns once the router's
//!    transactions on the shard have ended, and new statements for it are held.
//! 2. The source is quiet: no client transaction open on it (whoever sent it).
//! 3. The fence: row triggers on the source refuse writes of moved rows from now on (a router
//!    that missed the switch gets 25006 instead of writing where nobody reads).
//! 4. Sequences set on the targets as on the source; a marker row written on the source and
//!    awaited on every target: everything before it has been applied there.
//! 5. Verify (counts and checksums, exact now: nothing moves).
//! 6. The new map written to every `--shardmap` file (and `--publish-command` run), RELOAD on
//!    every router, each checked to show the new ranges; last, a row on the source records
//!    that the split is cut over (`cleanup` reads it).
//! 7. RESUME on every router, the new ranges first: the held statements are routed again, with
//!    the new map.
//!
//! A failure or the `--max-pause` bound passed before step 7 rolls everything back: the old
//! map restored and reloaded where it was replaced, the fence dropped, every router resumed.
//! The source is still complete, so nothing is lost; held statements run there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use shardmap::ShardMap;

use super::copy::source_tables;
use super::db::{connect, connect_admin, Db};
use super::plan::{Plan, MARKER};
use super::status::{compare, part_status, print_diffs};
use shardmap::sql::quote_literal;

/// What `cutover` is told.
pub struct Cutover<'a> {
    pub plan: &'a Plan,
    /// The routers' admin consoles.
    pub routers: &'a [String],
    /// The shard map files the routers read (rewritten in place, atomically).
    pub shardmaps: &'a [PathBuf],
    /// Run after the new map is written (and after the old one is restored on a rollback),
    /// e.g. to copy it to the routers' hosts; `SHARDGATE_SHARDMAP` names the file.
    pub publish_command: Option<&'a str>,
    pub max_pause: Duration,
    pub verify: bool,
}

/// How long the pause lasted and what took it.
#[derive(Debug)]
pub struct Report {
    pub paused: Duration,
    pub steps: Vec<(&'static str, Duration)>,
}

/// What has been done so far, for the rollback.
#[derive(Default)]
struct Done {
    paused: Vec<(usize, String)>,
    fenced: bool,
    map_written: bool,
}

fn elapsed_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Sends one admin command to every router at once; the first error, if any.
async fn on_every_router(
    routers: &[Db],
    command: &str,
    budget: Duration,
) -> Vec<Result<(), String>> {
    join_all(routers.iter().map(|r| async move {
        match tokio::time::timeout(budget, r.client.simple_query(command)).await {
            Err(_) => Err(format!("{}: {command} took longer than {budget:?}", r.name)),
            Ok(Err(e)) => Err(format!(
                "{}: {command}: {}",
                r.name,
                super::db::describe(&e)
            )),
            Ok(Ok(_)) => Ok(()),
        }
    }))
    .await
}

/// `fut`, unless it takes longer than `budget` (a hung connection must not outlast the pause).
async fn within<T>(
    budget: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(budget.max(Duration::from_millis(1)), fut)
        .await
        .map_err(|_| format!("{what} took the pause past --max-pause"))?
}

/// Every router must hold paused statements longer than the cut-over may pause: past its
/// `[pool] pause_timeout_ms` they fail with 57P03, which is what the pause is there to avoid.
async fn check_pause_timeouts(routers: &[Db], max_pause: Duration) -> Result<(), String> {
    for r in routers {
        let rows = r.rows("SHOW CONFIG").await?;
        let timeout = rows
            .iter()
            .find(|row| row.first().cloned().flatten().as_deref() == Some("pool.pause_timeout_ms"))
            .and_then(|row| row.get(1).cloned().flatten())
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| format!("{}: SHOW CONFIG has no pool.pause_timeout_ms", r.name))?;
        if max_pause >= timeout {
            return Err(format!(
                "{}: its [pool] pause_timeout_ms is {} ms, not more than --max-pause {max_pause:?}: statements held by the pause would fail before it ends; give a shorter --max-pause or raise pause_timeout_ms",
                r.name,
                timeout.as_millis()
            ));
        }
    }
    Ok(())
}

/// Reads the map every file holds; they must all hold the same one.
fn current_map(files: &[PathBuf]) -> Result<(ShardMap, String), String> {
    let first = files
        .first()
        .ok_or("give the routers' shard map file with --shardmap")?;
    let text = std::fs::read_to_string(first).map_err(|e| format!("{}: {e}", first.display()))?;
    let map = shardmap::parse(&text, &first.display().to_string()).map_err(|e| e.to_string())?;
    for f in &files[1..] {
        let other = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let other = shardmap::parse(&other, &f.display().to_string()).map_err(|e| e.to_string())?;
        if other.to_toml() != map.to_toml() {
            return Err(format!(
                "{} and {} hold different shard maps: every router must run the same map before a cut-over",
                first.display(),
                f.display()
            ));
        }
    }
    Ok((map, text))
}

/// Writes `text` to `path` atomically (a temporary file renamed over it), through a symlink
/// to the file it names, with the file's own permissions (a map holds passwords).
fn write_atomically(path: &Path, text: &str) -> Result<(), String> {
    let path = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = std::fs::metadata(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .permissions();
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::set_permissions(&tmp, mode).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
}

fn publish(c: &Cutover<'_>, text: &str) -> Result<(), String> {
    for f in c.shardmaps {
        write_atomically(f, text)?;
    }
    if let Some(cmd) = c.publish_command {
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .env("SHARDGATE_SHARDMAP", &c.shardmaps[0])
            .status()
            .map_err(|e| format!("--publish-command could not run: {e}"))?;
        if !status.success() {
            return Err(format!("--publish-command failed ({status})"));
        }
    }
    Ok(())
}

/// `reshard cutover`.
pub async fn cutover(c: &Cutover<'_>) -> Result<Report, String> {
    let plan = c.plan;
    let (old_map, old_text) = current_map(c.shardmaps)?;
    let new_map = plan.new_map(&old_map)?;
    let new_text = new_map.to_toml();
    let source = connect(&plan.source, "the source").await?;
    for (i, part) in plan.moving() {
        let s = part_status(plan, &source, i, false).await?;
        if !s.ready {
            return Err(format!(
                "{} is not ready to cut over (every table copied and the slot active): see `shardgate reshard status`",
                part.range
            ));
        }
    }
    let targets: Vec<Db> = join_all(
        plan.moving()
            .map(|(_, p)| connect(&p.primary, format!("target {}", p.range))),
    )
    .await
    .into_iter()
    .collect::<Result<_, _>>()?;
    if c.routers.is_empty() {
        return Err("give every router's admin console with --router (postgres://ADMIN:PASSWORD@HOST:PORT/shardgate)".into());
    }
    let routers: Vec<Db> = join_all(c.routers.iter().map(|u| connect_admin(u)))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    check_pause_timeouts(&routers, c.max_pause).await?;
    let tables = source_tables(&source).await?;
    for f in c.shardmaps {
        let backup = f.with_extension(format!("toml.before-split-{}", plan.tag()));
        std::fs::copy(f, &backup).map_err(|e| format!("{}: {e}", backup.display()))?;
    }

    let start = Instant::now();
    let mut steps = Vec::new();
    let mut done = Done::default();
    let result = switch(
        c, &source, &targets, &routers, &tables, &new_text, start, &mut steps, &mut done,
    )
    .await;
    match result {
        Ok(()) => {
            let paused = start.elapsed();
            println!(
                "cut over: shard {} is now {} and {}; paused {}",
                plan.range,
                plan.parts[0].range,
                plan.parts[1].range,
                elapsed_ms(paused)
            );
            Ok(Report { paused, steps })
        }
        Err(why) => {
            eprintln!("cut-over failed: {why}\nrolling back");
            let rollback = roll_back(c, &source, &routers, &tables, &old_text, &done).await;
            match rollback {
                Ok(()) => Err(format!(
                    "{why}\nrolled back: the routers run the old map (version {}), the source serves shard {} as before; paused {}",
                    old_map.version(),
                    plan.range,
                    elapsed_ms(start.elapsed())
                )),
                Err(more) => Err(format!("{why}\nTHE ROLLBACK DID NOT COMPLETE: {more}")),
            }
        }
    }
}

/// The pause's clock: what is left of `--max-pause`, and each step's time for the report.
struct Clock<'s> {
    start: Instant,
    max_pause: Duration,
    mark: Instant,
    steps: &'s mut Vec<(&'static str, Duration)>,
}

impl Clock<'_> {
    fn left(&self) -> Duration {
        self.max_pause.saturating_sub(self.start.elapsed())
    }

    /// Prints and records the step just done, timed from the end of the one before.
    fn step(&mut self, name: &'static str) {
        let d = self.mark.elapsed();
        println!("  {name:<40} {}", elapsed_ms(d));
        self.steps.push((name, d));
        self.mark = Instant::now();
    }

    fn over(&self, what: &str) -> Result<(), String> {
        if self.start.elapsed() > self.max_pause {
            Err(format!(
                "{what} took the pause past --max-pause {:?}",
                self.max_pause
            ))
        } else {
            Ok(())
        }
    }
}

/// The steps of the cut-over in docs/resharding.md, in its order; an error from any of them
/// before step 7 is rolled back by the caller.
#[allow(clippy::too_many_arguments)]
async fn switch(
    c: &Cutover<'_>,
    source: &Db,
    targets: &[Db],
    routers: &[Db],
    tables: &[super::plan::CatalogTable],
    new_text: &str,
    start: Instant,
    steps: &mut Vec<(&'static str, Duration)>,
    done: &mut Done,
) -> Result<(), String> {
    let plan = c.plan;
    let mut clock = Clock {
        start,
        max_pause: c.max_pause,
        mark: Instant::now(),
        steps,
    };
    let ranges = pause_order(plan);
    pause_every_router(routers, &ranges, &mut clock, done).await?;
    wait_until_source_quiet(source, &mut clock).await?;
    put_up_fence(plan, source, tables, &mut clock, done).await?;
    catch_up(plan, source, targets, &mut clock).await?;
    if c.verify {
        verify_exactly(plan, &mut clock).await?;
    }
    switch_to_new_map(c, source, routers, new_text, &mut clock, done).await?;
    resume_every_router(routers, &ranges, &mut clock, done).await;
    Ok(())
}

/// The new ranges first: no shard has them yet, so a router holds their statements until the
/// reload that brings them; then the source's range.
fn pause_order(plan: &Plan) -> [String; 3] {
    [
        plan.parts[0].range.to_string(),
        plan.parts[1].range.to_string(),
        plan.range.to_string(),
    ]
}

/// Step 1 of the cut-over (docs/resharding.md): pause on every router.
async fn pause_every_router(
    routers: &[Db],
    ranges: &[String; 3],
    clock: &mut Clock<'_>,
    done: &mut Done,
) -> Result<(), String> {
    for range in ranges {
        // Recorded before it is sent: a PAUSE that times out may still have paused.
        done.paused
            .extend((0..routers.len()).map(|i| (i, range.clone())));
        let results = on_every_router(
            routers,
            &format!("PAUSE {}", quote_literal(range)),
            clock.left(),
        )
        .await;
        for r in results {
            r?;
        }
    }
    clock.step("paused on every router");
    clock.over("pausing")
}

/// Step 2 of the cut-over (docs/resharding.md): the source is quiet, no client transaction
/// open on it from anyone (a router that was not paused, or a client of the source itself).
async fn wait_until_source_quiet(source: &Db, clock: &mut Clock<'_>) -> Result<(), String> {
    let busy = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                AND pid <> pg_backend_pid() AND backend_type = 'client backend' \
                AND xact_start IS NOT NULL";
    loop {
        let n = source.value(busy).await?.unwrap_or_default();
        if n == "0" {
            break;
        }
        if clock.start.elapsed() > clock.max_pause {
            return Err(format!(
                "{n} transactions still open on the source at --max-pause {:?}",
                clock.max_pause
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clock.step("no transaction open on the source");
    Ok(())
}

/// Step 3 of the cut-over (docs/resharding.md): the fence, row triggers on the source that
/// refuse writes of moved rows; its locks are waited for only inside the time left.
async fn put_up_fence(
    plan: &Plan,
    source: &Db,
    tables: &[super::plan::CatalogTable],
    clock: &mut Clock<'_>,
    done: &mut Done,
) -> Result<(), String> {
    let fence = plan.fence_sql(tables);
    let lock_timeout = clock.left().as_millis().max(1);
    // Set before it is sent: a fence whose answer never came may still be up.
    done.fenced = true;
    within(
        clock.left(),
        "putting up the fence",
        source.exec(&format!(
            "BEGIN; SET LOCAL lock_timeout = {lock_timeout}; {}; COMMIT",
            fence.join(";\n")
        )),
    )
    .await?;
    clock.step("fence up on the source");
    Ok(())
}

/// Step 4 of the cut-over (docs/resharding.md): catch-up, the sequences set on the targets to
/// the source's values, then a marker row written on the source and awaited on every target.
async fn catch_up(
    plan: &Plan,
    source: &Db,
    targets: &[Db],
    clock: &mut Clock<'_>,
) -> Result<(), String> {
    let sequences = source
        .rows("SELECT format('%I.%I', schemaname, sequencename), last_value FROM pg_sequences WHERE last_value IS NOT NULL")
        .await?;
    for target in targets {
        for s in &sequences {
            if let (Some(name), Some(value)) = (&s[0], &s[1]) {
                target
                    .exec(&format!("SELECT setval({}, {value})", quote_literal(name)))
                    .await?;
            }
        }
    }
    let token = format!(
        "cutover {} {}",
        plan.range,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    // Flushed at once even where synchronous_commit is off: the stream sends flushed WAL.
    source
        .exec(&format!(
            "BEGIN; SET LOCAL synchronous_commit = on; INSERT INTO {MARKER} (token) VALUES ({}); COMMIT",
            quote_literal(&token)
        ))
        .await?;
    let seen = format!(
        "SELECT count(*) FROM {MARKER} WHERE token = {}",
        quote_literal(&token)
    );
    for target in targets {
        while within(clock.left(), "waiting for the marker", target.value(&seen))
            .await?
            .as_deref()
            != Some("1")
        {
            clock.over(&format!(
                "waiting for {} to apply the source's changes",
                target.name
            ))?;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    clock.step("targets caught up");
    Ok(())
}

/// Step 5 of the cut-over (docs/resharding.md): verify, counts and checksums, exact now that
/// nothing moves.
async fn verify_exactly(plan: &Plan, clock: &mut Clock<'_>) -> Result<(), String> {
    let diffs = within(clock.left(), "verifying", compare(plan)).await?;
    if !diffs.iter().all(|d| d.matches()) {
        print_diffs(&diffs);
        return Err("the targets do not match the source".into());
    }
    clock.step("verified (counts and checksums)");
    clock.over("verifying")
}

/// Step 6 of the cut-over (docs/resharding.md): the new map written to every file, RELOAD on
/// every router and each checked to show the new ranges; last, the source records that the
/// split is cut over.
async fn switch_to_new_map(
    c: &Cutover<'_>,
    source: &Db,
    routers: &[Db],
    new_text: &str,
    clock: &mut Clock<'_>,
    done: &mut Done,
) -> Result<(), String> {
    let plan = c.plan;
    // Set before the first file is written: a publish that fails half-way is undone too.
    done.map_written = true;
    publish(c, new_text)?;
    for r in on_every_router(routers, "RELOAD", clock.left().max(Duration::from_secs(1))).await {
        r?;
    }
    for r in routers {
        let shards = within(Duration::from_secs(5), "SHOW SHARDS", r.rows("SHOW SHARDS")).await?;
        for part in &plan.parts {
            let range = part.range.to_string();
            if !shards
                .iter()
                .any(|row| row.get(1).cloned().flatten().as_deref() == Some(range.as_str()))
            {
                return Err(format!(
                    "{} reloaded but does not show shard {range}: does it read one of the --shardmap files?",
                    r.name
                ));
            }
        }
    }
    // From here the split counts as cut over (`cleanup` reads this row).
    source
        .exec(&format!(
            "INSERT INTO {MARKER} (token) VALUES ({}) ON CONFLICT (token) DO NOTHING",
            quote_literal(&plan.done_token())
        ))
        .await?;
    clock.step("new map on every router");
    Ok(())
}

/// Step 7 of the cut-over (docs/resharding.md): resume on every router, the new ranges first,
/// then the source's (its held statements are routed again, with the new map).
async fn resume_every_router(
    routers: &[Db],
    ranges: &[String; 3],
    clock: &mut Clock<'_>,
    done: &mut Done,
) {
    for range in ranges {
        let command = format!("RESUME {}", quote_literal(range));
        let mut failed = Vec::new();
        for (i, r) in on_every_router(routers, &command, Duration::from_secs(5))
            .await
            .into_iter()
            .enumerate()
        {
            if let Err(e) = r {
                failed.push((i, e));
            }
        }
        // Past the switch there is no going back: retry what failed, then say so loudly.
        for (i, e) in failed {
            let again = routers[i].client.simple_query(&command).await;
            if again.is_err() {
                eprintln!("WARNING: {e}; run `{command}` on that router's admin console yourself");
            }
        }
    }
    done.paused.clear();
    clock.step("resumed on every router");
}

async fn roll_back(
    c: &Cutover<'_>,
    source: &Db,
    routers: &[Db],
    tables: &[super::plan::CatalogTable],
    old_text: &str,
    done: &Done,
) -> Result<(), String> {
    let mut problems = Vec::new();
    // Routers that may still run the new map: they stay paused, and the fence stays up, so
    // nothing writes on both sides.
    let mut stuck = vec![false; routers.len()];
    if done.map_written {
        if let Err(e) = publish(c, old_text) {
            problems.push(format!("restoring the old map: {e}"));
            stuck.iter_mut().for_each(|s| *s = true);
        }
        for (i, r) in on_every_router(routers, "RELOAD", Duration::from_secs(10))
            .await
            .into_iter()
            .enumerate()
        {
            if let Err(e) = r {
                problems.push(format!("{e}; it stays paused"));
                stuck[i] = true;
            }
        }
    }
    if done.fenced {
        if stuck.iter().any(|s| *s) {
            problems
                .push("the fence stays up on the source while a router may run the new map".into());
        } else {
            // A failed statement may have left the session in an aborted transaction.
            let _ = source.client.batch_execute("ROLLBACK").await;
            let unfence = c.plan.unfence_sql(tables).join(";\n");
            if let Err(e) = source.exec(&unfence).await {
                problems.push(format!("dropping the fence: {e}"));
            }
        }
    }
    for (i, range) in done.paused.iter().rev() {
        if stuck[*i] {
            continue;
        }
        let command = format!("RESUME {}", quote_literal(range));
        let resumed = tokio::time::timeout(
            Duration::from_secs(5),
            routers[*i].client.simple_query(&command),
        )
        .await;
        match resumed {
            Ok(Ok(_)) => {}
            // A new range whose PAUSE never reached the router: nothing to resume.
            Ok(Err(e)) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) => {}
            Ok(Err(e)) => problems.push(format!(
                "{}: {command}: {}",
                routers[*i].name,
                super::db::describe(&e)
            )),
            Err(_) => problems.push(format!("{}: {command}: no answer in 5 s", routers[*i].name)),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}
