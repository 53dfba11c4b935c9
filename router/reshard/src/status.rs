//! `reshard status` (per target and table: the copy's state, rows there, the stream's lag in
//! bytes and seconds) and `reshard verify` (per table and new range: row counts and a
//! checksum on the source and on the target, like Vitess's VDiff).

use std::time::Duration;

use super::copy::source_tables;
use super::db::{connect, Db};
use super::plan::{CatalogTable, Plan};
use shardmap::sql::quote_literal;

/// Where one target's stream stands.
#[derive(Debug, Default)]
pub struct PartStatus {
    /// Per table: name, the copy's state (`pg_subscription_rel.srsubstate` in words), rows.
    pub tables: Vec<(String, String, Option<i64>)>,
    /// The slot on the source: active, and bytes of WAL it has not confirmed.
    pub slot_active: bool,
    pub lag_bytes: Option<i64>,
    pub lag_seconds: Option<f64>,
    /// Every table copied and streaming.
    pub ready: bool,
}

fn state_word(code: &str) -> &'static str {
    match code {
        "i" => "initializing",
        "d" => "copying",
        "f" => "copied",
        "s" => "synchronized",
        "r" => "ready",
        _ => "unknown",
    }
}

/// The status of part `part`'s stream (the target must be reachable).
pub async fn part_status(
    plan: &Plan,
    source: &Db,
    part: usize,
    count_rows: bool,
) -> Result<PartStatus, String> {
    let p = &plan.parts[part];
    let name = quote_literal(&plan.part_name(part));
    let target = connect(&p.primary, &format!("target {}", p.range)).await?;
    let rows = target
        .rows(&format!(
            "SELECT n.nspname, c.relname, sr.srsubstate FROM pg_subscription_rel sr \
             JOIN pg_subscription s ON s.oid = sr.srsubid JOIN pg_class c ON c.oid = sr.srrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE s.subname = {name} ORDER BY 1, 2"
        ))
        .await?;
    let mut status = PartStatus::default();
    for r in rows {
        let table = CatalogTable {
            schema: r[0].clone().unwrap_or_default(),
            name: r[1].clone().unwrap_or_default(),
        };
        let state = state_word(r[2].as_deref().unwrap_or("")).to_string();
        let count = if count_rows {
            target
                .value(&format!("SELECT count(*) FROM {}", table.sql_name()))
                .await?
                .and_then(|v| v.parse().ok())
        } else {
            None
        };
        status.tables.push((table.sql_name(), state, count));
    }
    let slot = source
        .rows(&format!(
            "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = {name}"
        ))
        .await?;
    if let Some(s) = slot.first() {
        status.slot_active = s[0].as_deref() == Some("t");
        status.lag_bytes = s[1].as_deref().and_then(|v| v.parse().ok());
    }
    status.lag_seconds = source
        .value(&format!(
            "SELECT extract(epoch FROM coalesce(replay_lag, interval '0'))::float8 FROM pg_stat_replication \
             WHERE application_name = {name}"
        ))
        .await?
        .and_then(|v| v.parse().ok());
    status.ready = !status.tables.is_empty()
        && status.slot_active
        && status.tables.iter().all(|(_, s, _)| s == "ready");
    Ok(status)
}

/// `reshard status`: prints every moving part's status; true when all are ready.
pub async fn status(plan: &Plan) -> Result<bool, String> {
    let source = connect(&plan.source, "the source").await?;
    let mut all_ready = true;
    for (i, part) in plan.moving() {
        let s = match part_status(plan, &source, i, true).await {
            Ok(s) => s,
            Err(e) => {
                println!("{} {}: {e}", part.range, plan.part_name(i));
                all_ready = false;
                continue;
            }
        };
        println!(
            "{} on {} ({}): slot {}, lag {} bytes, {} s{}",
            part.range,
            part.primary.endpoint(),
            plan.part_name(i),
            if s.slot_active { "active" } else { "INACTIVE" },
            s.lag_bytes.map_or("?".into(), |b| b.to_string()),
            s.lag_seconds.map_or("?".into(), |b| format!("{b:.3}")),
            if s.ready { ", ready" } else { "" }
        );
        if s.tables.is_empty() {
            println!("  no subscription there (not started?)");
        }
        for (table, state, rows) in &s.tables {
            println!(
                "  {table:<40} {state:<13} {} rows",
                rows.map_or("?".into(), |r| r.to_string())
            );
        }
        all_ready &= s.ready;
    }
    Ok(all_ready)
}

/// One table's comparison in one new range.
#[derive(Debug, PartialEq, Eq)]
pub struct Diff {
    pub range: String,
    pub table: String,
    pub source: (i64, String),
    pub target: (i64, String),
    /// Rows on the target outside its range.
    pub misplaced: i64,
}

impl Diff {
    pub fn matches(&self) -> bool {
        self.source == self.target && self.misplaced == 0
    }
}

async fn count_and_sum(db: &Db, sql: &str) -> Result<(i64, String, i64), String> {
    let rows = db.rows(sql).await?;
    let r = rows
        .first()
        .ok_or_else(|| format!("{}: no answer to a count", db.name))?;
    let number = |i: usize| {
        r.get(i)
            .cloned()
            .flatten()
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    Ok((
        number(0),
        r.get(1).cloned().flatten().unwrap_or_default(),
        number(2),
    ))
}

/// Compares every published table of every moving part once, source and target queried at
/// the same time.
pub async fn compare(plan: &Plan) -> Result<Vec<Diff>, String> {
    let source = connect(&plan.source, "the source").await?;
    let tables = source_tables(&source).await?;
    let mut diffs = Vec::new();
    for (_, part) in plan.moving() {
        let target = connect(&part.primary, &format!("target {}", part.range)).await?;
        for t in &tables {
            if plan.sharded(&t.schema, &t.name).is_none() && !plan.copied_whole(part, t) {
                continue;
            }
            let sql = plan.verify_sql(t, &part.range);
            let (s, d) = tokio::join!(count_and_sum(&source, &sql), count_and_sum(&target, &sql));
            let (s, d) = (s?, d?);
            diffs.push(Diff {
                range: part.range.to_string(),
                table: t.sql_name(),
                source: (s.0, s.1),
                target: (d.0, d.1),
                misplaced: d.2,
            });
        }
    }
    Ok(diffs)
}

/// `reshard verify`: compares up to `rounds` times, `pause` apart, until a round matches
/// everywhere (under writes, source and target are a moment apart); prints the last round.
pub async fn verify(plan: &Plan, rounds: u32, pause: Duration) -> Result<bool, String> {
    let mut last = Vec::new();
    for round in 1..=rounds.max(1) {
        last = compare(plan).await?;
        if last.iter().all(Diff::matches) {
            print_diffs(&last);
            println!("verify: every table matches (round {round})");
            return Ok(true);
        }
        if round < rounds {
            tokio::time::sleep(pause).await;
        }
    }
    print_diffs(&last);
    println!(
        "verify: differences remain after {rounds} rounds (under writes the target trails the source; \
         the cut-over verifies again while the shard is paused)"
    );
    Ok(false)
}

pub fn print_diffs(diffs: &[Diff]) {
    for d in diffs {
        println!(
            "  {:<37} {:<32} source {:>9} rows  target {:>9} rows  {}{}",
            d.range,
            d.table,
            d.source.0,
            d.target.0,
            if d.source.1 == d.target.1 {
                "checksum equal"
            } else {
                "CHECKSUM DIFFERS"
            },
            if d.misplaced > 0 {
                format!(", {} rows outside the range", d.misplaced)
            } else {
                String::new()
            }
        );
    }
}
