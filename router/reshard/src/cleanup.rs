//! `reshard cleanup`: after a cut-over, or to abandon a split. Drops the subscriptions on the
//! targets, every slot the split made on the source (the subscriptions' and their table
//! copies'), the publications and the split's own tables; the source keeps WAL for a slot
//! until it is dropped, so a slot left behind fills its disk.
//!
//! Whether the split was cut over is read from the source itself: the cut-over's row in the
//! marker table (the fence up without that row is a cut-over interrupted, and refused). After
//! a cut-over the fence stays (the source's moved rows must never be written again) and the
//! moved rows are deleted only with `--delete-moved`. Abandoned, the source is left as it was
//! before `start`; the targets keep what was copied unless `--reset-targets`.

use std::time::{Duration, Instant};

use super::copy::source_tables;
use super::db::{connect, Db};
use super::plan::{CatalogTable, Plan, FENCE_BYPASS, MARKER, SCHEMA, SUBSCRIPTIONS};
use shardmap::sql::quote_literal;

pub struct Cleanup {
    pub delete_moved: bool,
    pub reset_targets: bool,
}

/// `reshard cleanup`; prints what it did and what it could not. The steps of the cleanup in
/// docs/resharding.md, in its order.
pub async fn cleanup(plan: &Plan, opts: &Cleanup) -> Result<(), String> {
    let source = connect(&plan.source, "the source").await?;
    let found = find_what_the_split_left(plan, &source, opts).await?;
    drop_subscriptions(plan, &found, opts).await?;
    drop_slots(plan, &source, &found.oids).await?;
    drop_publications(plan, &source).await?;
    if found.cut_over {
        keep_the_fence(plan, &source, &found.tables, opts).await
    } else {
        restore_the_source(plan, &source, &found.tables).await
    }
}

/// What step 1 finds on the source.
struct Found {
    cut_over: bool,
    /// The OIDs of the targets' subscriptions (recorded on the source): they name the slots
    /// of the subscriptions' table copies.
    oids: Vec<String>,
    tables: Vec<CatalogTable>,
}

/// The publications, subscriptions and slots of the split: one name per part that moves.
fn part_names(plan: &Plan) -> Vec<String> {
    plan.moving().map(|(i, _)| plan.part_name(i)).collect()
}

/// Step 1 of the cleanup (docs/resharding.md): what the split left, read on the source;
/// refused after an interrupted cut-over, and `--delete-moved` refused unless cut over.
async fn find_what_the_split_left(
    plan: &Plan,
    source: &Db,
    opts: &Cleanup,
) -> Result<Found, String> {
    let fenced = source.value(&plan.fenced_sql()).await?.as_deref() == Some("t");
    let cut_over = source.has_table(MARKER).await?
        && source
            .value(&format!(
                "SELECT count(*) FROM {MARKER} WHERE token = {}",
                quote_literal(&plan.done_token())
            ))
            .await?
            .as_deref()
            == Some("1");
    if fenced && !cut_over {
        return Err(format!(
            "the cut-over of shard {} was interrupted (the fence is up, the new map was not confirmed on every router): \
             run `shardgate reshard cutover` again, which finishes or rolls back, then cleanup",
            plan.range
        ));
    }
    println!(
        "shard {}: {}",
        plan.range,
        if cut_over {
            "cut over (the fence on the source is up)"
        } else {
            "not cut over: abandoning the split"
        }
    );
    if opts.delete_moved && !cut_over {
        return Err("--delete-moved after a split that was not cut over would delete the only copy: refused".into());
    }
    let oids: Vec<String> = if source.has_table(SUBSCRIPTIONS).await? {
        source
            .rows(&format!("SELECT target_oid FROM {SUBSCRIPTIONS}"))
            .await?
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .collect()
    } else {
        Vec::new()
    };
    let tables = source_tables(source).await?;
    Ok(Found {
        cut_over,
        oids,
        tables,
    })
}

/// Step 2 of the cleanup (docs/resharding.md): the targets, on each the subscription dropped
/// and the split's tables or (with `--reset-targets`) the copied ones; a target that cannot be
/// reached keeps its subscription, and the statements to drop it there are printed.
async fn drop_subscriptions(plan: &Plan, found: &Found, opts: &Cleanup) -> Result<(), String> {
    for (i, part) in plan.moving() {
        let name = plan.part_name(i);
        let target = match connect(&part.primary, &format!("target {}", part.range)).await {
            Ok(t) => t,
            Err(e) => {
                println!(
                    "could not reach {e}\n  its subscription {name} stays there: when it is back, run there \
                     ALTER SUBSCRIPTION {name} DISABLE; ALTER SUBSCRIPTION {name} SET (slot_name = NONE); DROP SUBSCRIPTION {name};\n  \
                     (its slot on the source is dropped here)"
                );
                continue;
            }
        };
        if target.subscription_oid(&name).await?.is_some() {
            target
                .exec(&format!(
                    "ALTER SUBSCRIPTION {name} DISABLE; ALTER SUBSCRIPTION {name} SET (slot_name = NONE); DROP SUBSCRIPTION {name}"
                ))
                .await?;
            println!("{}: subscription {name} dropped", target.name);
        }
        if found.cut_over {
            target
                .exec(&format!("DROP TABLE IF EXISTS {MARKER}, {SUBSCRIPTIONS}"))
                .await?;
        } else if opts.reset_targets {
            let drops: Vec<String> = found
                .tables
                .iter()
                .map(|t| format!("DROP TABLE IF EXISTS {} CASCADE", t.sql_name()))
                .collect();
            target
                .exec(&format!(
                    "{};\nDROP SCHEMA IF EXISTS {SCHEMA} CASCADE",
                    drops.join(";\n")
                ))
                .await?;
            println!(
                "{}: the copied tables dropped (other schema objects the copy made stay)",
                target.name
            );
        } else {
            println!(
                "{}: what was copied stays there (--reset-targets drops the tables)",
                target.name
            );
        }
    }
    Ok(())
}

/// Step 3 of the cleanup (docs/resharding.md): the slots on the source, the subscriptions' own
/// and those of their table copies; a slot still held by a stream has its sender ended.
async fn drop_slots(plan: &Plan, source: &Db, oids: &[String]) -> Result<(), String> {
    let patterns: Vec<String> = part_names(plan).iter().map(|n| quote_literal(n)).collect();
    let sync: Vec<String> = oids
        .iter()
        .map(|o| {
            format!(
                "slot_name LIKE {}",
                quote_literal(&format!("pg\\_{o}\\_sync\\_%"))
            )
        })
        .collect();
    let ours = format!(
        "(slot_name IN ({}){})",
        patterns.join(", "),
        sync.iter().map(|s| format!(" OR {s}")).collect::<String>()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        source
            .exec(&format!(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE {ours} AND active_pid IS NOT NULL"
            ))
            .await?;
        let dropped = source
            .rows(&format!(
                "SELECT slot_name, pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE {ours} AND NOT active"
            ))
            .await;
        if let Ok(rows) = &dropped {
            for r in rows {
                println!(
                    "the source: slot {} dropped",
                    r[0].as_deref().unwrap_or("?")
                );
            }
        }
        let left = source
            .value(&format!(
                "SELECT count(*) FROM pg_replication_slots WHERE {ours}"
            ))
            .await?;
        if left.as_deref() == Some("0") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the source: {} of the split's slots are still there after 10 s (in use?); run cleanup again",
                left.unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Step 4 of the cleanup (docs/resharding.md): the publications on the source.
async fn drop_publications(plan: &Plan, source: &Db) -> Result<(), String> {
    for name in &part_names(plan) {
        source
            .exec(&format!("DROP PUBLICATION IF EXISTS {name}"))
            .await?;
    }
    println!("the source: publications dropped");
    Ok(())
}

/// Step 5 of the cleanup (docs/resharding.md), the source's own tables after a cut-over: the
/// record of subscriptions dropped, with `--delete-moved` the moved rows deleted; the fence
/// and the marker stay.
async fn keep_the_fence(
    plan: &Plan,
    source: &Db,
    tables: &[CatalogTable],
    opts: &Cleanup,
) -> Result<(), String> {
    // The marker stays: its row says the split was cut over (a second cleanup reads it).
    source
        .exec(&format!("DROP TABLE IF EXISTS {SUBSCRIPTIONS}"))
        .await?;
    if opts.delete_moved {
        for t in tables {
            let Some(sharded) = plan.sharded(&t.schema, &t.name) else {
                continue;
            };
            // The fence refuses these deletes from everyone else; the bypass is for this one only.
            let rows = source
                .rows(&format!(
                    "BEGIN; SET LOCAL {FENCE_BYPASS} = on; \
                     WITH gone AS (DELETE FROM {} WHERE {} RETURNING 1) SELECT count(*) FROM gone; COMMIT",
                    t.sql_name(),
                    plan.moved_predicate(sharded)
                ))
                .await?;
            let n = rows
                .first()
                .and_then(|r| r.first().cloned().flatten())
                .unwrap_or_default();
            println!("the source: {n} moved rows of {} deleted", t.sql_name());
        }
    }
    println!("the fence stays on the source: its moved rows must not be written again");
    Ok(())
}

/// Step 5 of the cleanup (docs/resharding.md), the source's own tables for an abandoned
/// split: the fence and the split's tables dropped, the source as before `start`.
async fn restore_the_source(
    plan: &Plan,
    source: &Db,
    tables: &[CatalogTable],
) -> Result<(), String> {
    source.exec(&plan.unfence_sql(tables).join(";\n")).await?;
    // The schema goes only if nothing else is in it (the fence of an earlier split may be).
    source
        .exec(&format!(
            "DROP TABLE IF EXISTS {MARKER}, {SUBSCRIPTIONS};\n\
             DO $$ BEGIN DROP SCHEMA IF EXISTS {SCHEMA}; EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END $$"
        ))
        .await?;
    println!("the source: the split's tables dropped; the source is as before the split");
    Ok(())
}
