//! Statement → route: the rules, one statement kind at a time.
//!
//! Data statements (queries, INSERT/UPDATE/DELETE, COPY of a query) are decided from what
//! [`super::refs`] found: no user table → `Any`, only unsharded tables → `Default`, sharded
//! tables all pinned to keys of one type → `Keyed`, anything else → `Unroutable` with a message
//! saying what would make it routable. DDL goes to the default shard unless it names a sharded
//! table or is schema-wide: then it is broadcast to every shard.

use shardmap::{ShardMap, Table};

use super::{CopyRows, KeySource, Merge};
use sqlparser::ast::{
    CommentObject, CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget,
    ObjectName, ObjectType, Statement,
};

use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::tokenizer::{Token, Tokenizer};

use super::refs::{KeyDefault, Learned, Refs, Rel};
use super::Route;

/// The route of one parsed statement.
pub(crate) fn route(stmt: &Statement, map: &ShardMap, learned: &Learned) -> Route {
    match stmt {
        Statement::Query(_) | Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {
            data(stmt, map, learned)
        }
        Statement::Copy {
            source,
            to,
            target,
            options,
            legacy_options,
            ..
        } => match source {
            CopySource::Table { table_name, columns } => match Refs::new(map).classify(table_name) {
                Rel::Sharded(t) => copy_sharded(t, columns, *to, target, options, legacy_options),
                Rel::Reference(_) if *to => Route::Any,
                Rel::Reference(r) if matches!(target, CopyTarget::Stdin) => {
                    copy_into_reference(&r.qualified_name(), columns, learned)
                }
                Rel::Reference(r) => Route::Unroutable {
                    message: format!(
                        "COPY of the reference table {} from a file or program runs on one server: use COPY ... FROM STDIN (psql's \\copy)",
                        r.qualified_name()
                    ),
                },
                _ => Route::Default,
            },
            CopySource::Query(_) => data(stmt, map, learned),
        },
        Statement::Explain {
            statement,
            analyze,
            options,
            ..
        } => super::explain::explain(route(statement, map, learned), *analyze, options.as_deref()),

        Statement::Declare { stmts, .. } => match stmts.as_slice() {
            [d] if d.names.len() == 1 && d.for_query.is_some() => {
                let query = d.for_query.as_deref().map_or(Route::Any, |q| {
                    route(&Statement::Query(Box::new(q.clone())), map, learned)
                });
                Route::Declare {
                    name: super::cursor::name(super::pins::fold(&d.names[0])),
                    hold: d.hold == Some(true),
                    binary: d.binary == Some(true),
                    query: Box::new(query),
                }
            }
            _ => Route::Unroutable {
                message: "DECLARE must declare one cursor FOR a query".into(),
            },
        },
        Statement::StartTransaction { .. } => Route::Begin,
        Statement::Commit { .. } => Route::Commit,
        Statement::Rollback { savepoint: None, .. } => Route::Rollback,
        Statement::Rollback { savepoint: Some(_), .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => Route::Savepoint,

        Statement::Set(_)
        | Statement::Reset(_)
        | Statement::ShowVariable { .. }
        | Statement::ShowVariables { .. }
        | Statement::Discard { .. } => Route::Any,
        Statement::Deallocate { .. } | Statement::Prepare { .. } | Statement::Execute { .. } => {
            Route::PreparedSql
        }

        // Function and procedure bodies are not analyzed: like user functions in a query,
        // they are assumed to work on unsharded tables.
        Statement::Call(_) => Route::Default,

        Statement::CreateTable(_)
        | Statement::AlterTable(_)
        | Statement::CreateIndex(_)
        | Statement::AlterIndex { .. }
        | Statement::Truncate(_)
        | Statement::CreateView(_)
        | Statement::AlterView(_)
        | Statement::Lock(_)
        | Statement::Analyze(_)
        | Statement::Vacuum(_)
        | Statement::RefreshMaterializedView(_)
        | Statement::CreateSequence { .. }
        | Statement::CreatePolicy(_)
        | Statement::DropPolicy(_)
        | Statement::AlterPolicy(_)
        | Statement::CreateTrigger(_)
        | Statement::DropTrigger(_) => table_ddl(stmt, map),
        Statement::Drop { object_type, names, .. } => drop(map, *object_type, names),
        Statement::Comment { object_type, object_name, .. } => {
            let everywhere = match object_type {
                CommentObject::Table => on_every_shard(map, object_name),
                CommentObject::Column => {
                    let mut parts = object_name.0.clone();
                    parts.pop();
                    on_every_shard(map, &ObjectName(parts))
                }
                _ => false,
            };
            if everywhere {
                Route::Broadcast
            } else {
                Route::Default
            }
        }

        Statement::CreateExtension(_)
        | Statement::DropExtension(_)
        | Statement::CreateSchema { .. }
        | Statement::AlterSchema(_)
        | Statement::CreateFunction(_)
        | Statement::AlterFunction(_)
        | Statement::DropFunction(_)
        | Statement::CreateProcedure { .. }
        | Statement::DropProcedure { .. }
        | Statement::CreateType { .. }
        | Statement::AlterType(_)
        | Statement::CreateDomain(_)
        | Statement::DropDomain(_)
        | Statement::CreateCollation(_)
        | Statement::Grant(_)
        | Statement::Revoke(_) => Route::Broadcast,

        // Roles and databases belong to a server, and a server may hold many shard databases.
        Statement::CreateRole(_) | Statement::AlterRole { .. } | Statement::CreateDatabase { .. }
            if map.shards().len() == 1 =>
        {
            Route::Default
        }
        Statement::CreateRole(_) | Statement::AlterRole { .. } | Statement::CreateDatabase { .. } => Route::Unroutable {
            message: "roles and databases belong to each Postgres server, not to a shard: create them on every server directly".to_string(),
        },

        Statement::LISTEN { .. } | Statement::UNLISTEN { .. } | Statement::NOTIFY { .. } => Route::Unroutable {
            message: "LISTEN/NOTIFY need a session that keeps one server connection, which shardgate does not offer yet".to_string(),
        },
        // With one shard there is only one place any statement can go.
        _ if map.shards().len() == 1 => Route::Default,
        _ => Route::Unroutable {
            message: format!(
                "shardgate cannot route this kind of statement yet ({}); run it on the shards directly",
                first_words(stmt)
            ),
        },
    }
}

/// The first two words of a statement, to name its kind in a message.
fn first_words(stmt: &Statement) -> String {
    stmt.to_string()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether every shard has the table: a sharded table (its part) or a reference table (whole).
fn on_every_shard(map: &ShardMap, name: &ObjectName) -> bool {
    matches!(
        Refs::new(map).classify(name),
        Rel::Sharded(_) | Rel::Reference(_)
    )
}

/// COPY FROM STDIN into reference table `name`: every row to every shard, unless a column
/// left to its default would get a different value on each (an identity, a sequence, `now()`).
fn copy_into_reference(name: &str, columns: &[sqlparser::ast::Ident], learned: &Learned) -> Route {
    let facts = learned.get(name).cloned().unwrap_or_default();
    // Without a column list, every column comes from the rows.
    let left_out = facts
        .per_shard_defaults
        .iter()
        .find(|(column, _)| !columns.is_empty() && !columns.iter().any(|c| ident_is(c, column)));
    match left_out {
        Some((column, _)) => Route::Unroutable {
            message: format!("COPY into the reference table {name} leaves out its column {column}, whose default (an identity, a sequence, now(), ...) would give each shard a different value: list {column} and give its values"),
        },
        None => Route::CopyIn(CopyRows::ToEveryShard),
    }
}

/// COPY of a sharded table: out to STDOUT gathers from every shard; in from STDIN splits the
/// rows by key (text or CSV, with a column list that names the key).
fn copy_sharded(
    t: &Table,
    columns: &[sqlparser::ast::Ident],
    to: bool,
    target: &CopyTarget,
    options: &[CopyOption],
    legacy: &[CopyLegacyOption],
) -> Route {
    let name = t.qualified_name();
    match (to, target) {
        (true, CopyTarget::Stdout) => Route::Scatter {
            table: name,
            merge: super::Merge::Concat { limit: None },
        },
        (false, CopyTarget::Stdin) if !t.lookups.is_empty() => Route::Unroutable {
            message: format!("COPY into {name}, which has lookup columns, is not supported yet (the router would have to write the lookup rows of its values): insert the rows with INSERT ... VALUES"),
        },
        (false, CopyTarget::Stdin) => {
            let Some(key_index) = columns.iter().position(|c| ident_is(c, &t.key)) else {
                return Route::Unroutable {
                    message: format!(
                        "COPY into the sharded table {name} needs a column list that names its key {}, as in COPY {name} ({}, ...) FROM STDIN",
                        t.key, t.key
                    ),
                };
            };
            let mut f = super::CopyFormat::text(key_index, columns.len());
            let mut binary = false;
            for o in options {
                match o {
                    CopyOption::Format(fmt) => match fmt.value.to_ascii_lowercase().as_str() {
                        "csv" => f.csv = true,
                        "text" => f.csv = false,
                        _ => binary = true,
                    },
                    CopyOption::Delimiter(c) => f.delimiter = *c as u8,
                    CopyOption::Quote(c) => f.quote = *c as u8,
                    CopyOption::Escape(c) => f.escape = *c as u8,
                    CopyOption::Header(h) => f.header = *h,
                    _ => {}
                }
            }
            for o in legacy {
                match o {
                    CopyLegacyOption::Binary => binary = true,
                    CopyLegacyOption::Delimiter(c) => f.delimiter = *c as u8,
                    CopyLegacyOption::Csv(csv) => {
                        f.csv = true;
                        for c in csv {
                            match c {
                                CopyLegacyCsvOption::Header => f.header = true,
                                CopyLegacyCsvOption::Quote(q) => f.quote = *q as u8,
                                CopyLegacyCsvOption::Escape(e) => f.escape = *e as u8,
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            if f.csv && f.delimiter == b'\t' && !options.iter().any(|o| matches!(o, CopyOption::Delimiter(_))) && !legacy.iter().any(|o| matches!(o, CopyLegacyOption::Delimiter(_))) {
                f.delimiter = b',';
            }
            if f.csv && !options.iter().any(|o| matches!(o, CopyOption::Escape(_))) {
                f.escape = f.quote;
            }
            if binary {
                return Route::Unroutable {
                    message: format!("COPY into the sharded table {name} in binary format is not supported: use text or CSV"),
                };
            }
            Route::CopyIn(CopyRows::ByKey {
                key_type: t.key_type,
                format: f,
            })
        }
        _ => Route::Unroutable {
            message: format!(
                "COPY of the sharded table {name} to or from a file or program runs on the server, which has only one shard's rows: use COPY ... FROM STDIN / TO STDOUT (psql's \\copy)"
            ),
        },
    }
}

fn ident_is(ident: &sqlparser::ast::Ident, name: &str) -> bool {
    match ident.quote_style {
        Some(_) => ident.value == name,
        None => ident.value.eq_ignore_ascii_case(name),
    }
}

fn table_ddl(stmt: &Statement, map: &ShardMap) -> Route {
    let refs = Refs::collect(stmt, map, &Learned::default());
    if refs.sharded.is_empty() {
        return reference_ddl(stmt, map, &refs);
    }
    if let Some(refused) = super::lookups::truncate(stmt, &refs) {
        return refused;
    }
    // A view over a sharded table would hold one shard's rows on each shard, and reading it
    // (a table outside the map) would read the default shard's only.
    if let Statement::CreateView(_) = stmt {
        return Route::Unroutable {
            message: format!(
                "a view over the sharded table {} is not supported: each shard's view would see only that shard's rows, and a read of the view one shard's; query the table itself",
                refs.sharded[0].qualified_name()
            ),
        };
    }
    // CREATE TABLE .. AS SELECT from a sharded table would create a different table on every
    // shard, each from that shard's rows.
    if let Statement::CreateTable(ct) = stmt {
        if ct.query.is_some() {
            return Route::Unroutable {
                message: format!(
                    "CREATE TABLE .. AS SELECT from the sharded table {} is not supported: create the table, then insert into it",
                    refs.sharded[0].qualified_name()
                ),
            };
        }
    }
    // A temporary table (`LIKE` a sharded table) is the session's own, on the connection it
    // keeps to the default shard (`super::temporary`).
    if matches!(stmt, Statement::CreateTable(ct) if ct.temporary) {
        return Route::Default;
    }
    Route::Broadcast
}

/// DDL that names no sharded table: on every shard when it changes a reference table (its
/// CREATE, ALTER, indexes, TRUNCATE...), else on the default shard (temporary tables with ON
/// COMMIT DROP too, like unsharded tables).
fn reference_ddl(stmt: &Statement, map: &ShardMap, refs: &Refs<'_>) -> Route {
    let Some(reference) = refs.references.first() else {
        return Route::Default;
    };
    let subject = match stmt {
        Statement::CreateTable(ct) => Some(&ct.name),
        Statement::AlterTable(at) => Some(&at.name),
        Statement::CreateIndex(ci) => Some(&ci.table_name),
        Statement::CreateView(cv) => Some(&cv.name),
        _ => None,
    };
    // A table or view that only refers to a reference table (a foreign key, a view over it)
    // is an unsharded one.
    if subject.is_some_and(|name| !on_every_shard(map, name)) {
        return Route::Default;
    }
    if let Some(other) = refs.unsharded.first() {
        return Route::Unroutable {
            message: format!(
                "this statement changes the reference table {}, which every shard has, and names {other}, which is only on the default shard: run them separately",
                reference.qualified_name()
            ),
        };
    }
    if let Some(why) = super::reference::alter_problem(stmt) {
        return Route::Unroutable {
            message: format!(
                "this ALTER TABLE of the reference table {} runs on every shard, and {why}: add the column without it, fill it with an UPDATE, then set the default",
                reference.qualified_name()
            ),
        };
    }
    Route::Broadcast
}

/// Whether a query's `FOR UPDATE/SHARE` locks rows of a reference table: a clause without
/// `OF`, or `OF` a reference table (by its name or alias in the query's FROM).
fn locks_reference(q: &sqlparser::ast::Query, map: &ShardMap) -> bool {
    let sqlparser::ast::SetExpr::Select(select) = q.body.as_ref() else {
        return !q.locks.is_empty();
    };
    let refs = Refs::new(map);
    let mut tables = Vec::new();
    for twj in &select.from {
        for factor in std::iter::once(&twj.relation).chain(twj.joins.iter().map(|j| &j.relation)) {
            if let sqlparser::ast::TableFactor::Table { name, alias, .. } = factor {
                let called = match alias {
                    Some(a) => super::pins::fold(&a.name),
                    None => name.0.last().map(|p| p.to_string()).unwrap_or_default(),
                };
                tables.push((called, matches!(refs.classify(name), Rel::Reference(_))));
            }
        }
    }
    q.locks.iter().any(|lock| match &lock.of {
        None => true,
        Some(of) => {
            let of = of.0.last().map(|p| p.to_string()).unwrap_or_default();
            tables
                .iter()
                .any(|(called, reference)| *reference && *called == of)
                || !tables.iter().any(|(called, _)| *called == of)
        }
    })
}

/// The merge of a read run on several shards, when the shards' answers add up to the answer:
/// the merge rules of [`super::scatter`], and each row made on one shard only
/// ([`super::once`]).
fn merge_across(
    stmt: &Statement,
    map: &ShardMap,
    placed: &super::scatter::Placement,
) -> Result<Merge, &'static str> {
    let merge = super::scatter::merge_for(stmt, placed)?;
    if let Ok(q) = super::scatter::the_query(stmt) {
        let refs = Refs::new(map);
        super::once::each_row_once(q, &|name| matches!(refs.classify(name), Rel::Sharded(_)))?;
    }
    Ok(merge)
}

fn drop(map: &ShardMap, object_type: ObjectType, names: &[ObjectName]) -> Route {
    match object_type {
        ObjectType::Table | ObjectType::View | ObjectType::MaterializedView | ObjectType::Sequence => {
            let shardedness: Vec<bool> = names.iter().map(|n| on_every_shard(map, n)).collect();
            if shardedness.iter().all(|&s| s) {
                Route::Broadcast
            } else if shardedness.iter().all(|&s| !s) {
                Route::Default
            } else {
                Route::Unroutable {
                    message: "this DROP names tables that every shard has (sharded or reference tables) and unsharded tables together: drop them in separate statements".to_string(),
                }
            }
        }
        // An index name does not say which table it belongs to, and one of a sharded table
        // exists on every shard (with one shard, that is the one).
        ObjectType::Index if map.shards().len() == 1 => Route::Default,
        ObjectType::Index => Route::Unroutable {
            message: "DROP INDEX cannot be routed: shardgate cannot tell which table the index belongs to; drop it on the shards directly".to_string(),
        },
        _ => Route::Broadcast,
    }
}

fn data(stmt: &Statement, map: &ShardMap, learned: &Learned) -> Route {
    let mut refs = Refs::collect(stmt, map, learned);
    let route = routed(stmt, map, &mut refs);
    super::lookups::with_lookups(stmt, route, &mut refs)
}

/// The route of a statement that reads or writes tables, from what it references.
fn routed(stmt: &Statement, map: &ShardMap, refs: &mut Refs<'_>) -> Route {
    if let Some(message) = refs.problem.clone() {
        return Route::Unroutable { message };
    }
    if let Some(route) = super::reference::write(stmt, refs) {
        return route;
    }
    let placed = std::mem::take(&mut refs.placement);
    if let (Statement::Query(q), Some(r)) = (stmt, refs.references.first()) {
        if locks_reference(q, map) {
            return Route::Unroutable {
                message: format!(
                    "FOR UPDATE/SHARE of the reference table {} would lock its rows on one shard only, while its writes lock every shard: lock a row of a sharded table instead, or write the reference table directly",
                    r.qualified_name()
                ),
            };
        }
    }
    let Some(first) = refs.sharded.first() else {
        // Reference tables are on every shard, the default one too.
        return if !refs.unsharded.is_empty() || refs.calls_functions || refs.select_into {
            Route::Default
        } else {
            Route::Any
        };
    };
    let name = first.qualified_name();
    if refs.select_into {
        return Route::Unroutable {
            message: format!("SELECT INTO from the sharded table {name} is not supported: create the table, then INSERT ... VALUES into it"),
        };
    }
    if let Some(other) = refs.unsharded.first() {
        return Route::Unroutable {
            message: format!(
                "this statement uses the sharded table {name} and the unsharded table {other}, which live on different shards: query them separately"
            ),
        };
    }
    if let Some((rows, default)) = refs.new_keys.take() {
        if refs.sharded.len() > 1 {
            return Route::Unroutable {
                message: format!("this INSERT leaves out the sharding key {} of {name}, which the router gives, so its rows go where their new keys do; it cannot also read sharded tables", first.key),
            };
        }
        return Route::NewKeys {
            table: name,
            key: first.key.clone(),
            key_type: first.key_type,
            rows,
            always: default == KeyDefault::Always,
        };
    }
    if refs.pins.is_empty()
        && refs.sharded.len() == 1
        && matches!(stmt, Statement::Update(_) | Statement::Delete(_))
    {
        let key = &first.key;
        return Route::ScatterWrite {
            table: name.clone(),
            message: format!(
                "{name} is sharded by {key}, and this write does not fix {key} to one value: add `WHERE {key} = <value>`; writes on every shard are refused here ([transactions] scatter_writes = \"refuse\", or SET shardgate.allow_scatter_writes = off), SET shardgate.allow_scatter_writes = on allows them"
            ),
        };
    }
    // The sharded tables of the statement's own query: the others are tied to their rows.
    let main = refs.sharded.len() - refs.tied;
    let merge_or_stages = |refs: &Refs| {
        merge_across(stmt, map, &placed)
            .or_else(|why| super::staged::staged(stmt, refs, &placed, why))
    };
    if refs.pins.is_empty() && main == 1 {
        match merge_or_stages(refs) {
            Ok(merge) => return Route::Scatter { table: name, merge },
            Err(why) => {
                let key = &first.key;
                return Route::Unroutable {
                    message: format!(
                        "{name} is sharded by {key}, and this statement does not fix {key} to one value, so it would need every shard, but {why}: add `WHERE {key} = <value>` to read one shard, or simplify the read"
                    ),
                };
            }
        }
    }
    // Tables joined by equal keys without any key: every joined row is made on one shard.
    let colocated =
        main > 1 && refs.selects_with_sharded - refs.tied_selects == 1 && refs.colocated == main;
    if refs.pins.is_empty() && colocated {
        if let Ok(merge) = merge_or_stages(refs) {
            return Route::Scatter { table: name, merge };
        }
    }
    if refs.pins.len() + refs.correlated != refs.sharded.len() {
        return Route::Unroutable {
            message: unpinned(refs, first),
        };
    }
    let key_type = first.key_type;
    if let Some(p) = refs.pins.iter().find(|p| p.table.key_type != key_type) {
        return Route::Unroutable {
            message: format!(
                "this statement uses {name} (keyed by {key_type}) and {} (keyed by {}): tables with different key types are not on the same shard",
                p.table.qualified_name(),
                p.table.key_type
            ),
        };
    }
    let unnest = refs.unnest.take();
    let keys: Vec<_> = std::mem::take(&mut refs.pins)
        .into_iter()
        .flat_map(|p| p.keys)
        .collect();
    let one_key = keys.len() == 1 && !matches!(keys[0], KeySource::Array(_));
    let spread = if one_key {
        None
    } else if let Statement::Insert(ins) = stmt {
        // Rows for several shards can be split, each shard's part run in its own transaction
        // and all committed only if all succeeded. With RETURNING, each row must return one
        // row (to give them back in VALUES order), which ON CONFLICT may not do.
        let one_table = refs.sharded.len() == 1;
        let merge = match unnest {
            Some((arrays, key)) => Merge::SplitUnnest { arrays, key },
            None => Merge::SplitRows,
        };
        (one_table && (ins.returning.is_none() || ins.on.is_none())).then_some(merge)
    } else if matches!(stmt, Statement::Update(_) | Statement::Delete(_)) {
        // Each key's rows live on its shard only, so the same statement on each shard of its
        // keys does exactly the work (with one sharded table: a join would see one shard's part).
        (refs.sharded.len() == 1).then_some(Merge::Write)
    } else if main == 1 || colocated {
        // A read of one sharded table (or of tables joined by equal keys): each key's rows are
        // only on its shard, so the shards of its keys answer it exactly. A join of two pinned
        // references on different shards has no shard that holds both sides, and is refused.
        merge_or_stages(refs).ok()
    } else {
        None
    };
    Route::Keyed {
        table: name,
        key: first.key.clone(),
        key_type,
        keys,
        spread,
    }
}

/// Why a statement with fewer key pins than sharded table references cannot be routed, naming
/// such a table.
fn unpinned(refs: &Refs<'_>, first: &Table) -> String {
    // Name a table with fewer pins than references.
    let unpinned = refs
        .sharded
        .iter()
        .find(|t| {
            let refs_of = refs
                .sharded
                .iter()
                .filter(|u| std::ptr::eq(**u, **t))
                .count();
            let pins_of = refs
                .pins
                .iter()
                .filter(|p| std::ptr::eq(p.table, **t))
                .count();
            pins_of < refs_of
        })
        .copied()
        .unwrap_or(first);
    let (t, key) = (unpinned.qualified_name(), &unpinned.key);
    let more = if refs.sharded.len() > 1 {
        " Each reference to a sharded table (in a join, subquery or CTE) needs its own `alias.key = <value>` in the WHERE of the query that reads it."
    } else {
        ""
    };
    format!(
        "{t} is sharded by {key}, and this statement does not fix {key} to one value: add `WHERE {key} = <value>` (or `{key} IN (...)` with values on one shard); statements across all shards are not supported yet.{more}"
    )
}

/// The route of text the parser rejects: `Unparsed`, unless a word of it is the name of a
/// sharded table. sqlparser accepts less than Postgres does (`TABLE kv`, some DDL), and such a
/// statement run on the default shard would see only that shard's rows.
pub(crate) fn unparsed(text: &str, map: &ShardMap, parse_error: &str) -> Route {
    // Text that does not even tokenize (an unterminated string) is rejected by Postgres too.
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, text).tokenize() else {
        return Route::Unparsed;
    };
    let table = tokens.iter().find_map(|t| match t {
        Token::Word(w) => {
            let name = match w.quote_style {
                None => w.value.to_ascii_lowercase(),
                Some(_) => w.value.clone(),
            };
            map.tables().iter().find(|t| t.name == name)
        }
        _ => None,
    });
    match table {
        Some(t) => Route::Unroutable {
            message: format!(
                "shardgate's SQL parser does not understand this statement ({parse_error}), and it names the sharded table {}, so it cannot be routed safely; rewrite it, or run it on the shards directly",
                t.qualified_name()
            ),
        },
        None => Route::Unparsed,
    }
}
