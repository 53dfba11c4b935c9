//! `reshard plan`'s checks and `reshard start`: the source's tables and what they allow, the
//! targets' emptiness, then the schema copied to the targets (`pg_dump --schema-only` into
//! `psql`), one publication per new range on the source and one subscription per target,
//! which copies the existing rows and then streams every change.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use shardmap::Primary;

use super::db::{self, connect, Db};
use super::plan::{CatalogTable, Plan, MARKER, SCHEMA, SUBSCRIPTIONS};
use shardmap::sql::quote_literal;

/// The source's user tables (outside the split's own schema, but with the routers' lookup
/// tables there, which are sharded by their values and move with the range), in name order.
pub async fn source_tables(source: &Db) -> Result<Vec<CatalogTable>, String> {
    let rows = source
        .rows(&format!(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
             AND (n.nspname <> {} OR c.relname LIKE 'lookup\\_%') \
             AND n.nspname NOT LIKE 'pg\\_%' ORDER BY 1, 2",
            quote_literal(SCHEMA)
        ))
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let mut r = r.into_iter();
            Some(CatalogTable {
                schema: r.next().flatten()?,
                name: r.next().flatten()?,
            })
        })
        .collect())
}

/// Everything that would make the split fail or lose data, found before anything is
/// created; an empty list when all is well. Also returns notes worth printing.
pub async fn check(plan: &Plan) -> Result<(Vec<String>, Vec<String>), String> {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let source = connect(&plan.source, "the source").await?;
    let wal_level = source.value("SHOW wal_level").await?.unwrap_or_default();
    if wal_level != "logical" {
        problems.push(format!(
            "{}: wal_level is {wal_level}; a split streams changes with logical replication: set wal_level = logical and restart the server",
            source.name
        ));
    }
    let may_replicate = source
        .value("SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user")
        .await?;
    if may_replicate.as_deref() != Some("t") {
        problems.push(format!(
            "{}: the user has neither SUPERUSER nor REPLICATION, so the targets cannot stream from it",
            source.name
        ));
    }
    let free_slots: i64 = source
        .value("SELECT current_setting('max_replication_slots')::int - count(*) FROM pg_replication_slots")
        .await?
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let wanted = plan.moving().count() as i64 + 2;
    if free_slots < wanted {
        problems.push(format!(
            "{}: {free_slots} free replication slots, the split needs {wanted} (one per target, and table copies): raise max_replication_slots",
            source.name
        ));
    }
    let tables = source_tables(&source).await?;
    for table in &plan.tables {
        let present = tables
            .iter()
            .any(|t| plan.sharded(&t.schema, &t.name) == Some(table));
        if !present {
            notes.push(format!(
                "the sharded table {} is not on the source; nothing to copy for it",
                table.qualified_name()
            ));
        }
    }
    for t in &tables {
        let sharded = plan.sharded(&t.schema, &t.name);
        let published = sharded.is_some() || plan.moving().any(|(_, p)| plan.copied_whole(p, t));
        if !published {
            notes.push(format!(
                "{} is not sharded and the default shard does not move: its schema is copied, its rows stay",
                t.sql_name()
            ));
            continue;
        }
        let name = quote_literal(&t.sql_name());
        let identity = source
            .value(&format!(
                "SELECT relreplident::text FROM pg_class WHERE oid = {name}::regclass"
            ))
            .await?
            .unwrap_or_default();
        let key = sharded.map(|s| quote_literal(&s.key));
        let index_has = |which: &str| {
            let column = key
                .as_ref()
                .map_or(String::new(), |k| format!(" AND a.attname = {k}"));
            format!(
                "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid \
                 AND a.attnum = ANY (i.indkey) WHERE i.indrelid = {name}::regclass AND i.{which}{column})"
            )
        };
        let covered = match identity.as_str() {
            "f" => true,
            "d" => source.value(&index_has("indisprimary")).await?.as_deref() == Some("t"),
            "i" => source.value(&index_has("indisreplident")).await?.as_deref() == Some("t"),
            _ => false,
        };
        if !covered {
            problems.push(match sharded {
                Some(s) => format!(
                    "{}: its key column {} is not in its primary key or replica identity; the row filter of a publication may only use those columns (add the key to the primary key, or ALTER TABLE .. REPLICA IDENTITY)",
                    t.sql_name(),
                    s.key
                ),
                None => format!(
                    "{}: no primary key or replica identity; once it is published, UPDATE and DELETE on it would fail on the source",
                    t.sql_name()
                ),
            });
        }
    }
    let superuser = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user";
    let user_tables = format!(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', {}) \
         AND n.nspname NOT LIKE 'pg\\_%'",
        quote_literal(SCHEMA)
    );
    for (i, part) in plan.moving() {
        let target = match connect(&part.primary, &format!("target {}", part.range)).await {
            Ok(t) => t,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        if target.value(superuser).await?.as_deref() != Some("t") {
            problems.push(format!(
                "{}: CREATE SUBSCRIPTION needs a superuser (PostgreSQL 15)",
                target.name
            ));
        }
        let count = target.value(&user_tables).await?.unwrap_or_default();
        if count != "0" {
            // Started before (the schema copied, perhaps the subscription refused): go on.
            let started = target.subscription_oid(&plan.part_name(i)).await?.is_some();
            if started || target.has_table(MARKER).await? {
                notes.push(format!(
                    "{}: the split was already started there",
                    target.name
                ));
            } else {
                problems.push(format!(
                    "{}: not empty ({count} tables); a split copies into an empty database",
                    target.name
                ));
            }
        }
    }
    Ok((problems, notes))
}

/// `reshard start`: the schema, the publications and the subscriptions. Each step is skipped
/// where it was done already, so `start` may be run again after a failure.
pub async fn start(plan: &Plan, pg_bin: Option<&Path>) -> Result<(), String> {
    let (problems, notes) = check(plan).await?;
    for n in &notes {
        println!("note: {n}");
    }
    if !problems.is_empty() {
        return Err(format!(
            "the split cannot start:\n  {}",
            problems.join("\n  ")
        ));
    }
    let source = connect(&plan.source, "the source").await?;
    source
        .exec(&format!(
            "CREATE SCHEMA IF NOT EXISTS {SCHEMA};\n\
             CREATE TABLE IF NOT EXISTS {MARKER} (token text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());\n\
             CREATE TABLE IF NOT EXISTS {SUBSCRIPTIONS} (name text PRIMARY KEY, target_oid oid NOT NULL)"
        ))
        .await?;
    let tables = source_tables(&source).await?;
    for (i, part) in plan.moving() {
        let name = plan.part_name(i);
        let target = connect(&part.primary, &format!("target {}", part.range)).await?;
        if target.subscription_oid(&name).await?.is_some() {
            println!("{}: already subscribed ({name})", target.name);
            continue;
        }
        if !target.has_table(MARKER).await? {
            println!("{}: copying the schema", target.name);
            copy_schema(&plan.source, &part.primary, pg_bin)?;
        }
        let published = source
            .value(&format!(
                "SELECT count(*) FROM pg_publication WHERE pubname = {}",
                quote_literal(&name)
            ))
            .await?;
        if published.as_deref() != Some("1") {
            source.exec(&plan.publication_sql(i, &tables)).await?;
        }
        println!(
            "{}: subscribing ({name}); the initial copy runs in the background",
            target.name
        );
        let sql = plan.subscription_sql(i, &db::conninfo(&plan.source));
        // Not through `exec`: its errors quote the statement, and this one holds a password.
        target.client.batch_execute(&sql).await.map_err(|e| {
            format!(
                "{}: CREATE SUBSCRIPTION {name}: {}",
                target.name,
                db::describe(&e)
            )
        })?;
        let oid = target.subscription_oid(&name).await?.ok_or_else(|| {
            format!(
                "{}: subscription {name} is not there after CREATE",
                target.name
            )
        })?;
        source
            .exec(&format!(
                "INSERT INTO {SUBSCRIPTIONS} VALUES ({}, {oid}) ON CONFLICT (name) DO UPDATE SET target_oid = EXCLUDED.target_oid",
                quote_literal(&name)
            ))
            .await?;
    }
    println!(
        "started: `shardgate reshard status` shows the copy; cut over when every table is ready"
    );
    Ok(())
}

/// A PostgreSQL client program: in `pg_bin`, else on PATH, else in the newest
/// /usr/lib/postgresql/*/bin (Debian's layout).
pub fn program(name: &str, pg_bin: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(dir) = pg_bin {
        let path = dir.join(name);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("--pg-bin {}: no {name} there", dir.display()))
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if let Some(p) = on_path {
        return Ok(p);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin").join(name)))
        })
        .filter(|(_, p)| p.is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .ok_or_else(|| format!("{name} is not installed (not on PATH nor in /usr/lib/postgresql/*/bin); install the postgresql-client package or give --pg-bin"))
}

/// Connection arguments and environment for a client program (the password never on the
/// command line).
fn login_args(cmd: &mut Command, primary: &Primary) {
    cmd.arg("-h")
        .arg(&primary.host)
        .arg("-p")
        .arg(primary.port.to_string())
        .arg("-d")
        .arg(&primary.database);
    if let Some(user) = &primary.user {
        cmd.arg("-U").arg(user);
    }
    if let Some(p) = &primary.password {
        cmd.env("PGPASSWORD", p);
    }
}

/// `pg_dump --schema-only` of the source into `psql` on the target, stopping at the first
/// error.
fn copy_schema(source: &Primary, target: &Primary, pg_bin: Option<&Path>) -> Result<(), String> {
    let mut dump = Command::new(program("pg_dump", pg_bin)?);
    dump.args([
        "--schema-only",
        "--no-owner",
        "--no-privileges",
        "--no-publications",
        "--no-subscriptions",
    ]);
    login_args(&mut dump, source);
    let dumped = dump
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("pg_dump could not run: {e}"))?;
    if !dumped.status.success() {
        return Err(format!(
            "pg_dump of the source ({}) failed: {}",
            source.endpoint(),
            String::from_utf8_lossy(&dumped.stderr).trim()
        ));
    }
    let mut psql = Command::new(program("psql", pg_bin)?);
    psql.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"]);
    login_args(&mut psql, target);
    let mut child = psql
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("psql could not run: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        stdin
            .write_all(&dumped.stdout)
            .map_err(|e| format!("writing the schema to psql: {e}"))?;
    }
    let done = child.wait_with_output().map_err(|e| format!("psql: {e}"))?;
    if !done.status.success() {
        return Err(format!(
            "the schema did not load on {}: {}",
            target.endpoint(),
            String::from_utf8_lossy(&done.stderr).trim()
        ));
    }
    Ok(())
}
