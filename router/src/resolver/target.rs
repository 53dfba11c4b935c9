//! What the resolver decides for one statement: a [`Target`], a plain value that the session
//! executes and that prints as one line (what EXPLAIN of a route shows).

use std::fmt;
use std::sync::Arc;

use shardmap::{Key, KeyType, KeyspaceId, ShardMap};

use crate::planner::staged::StagedTexts;
use crate::planner::{CopyRows, MergePlan};
use crate::protocol::reply::SqlError;

/// Where a statement runs and why, or why it does not run at all.
#[derive(Debug)]
pub struct Target<'a> {
    /// What the session executes (owned: it outlives the statement's buffers).
    pub dest: Dest,
    /// Why a statement runs on one shard (set with [`Dest::Shard`]).
    pub why: Option<Why<'a>>,
    /// The map the shard numbers index, kept for printing ranges.
    map: &'a ShardMap,
}

impl<'a> Target<'a> {
    /// How this statement finds its shard again if a reload splits the shard while the
    /// statement waits for it (a paused shard): by its key, or as the default shard's.
    pub fn reroute(&self) -> Reroute {
        match self.why {
            Some(Why::Key { id, .. }) => Reroute::Key(id),
            Some(Why::Unsharded | Why::Unparsed) => Reroute::DefaultShard,
            _ => Reroute::No,
        }
    }

    pub fn new(dest: Dest, why: Option<Why<'a>>, map: &'a ShardMap) -> Target<'a> {
        Target { dest, why, map }
    }

    /// The shard map the target's shard numbers index.
    pub fn map(&self) -> &'a ShardMap {
        self.map
    }
}

/// The destinations a statement can have.
#[derive(Debug, Clone)]
pub enum Dest {
    /// One shard.
    Shard(usize),
    /// Any healthy shard: the statement touches no user table (or all its keys are NULL, so it
    /// matches no row anywhere).
    Any,
    /// `BEGIN` alone: the transaction's first statement chooses its shard.
    Begin,
    /// `COMMIT` alone.
    Commit,
    /// `ROLLBACK` alone.
    Rollback,
    /// DDL that every shard runs, each in its own transaction.
    Broadcast,
    /// A read on several shards whose answers are merged.
    Read(Read),
    /// An UPDATE or DELETE on several shards, each part in a transaction, committed together.
    Write(Write),
    /// A multi-row INSERT whose rows belong to several shards, split by row.
    SplitInsert(SplitInsert),
    /// An INSERT that leaves out its table's key, which the router gives: the session takes
    /// keys for its rows (all of one shard), writes them in, and routes that INSERT.
    NewKeys(NewKeys),
    /// Routed by a lookup column: the session reads the value's lookup row, then runs the
    /// statement on its keyspace ID's shard ([`super::lookups::found`]), or as `without` says.
    Lookup(ByLookup),
    /// A DELETE from a table with lookup columns, or an UPDATE that sets them: it runs with
    /// RETURNING on its shards, and the lookup rows of the values it removed (and added) change
    /// in the same write.
    ChangesLookups(ChangesLookups),
    /// COPY FROM STDIN into a sharded table (rows split by key) or a reference table.
    CopyIn(CopyRows),
    /// SQL-level PREPARE, EXECUTE or DEALLOCATE, which the session runs on the client's
    /// protocol-level statements.
    PreparedSql,
    /// `EXPLAIN (ROUTE) statement`: the router answers where the statement would run.
    ExplainRoute,
    /// `DECLARE name CURSOR FOR query`: `query` is where the query would run (a shard, or a
    /// read of several); the session decides from it where the cursor lives.
    Declare {
        name: String,
        hold: bool,
        binary: bool,
        query: Box<Dest>,
    },
    /// `FETCH`, `MOVE` or `CLOSE` of a cursor (`None`: `CLOSE ALL`), which the session finds.
    Cursor { name: Option<String>, close: bool },
    /// Not run: the error the client gets.
    Refused(SqlError),
}

/// What routes a statement again when its shard was split under it ([`Target::reroute`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reroute {
    /// Nothing that says which half (several keys, a pinned shard): it fails, to be run again.
    #[default]
    No,
    /// The half that owns this keyspace ID.
    Key(KeyspaceId),
    /// The new map's default shard (tables the map does not shard).
    DefaultShard,
}

impl Reroute {
    /// The shard of `map` this statement goes to, if it can tell.
    pub fn shard(self, map: &ShardMap) -> Option<usize> {
        match self {
            Reroute::No => None,
            Reroute::Key(id) => Some(map.shard_for(id)),
            Reroute::DefaultShard => Some(map.default_shard()),
        }
    }
}

/// Why a statement runs on one shard.
#[derive(Debug, Clone, Copy)]
pub enum Why<'a> {
    /// The key of a sharded table.
    Key {
        table: &'a str,
        column: &'a str,
        value: Key<'a>,
        id: KeyspaceId,
    },
    /// Several keys (an `IN` list, an `= ANY` array, or several pinned tables), all on this
    /// shard.
    Keys {
        table: &'a str,
        column: &'a str,
        count: usize,
    },
    /// Only tables that are not in the shard map (or function calls): the default shard.
    Unsharded,
    /// Text the router's SQL parser does not understand and that names no sharded table: the
    /// default shard, so that Postgres judges it.
    Unparsed,
    /// An operator pinned it: `/* shard: RANGE */`, `/* sharding_key: VALUE */`, or `SET
    /// shardgate.shard` / `shardgate.sharding_key`.
    Manual(super::manual::Hint<'a>),
}

/// A read on several shards.
#[derive(Debug, Clone)]
pub struct Read {
    /// In shard order.
    pub shards: Vec<usize>,
    /// Only the shards of the statement's keys (rather than all shards).
    pub keyed: bool,
    /// Sorted, grouped or aggregated by the merge engine; `None`: rows concatenated in shard
    /// order.
    pub merge: Option<Arc<MergePlan>>,
    pub limit: Option<u64>,
    pub offset: u64,
    /// The text the shards run instead of the client's, when the merge needs other columns.
    pub shard_sql: Option<String>,
    /// Each shard's answer comes under a line naming the shard (`EXPLAIN` on several shards).
    pub labels: bool,
    /// A read in two stages ([`crate::planner::staged`]): this read is its first stage, and
    /// one shard runs these texts around its rows.
    pub staged: Option<Arc<StagedTexts>>,
}

impl Read {
    /// All rows of `shards`, concatenated in shard order: what the other fields change.
    pub fn concatenated(shards: Vec<usize>, keyed: bool) -> Read {
        Read {
            shards,
            keyed,
            merge: None,
            limit: None,
            offset: 0,
            shard_sql: None,
            labels: false,
            staged: None,
        }
    }
}

/// An UPDATE or DELETE on several shards.
#[derive(Debug, Clone)]
pub struct Write {
    /// In shard order: the parts run one after another in this order.
    pub shards: Vec<usize>,
    /// Only the shards of the statement's keys (rather than all shards).
    pub keyed: bool,
    /// A write of a reference table: every shard holds the same rows, the first answers.
    pub replicas: bool,
}

/// An INSERT whose keys the router gives (`Route::NewKeys`).
#[derive(Debug, Clone)]
pub struct NewKeys {
    /// The table as named in the map.
    pub table: String,
    /// Its key column.
    pub key: String,
    pub key_type: KeyType,
    /// Its rows (VALUES rows, or UNNEST's elements): one key each.
    pub rows: usize,
    /// `GENERATED ALWAYS`: the INSERT says `OVERRIDING SYSTEM VALUE`.
    pub always: bool,
    /// Keys of this shard (an operator's pin); otherwise of the shard the session's
    /// connection is on, or any.
    pub shard: Option<usize>,
}

/// A statement routed by a lookup column ([`Dest::Lookup`]).
#[derive(Debug, Clone)]
pub struct ByLookup {
    /// `table.column`, for messages and EXPLAIN.
    pub column: String,
    /// The value, as an SQL literal.
    pub value: String,
    /// The lookup table's name, the shard of the value's lookup row, and the SELECT that reads
    /// its keyspace ID there.
    pub lookup_table: String,
    pub shard: usize,
    pub sql: String,
    /// Where the statement runs when no lookup row has the value.
    pub without: Box<Dest>,
}

/// A DELETE from a table with lookup columns, or an UPDATE that sets them
/// ([`Dest::ChangesLookups`]).
#[derive(Debug, Clone)]
pub struct ChangesLookups {
    /// Where it runs, in shard order.
    pub shards: Vec<usize>,
    /// The client's DELETE with `RETURNING` its table's key and lookup columns; or its UPDATE
    /// rewritten to return the key, the lookup columns' new values and their old values.
    pub sql: String,
    pub update: bool,
    pub key_type: KeyType,
    /// The lookup tables, in the order of their columns after the key.
    pub lookups: Vec<shardmap::Table>,
}

/// A multi-row INSERT cut into one INSERT per shard.
#[derive(Debug, Clone)]
pub struct SplitInsert {
    /// (shard, that shard's INSERT), in shard order.
    pub parts: Vec<(usize, String)>,
    /// For each VALUES row of the client's statement, the part that inserts it.
    pub part_of_row: Vec<usize>,
    /// With bound parameters: for each part, the client's parameters (0-based) its `$1`, `$2`,
    /// ... stand for. Empty for literal values (a simple query).
    pub params: Vec<Vec<usize>>,
    /// With bound parameters: for each part, the parameters sent another value than the
    /// client's (a split UNNEST's arrays, cut to the part's rows), in the client's format.
    pub values: Vec<Vec<(usize, Vec<u8>)>>,
    /// For each part: it writes only lookup rows (no row of the client's), so it adds nothing
    /// to the client's answer.
    pub lookup_only: Vec<bool>,
    /// It writes lookup rows (in parts of their own or in front of the rows' INSERTs).
    pub writes_lookups: bool,
}

impl fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let range = |shard: usize| {
            self.map
                .shards()
                .get(shard)
                .map_or_else(|| format!("#{shard}"), |s| s.range.to_string())
        };
        let ranges = |shards: &[usize]| shards.iter().map(|&s| range(s)).collect::<Vec<_>>();
        match &self.dest {
            Dest::Shard(shard) => {
                write!(f, "shard {}: ", range(*shard))?;
                let Some(why) = &self.why else {
                    return f.write_str("chosen by the statement");
                };
                match why {
                    Why::Key {
                        table,
                        column,
                        value,
                        id,
                    } => write!(
                        f,
                        "{table}.{column} = {}, keyspace id {id}",
                        KeyText(value)
                    ),
                    Why::Keys {
                        table,
                        column,
                        count,
                    } => write!(f, "{count} values of {table}.{column}, all in this range"),
                    Why::Unsharded => f.write_str("unsharded tables live on the default shard"),
                    Why::Unparsed => f.write_str(
                        "not understood by the router's parser and names no sharded table; the default shard judges it",
                    ),
                    Why::Manual(super::manual::Hint::Range(r)) => {
                        write!(f, "pinned by the operator (hint shard: {r})")
                    }
                    Why::Manual(super::manual::Hint::Key(k)) => {
                        write!(f, "pinned by the operator (hint sharding_key: {k})")
                    }
                }
            }
            Dest::Lookup(l) => write!(
                f,
                "by lookup: {} = {}, whose lookup row ({}) is on shard {}; the statement runs on the shard of its keyspace ID",
                l.column,
                l.value,
                l.lookup_table,
                range(l.shard)
            ),
            Dest::ChangesLookups(d) => write!(
                f,
                "shards {}: a write that changes the lookup rows of what it changed",
                ranges(&d.shards).join(", ")
            ),
            Dest::Any => f.write_str("any shard: no sharded or unsharded table"),
            Dest::Begin => f.write_str("router: BEGIN; the first statement chooses the shard"),
            Dest::Commit => f.write_str("router: COMMIT on the transaction's shard"),
            Dest::Rollback => f.write_str("router: ROLLBACK on the transaction's shard"),
            Dest::Broadcast => f.write_str("every shard: DDL, each in its own transaction"),
            Dest::Read(r) => {
                write!(
                    f,
                    "shards {} ({}): read, ",
                    ranges(&r.shards).join(", "),
                    if r.keyed { "those of its keys" } else { "all" }
                )?;
                match &r.merge {
                    _ if r.labels => f.write_str("each shard's answer under a line naming it")?,
                    None => f.write_str("rows concatenated in shard order")?,
                    Some(m) if m.group.is_some() => f.write_str("groups combined")?,
                    Some(m) => write!(f, "sorted streams merged on {} keys", m.order.len())?,
                }
                if let Some(limit) = r.limit {
                    write!(f, ", limit {limit}")?;
                }
                if r.offset > 0 {
                    write!(f, ", offset {}", r.offset)?;
                }
                if let Some(sql) = &r.shard_sql {
                    write!(f, "; shards run: {sql}")?;
                }
                if let Some(staged) = &r.staged {
                    write!(
                        f,
                        "; then shard {} runs over those rows as {}: {}{}{}",
                        ranges(r.shards.get(..1).unwrap_or_default()).join(", "),
                        staged.alias,
                        staged.before,
                        staged.alias,
                        staged.after
                    )?;
                }
                Ok(())
            }
            Dest::Write(w) if w.replicas => write!(
                f,
                "shards {} (all): write of a reference table, the same on every shard, committed together; the first shard answers, the others must agree",
                ranges(&w.shards).join(", "),
            ),
            Dest::Write(w) => write!(
                f,
                "shards {} ({}): write, one transaction per shard in shard order, committed together",
                ranges(&w.shards).join(", "),
                if w.keyed { "those of its keys" } else { "all" }
            ),
            Dest::SplitInsert(s) => {
                let shards: Vec<usize> = s.parts.iter().map(|p| p.0).collect();
                write!(
                    f,
                    "shards {}: INSERT of {} rows split by key, one transaction per shard, committed together",
                    ranges(&shards).join(", "),
                    s.part_of_row.len()
                )
            }
            Dest::CopyIn(CopyRows::ByKey { key_type, .. }) => write!(
                f,
                "the shards of its rows: COPY split by its {key_type} key"
            ),
            Dest::CopyIn(CopyRows::ToEveryShard) => f.write_str(
                "every shard: COPY into a reference table, every row to each, all or nothing",
            ),
            Dest::NewKeys(n) => write!(
                f,
                "one shard: the router gives {}.{} to its {} rows, keys of one shard (the transaction's, if it has one)",
                n.table, n.key, n.rows
            ),
            Dest::PreparedSql => f.write_str("router: SQL-level prepared statement"),
            Dest::ExplainRoute => f.write_str("router: EXPLAIN (ROUTE)"),
            Dest::Declare { query, hold, .. } => match &**query {
                Dest::Shard(shard) if !hold => {
                    write!(f, "cursor on shard {}: its query runs there", range(*shard))
                }
                _ => f.write_str("cursor held by the router: its query runs now, its rows are held for FETCH"),
            },
            Dest::Cursor { .. } => f.write_str("where the session's cursor of that name is"),
            Dest::Refused(e) => write!(f, "refused ({}): {}", e.code, e.message),
        }
    }
}

/// A key as SQL would write it.
pub(super) struct KeyText<'k, 'a>(pub(super) &'k Key<'a>);

impl fmt::Display for KeyText<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Key::Int(v) => write!(f, "{v}"),
            Key::Text(s) => write!(f, "'{}'", s.replace('\'', "''")),
            Key::Uuid(u) => {
                for (i, b) in u.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod reroute_tests {
    use super::*;
    use shardmap::{KeyRange, Table};

    #[test]
    fn a_split_shard_is_found_again_by_key_or_as_the_default() {
        let map = ShardMap::even_split(
            &["postgres://h:1/a".into(), "postgres://h:1/b".into()],
            vec![Table::new("kv", "id", KeyType::BigInt)],
        )
        .unwrap();
        let range: KeyRange = map.shards()[0].range;
        let split = map
            .split_shard(&range, "postgres://h:2/c", "postgres://h:3/d")
            .unwrap();
        // A key of the upper half of shard 0 goes to the new shard 1; the default shard
        // (shard 0, split) is the lower half.
        let key = (1i64..)
            .map(Key::Int)
            .find(|k| map.shard_for_key(k) == 0 && split.shard_for_key(k) == 1)
            .unwrap();
        assert_eq!(Reroute::Key(key.keyspace_id()).shard(&split), Some(1));
        assert_eq!(
            Reroute::DefaultShard.shard(&split),
            Some(split.default_shard())
        );
        assert_eq!(
            split.shards()[split.default_shard()].range,
            range.halves().unwrap().0
        );
        assert_eq!(Reroute::No.shard(&split), None);
    }
}
