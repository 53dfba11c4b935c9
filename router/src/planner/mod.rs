//! The planner: statement text → where each of its statements must run.
//!
//! Step 2 of the statement path (docs/architecture.md). The text of a Query or Parse message is
//! normalized ([`normalize`]: literals become `$N`), and the normalized text is looked up in a
//! plan cache shared by all sessions ([`cache`]). On a miss it is parsed with `sqlparser`
//! (Postgres dialect) and each statement gets a [`Route`] ([`route`], from the table references
//! and key pins that [`refs`] and [`pins`] find). The key values themselves are not in the plan:
//! a [`KeySource`] says which parameter holds each one, and [`PlanRef`] resolves it against the
//! statement's literals; [`keys`] turns the value into a [`shardmap::Key`].
//!
//! When the normalized text does not parse (typed literals such as `DATE '2020-01-01'` become
//! `DATE $1`, which sqlparser rejects), the normalized entry records that, and the original text
//! is planned and cached under itself, literals kept as literals. Text that does not parse at
//! all is [`Route::Unparsed`]: the caller sends it to the default shard so that Postgres reports
//! the real error (or runs it, if Postgres accepts what sqlparser does not).
//!
//! Sans-IO: nothing here touches a socket, a file or a clock.

mod aggregates;
pub mod arrays;
pub mod cache;
mod colocation;
pub mod cursor;
mod explain;
mod inserts;
pub mod keys;
mod local;
pub mod lookups;
pub mod new_keys;
pub mod normalize;
mod scatter;
mod shard_text;
pub mod staged;

pub use scatter::{Merge, MergePlan};
pub use shard_text::shard_sql;
mod once;
mod pins;
mod placement;
pub mod prepared_sql;
mod reference;
mod refs;
mod route;
mod temporary;
pub mod values;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use shardmap::{KeyType, ShardMap};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

pub use cache::{CacheStats, PlanCache, MAX_CACHED_TEXT};
pub use keys::{key_from_binary, key_from_text, KeyValueError};
pub use normalize::{normalize, normalize_within, LiteralKind, NormalizeBuf};
pub use reference::moving_date;
pub use refs::{KeyDefault, TableFacts};

/// Where one statement must run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// One shard, decided by key values. `table` is the first sharded table the statement
    /// names, as written in the map. There is one key per pinned reference (several for
    /// `key IN (...)` and multi-row INSERTs, or when several sharded tables of the same key
    /// type are each pinned): all of them must land on one shard, which the caller checks.
    Keyed {
        table: String,
        /// The key column of `table`.
        key: String,
        key_type: KeyType,
        keys: Vec<KeySource>,
        /// For a read whose keys may land on several shards (`IN (...)`): how the answers of
        /// all shards merge when run everywhere (rows of a key live only on its shard, so the
        /// other shards add nothing). `None` for writes and reads that cannot merge exactly.
        spread: Option<Merge>,
    },
    /// Touches no user table (`SELECT 1`, `SET`, `SHOW`, catalog queries), or reads only
    /// reference tables: any healthy shard.
    Any,
    /// Touches only tables that are not in the shard map, or calls functions that may: the
    /// map's default shard.
    Default,
    /// An INSERT of VALUES rows into a sharded table whose key column takes its values from a
    /// sequence, leaving the key out: the router gives each row a key from blocks it reserves
    /// for the whole fleet (`routing::ids`), writes them into the text
    /// ([`new_keys::with_keys`]), and routes that.
    NewKeys {
        table: String,
        /// The key column.
        key: String,
        key_type: KeyType,
        rows: NewRows,
        /// `GENERATED ALWAYS AS IDENTITY`: the INSERT needs `OVERRIDING SYSTEM VALUE`.
        always: bool,
    },
    /// A statement of one sharded table without its key whose WHERE fixes a lookup column
    /// (`table`'s unique column routed by `lookup`, a lookup table) to `value`: the session reads
    /// the value's lookup row, then runs the statement on the shard of its keyspace ID as a keyed
    /// statement; without a lookup row it runs as `without` says ([`lookups`]).
    Lookup {
        table: String,
        lookup: shardmap::Table,
        value: KeySource,
        without: Box<Route>,
    },
    /// An INSERT (`route`, keyed) into a table with lookup columns: the lookup rows of its
    /// values are written in the same write as its rows, one list per lookup column.
    WithLookups {
        route: Box<Route>,
        rows: Vec<LookupRows>,
    },
    /// A DELETE (`route`, keyed or on every shard) from a table with lookup columns: it runs
    /// with `RETURNING` its key and those columns, and the lookup rows of the values it removed
    /// are deleted in the same write.
    DeletesLookups {
        route: Box<Route>,
        key_type: KeyType,
        /// The columns it returns: the key, then each lookup column.
        returning: String,
        /// The lookup tables, in the order of their columns in `returning`.
        lookups: Vec<shardmap::Table>,
    },
    /// An UPDATE (`route`, keyed or on every shard) that sets lookup columns of its table:
    /// it runs rewritten to return each changed row's key and the columns' new and old values
    /// ([`lookups::update_returning_old`]), and the lookup rows change in the same write.
    UpdatesLookups {
        route: Box<Route>,
        key_type: KeyType,
        /// The table's alias in the UPDATE, else its name.
        qualifier: String,
        key: String,
        /// The lookup tables of the table's lookup columns.
        lookups: Vec<shardmap::Table>,
    },
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// `COMMIT`, `END`.
    Commit,
    /// `ROLLBACK`, `ABORT` (not `ROLLBACK TO SAVEPOINT`, which is [`Route::Savepoint`]).
    Rollback,
    /// `SAVEPOINT`, `RELEASE`, `ROLLBACK TO`: runs wherever the transaction runs.
    Savepoint,
    /// Names a sharded table but cannot be pinned to one shard (or needs a broadcast that
    /// does not exist yet); the message says why and what would make it routable.
    Unroutable { message: String },
    /// Longer than the planner parses (`[limits] max_plan_bytes`): refused with `54000`.
    TooLong { limit: usize },
    /// DDL that every shard needs: on a sharded table, or schema-wide (schemas, extensions,
    /// functions, types, grants). Run on all shards, answered once.
    Broadcast,
    /// INSERT, UPDATE or DELETE of a reference table (kept whole on every shard): the same
    /// statement on every shard, all or nothing, answered by one.
    Replicated { table: String },
    /// A read of a sharded table without a key whose answers merge exactly: run on every
    /// shard, combined as `merge` says.
    Scatter { table: String, merge: Merge },
    /// UPDATE or DELETE of a sharded table without a key: refused with `message` unless the
    /// client or the config opted in to writes on every shard.
    ScatterWrite { table: String, message: String },
    /// COPY FROM STDIN into a sharded table (rows split by key across shards) or a reference
    /// table (every row to every shard).
    CopyIn(CopyRows),
    /// SQL-level `PREPARE`, `EXECUTE` or `DEALLOCATE`: the session runs it as a protocol-level
    /// statement of the client ([`prepared_sql`]).
    PreparedSql,
    /// `EXPLAIN (ROUTE) statement`: the router answers where the statement (routed as the
    /// inner route) would run, without running it.
    ExplainRoute(Box<Route>),
    /// `DECLARE name CURSOR FOR query`: where `query` would run decides where the cursor lives
    /// (its shard, or the router when the query reads several shards or the cursor is
    /// `WITH HOLD`).
    Declare {
        /// Folded as Postgres folds identifiers.
        name: String,
        hold: bool,
        binary: bool,
        query: Box<Route>,
    },
    /// `FETCH`, `MOVE` or `CLOSE` of a cursor (`name` is `None` for `CLOSE ALL`): it runs
    /// where the session's cursor of that name is.
    Cursor { name: Option<String>, close: bool },
    /// Text that does not parse and names no sharded table: send it to the default shard for
    /// Postgres to judge. (Unparseable text that names a sharded table is `Unroutable`: if
    /// Postgres accepted it, the default shard would answer with only its part of the table.)
    Unparsed,
}

pub use crate::protocol::copy::Format as CopyFormat;

/// Where the rows of a COPY FROM STDIN go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyRows {
    /// Into a sharded table: each row to the shard of its key, read as `format` says.
    ByKey {
        key_type: KeyType,
        format: CopyFormat,
    },
    /// Into a reference table: all of them to every shard, as they come (each shard's COPY
    /// reads its own format), committed together.
    ToEveryShard,
}

/// The values an INSERT gives one lookup column ([`Route::WithLookups`]), and the lookup table
/// they go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupRows {
    pub table: shardmap::Table,
    pub values: LookupValues,
}

/// Where an INSERT's values of a lookup column are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupValues {
    /// One per VALUES row (`None`: NULL, which needs no lookup row).
    Rows(Vec<Option<KeySource>>),
    /// The elements of an UNNEST array, one per row.
    Array(KeySource),
}

/// The rows of an INSERT that leaves out its key ([`Route::NewKeys`]), one new key each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewRows {
    /// This many VALUES rows.
    Values(usize),
    /// `SELECT * FROM UNNEST(arrays)`: as many rows as the longest array has elements (UNNEST
    /// pads the others with NULLs); where each array comes from.
    Unnest(Vec<KeySource>),
}

/// Where a key value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `$n` as a 0-based index into the statement's parameters after normalization: indices
    /// below [`PlanRef::params_before`] (a property of the client's text, not of the shared
    /// plan) are the client's Bind parameters, the rest are the normalized literals in text
    /// order (across all statements of a multi-statement Query).
    Param(usize),
    /// A constant that is part of the planned text itself (plans of un-normalized text, or
    /// literals the normalizer leaves alone).
    Literal(String),
    /// An array of keys (`key = ANY($1)`, `key = ANY('{1,2}')`): the inner source gives the
    /// array value, whose elements are the keys.
    Array(Box<KeySource>),
}

/// The plan of one statement text.
#[derive(Clone, Debug)]
pub struct Plan {
    /// One route per statement, in order. Empty for empty text; a single
    /// [`Route::Unparsed`] when the text does not parse (it cannot be split reliably).
    pub statements: Vec<Route>,
    /// Planned from the normalized text (literals are `KeySource::Param`s), or from the
    /// original text (literals are `KeySource::Literal`s).
    pub normalized: bool,
    /// Marker entry under a normalized text that does not parse: plan the original instead.
    pub(crate) use_original: bool,
    /// Outside a transaction it may share a backend connection with other clients'
    /// statements (`backend::mux`): every statement runs on one shard and leaves nothing
    /// behind on the connection ([`shareable`]).
    pub shareable: bool,
    /// A statement creates a temporary object that outlives its transaction (a temporary
    /// table, view or sequence, `SELECT INTO TEMP`): the session keeps the connection it runs
    /// on for as long as it lasts ([`temporary`]).
    pub keeps_connection: bool,
}

/// A text that is only `BEGIN`, `COMMIT` or `ROLLBACK`: transaction control the router may
/// answer itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Begin,
    Commit,
    Rollback,
}

impl Plan {
    /// The transaction control this plan is, if that is all it is.
    pub fn control(&self) -> Option<Control> {
        match self.statements.as_slice() {
            [Route::Begin] => Some(Control::Begin),
            [Route::Commit] => Some(Control::Commit),
            [Route::Rollback] => Some(Control::Rollback),
            _ => None,
        }
    }
}

#[cfg(test)]
impl Plan {
    /// A plan of no statements, for tests of what holds plans.
    pub(crate) fn empty() -> Arc<Plan> {
        Arc::new(Plan {
            statements: Vec::new(),
            normalized: true,
            use_original: false,
            shareable: false,
            keeps_connection: false,
        })
    }
}

/// A key value to hash, once resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyValue<'a> {
    /// Bind parameter `i` (0-based), in whatever format the client sent it.
    Bind(usize),
    /// A literal's text form.
    Text(&'a str),
}

/// A plan together with the literal values of the statement it was looked up for.
pub struct PlanRef<'b> {
    plan: Arc<Plan>,
    buf: &'b NormalizeBuf,
    /// The plan came from a cache (it was not parsed for this statement).
    pub cached: bool,
}

impl PlanRef<'_> {
    /// The shared plan (the same `Arc` for every text with the same shape).
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    pub fn statements(&self) -> &[Route] {
        &self.plan.statements
    }

    /// How many `$n` the client's own text had. Texts that differ only in literals share one
    /// plan, but not this: `id = $1` from a Parse and `id = 5` from a Query normalize alike.
    pub fn params_before(&self) -> usize {
        self.buf.params_before()
    }

    /// Literal `i` of this statement's text (0-based, text order).
    pub fn literal(&self, i: usize) -> Option<&str> {
        self.buf.literal(i)
    }

    /// Where the value of `source` is: a Bind parameter or a literal's text. `None` only if
    /// the source does not fit this text (a `$n` past both parameters and literals).
    pub fn key_value<'s>(&'s self, source: &'s KeySource) -> Option<KeyValue<'s>> {
        match source {
            KeySource::Literal(text) => Some(KeyValue::Text(text)),
            KeySource::Param(i) if *i < self.params_before() => Some(KeyValue::Bind(*i)),
            KeySource::Param(i) if self.plan.normalized => self
                .buf
                .literal(i - self.params_before())
                .map(KeyValue::Text),
            KeySource::Param(_) | KeySource::Array(_) => None,
        }
    }
}

impl std::ops::Deref for PlanRef<'_> {
    type Target = Plan;
    fn deref(&self) -> &Plan {
        &self.plan
    }
}

/// The statement an `EXPLAIN (ROUTE, ...) statement` text explains: the text after the option
/// list, when the options name ROUTE.
pub fn explain_route_inner(sql: &str) -> Option<&str> {
    let rest = sql.trim_start();
    let head = rest.get(..7)?;
    if !head.eq_ignore_ascii_case("explain") {
        return None;
    }
    let rest = rest[7..].trim_start().strip_prefix('(')?;
    let close = rest.find(')')?;
    let names_route = rest[..close].split(',').any(|o| {
        o.split_whitespace()
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case("route"))
    });
    names_route.then(|| rest[close + 1..].trim())
}

/// Plans statements against one shard map; shared by all sessions of a router.
pub struct Planner {
    map: Arc<ShardMap>,
    cache: PlanCache,
    /// This planner among the process's planners, for the threads' own caches ([`local`]).
    id: u64,
    /// Bumped whenever cached plans become stale.
    generation: std::sync::atomic::AtomicU64,
    local_hits: local::Hits,
    /// Learned from a shard's catalog; replaced as a whole (and the cache emptied) when it
    /// changes, so plans never mix two versions.
    learned: std::sync::RwLock<refs::Learned>,
    /// Normalized texts longer than this are not parsed ([`Route::TooLong`]).
    max_parse: usize,
}

impl Planner {
    /// A planner with room for about `capacity` cached plans (and 64 MiB of them).
    pub fn new(map: Arc<ShardMap>, capacity: usize) -> Planner {
        Self::with_limits(map, capacity, 64 << 20)
    }

    /// A planner with room for about `capacity` cached plans and `bytes` bytes of them
    /// (`limits.plan_cache_size`, `limits.plan_cache_bytes`).
    pub fn with_limits(map: Arc<ShardMap>, capacity: usize, bytes: usize) -> Planner {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Planner {
            map,
            cache: PlanCache::new(capacity, bytes),
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: Default::default(),
            local_hits: Default::default(),
            learned: Default::default(),
            max_parse: usize::MAX,
        }
    }

    /// Parses statements whose normalized text is at most `bytes` bytes
    /// (`limits.max_plan_bytes`); longer ones plan to [`Route::TooLong`] (the normalizer stops
    /// at the bound). A parse costs tens of times the text in memory (every token and
    /// node its own allocation) and holds the worker thread: a 15 MB `IN` list took 1.2 GB
    /// and 13 s before this bound.
    pub fn parsing_at_most(mut self, bytes: usize) -> Planner {
        self.max_parse = bytes;
        self
    }

    /// What a shard's catalog says about each sharded table (table name as in the map): where
    /// its key is among its columns (for INSERTs without a column list), whether the key comes
    /// from a sequence (for INSERTs that leave it out). Empties the plan cache: plans made
    /// without it (or with an older catalog) are planned again.
    pub fn learn_tables(&self, tables: std::collections::HashMap<String, TableFacts>) {
        *self.learned.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tables);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        self.cache.clear();
    }

    pub fn map(&self) -> &Arc<ShardMap> {
        &self.map
    }

    /// Which planner and which generation of its plans: a plan made under another epoch may
    /// be stale.
    pub fn epoch(&self) -> (u64, u64) {
        (
            self.id,
            self.generation.load(std::sync::atomic::Ordering::Acquire),
        )
    }

    /// Hits count both the shared cache and the threads' own.
    pub fn cache_stats(&self) -> CacheStats {
        let mut stats = self.cache.stats();
        stats.hits += self.local_hits.total();
        stats
    }

    /// Plans `sql` (the text of a Query or Parse message). `buf` is the caller's reusable
    /// scratch and holds this statement's literal values until the next call. A hit in the
    /// thread's own cache takes no lock and allocates nothing once `buf` has grown to fit.
    pub fn plan<'b>(&self, sql: &str, buf: &'b mut NormalizeBuf) -> PlanRef<'b> {
        normalize_within(sql, buf, self.max_parse);
        let buf: &'b NormalizeBuf = buf;
        if buf.too_long() {
            return PlanRef {
                plan: Arc::new(self.too_long()),
                buf,
                cached: false,
            };
        }
        let text = buf.normalized();
        let owner = (
            self.id,
            self.generation.load(std::sync::atomic::Ordering::Acquire),
        );
        if let Some(plan) = local::get(owner, text, &self.local_hits) {
            return PlanRef {
                plan,
                buf,
                cached: true,
            };
        }
        let (mut plan, cached) = self.cached_or_built(text, buf, true);
        if !plan.use_original && self.cache.keeps_plans() {
            // Plans of original texts (literals kept) are per text: not worth a thread's room.
            plan = local::put(owner, text, &plan);
        }
        let (plan, cached) = if plan.use_original {
            self.cached_or_built(sql, buf, false)
        } else {
            (plan, cached)
        };
        PlanRef { plan, buf, cached }
    }

    /// The shared cache's plan of `text`, or a new one (then cached); `true` when it was cached.
    fn cached_or_built(
        &self,
        text: &str,
        buf: &NormalizeBuf,
        normalized: bool,
    ) -> (Arc<Plan>, bool) {
        match self.cache.get(text) {
            Some(plan) => (plan, true),
            None => (
                self.cache
                    .insert(text, Arc::new(self.build(text, buf, normalized))),
                false,
            ),
        }
    }

    /// The plan of a text longer than the planner parses.
    fn too_long(&self) -> Plan {
        Plan {
            statements: vec![Route::TooLong {
                limit: self.max_parse,
            }],
            normalized: false,
            use_original: false,
            shareable: false,
            keeps_connection: false,
        }
    }

    fn build(&self, text: &str, buf: &NormalizeBuf, normalized: bool) -> Plan {
        let learned = self
            .learned
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(command) = cursor::command(text) {
            return Plan {
                statements: vec![Route::Cursor {
                    close: command.verb == cursor::Verb::Close,
                    name: command.name,
                }],
                normalized,
                use_original: false,
                shareable: false,
                keeps_connection: false,
            };
        }
        match Parser::parse_sql(&PostgreSqlDialect {}, text) {
            // `ORDER BY 1` / `GROUP BY 1` name columns by position, which normalization turned
            // into `$n`: only the original text says which column.
            Ok(statements)
                if normalized
                    && buf.literal_count() > 0
                    && statements.iter().any(scatter::positions_normalized) =>
            {
                Plan {
                    statements: Vec::new(),
                    normalized,
                    use_original: true,
                    shareable: false,
                    keeps_connection: false,
                }
            }
            Ok(parsed) => {
                let statements: Vec<Route> = parsed
                    .iter()
                    .map(|s| route::route(s, &self.map, &learned))
                    .collect();
                Plan {
                    shareable: shareable(&parsed, &statements, text),
                    keeps_connection: parsed.iter().any(temporary::outlives_transaction),
                    statements,
                    normalized,
                    use_original: false,
                }
            }
            // Normalization may have broken it: try the original (unless they are the same).
            Err(_) if normalized && buf.literal_count() > 0 => Plan {
                statements: Vec::new(),
                normalized,
                use_original: true,
                shareable: false,
                keeps_connection: false,
            },
            Err(e) => Plan {
                statements: vec![route::unparsed(text, &self.map, &e.to_string())],
                normalized,
                use_original: false,
                shareable: false,
                // What cannot be parsed may make one: keeping a connection costs only that.
                keeps_connection: temporary::mentioned(text),
            },
        }
    }
}

/// Whether statements `parsed`, routed as `routes`, may share a backend connection: each is a
/// query, INSERT, UPDATE or DELETE that runs on one shard (by key, any, or the default shard),
/// and no word of `text` (literals are normalized away) can leave state on the connection for
/// whoever runs next: `set_config`, advisory locks (any function with `advisory` in its name),
/// temporary tables (a user function that calls `set_config` cannot be seen here). Settings, COPY, LISTEN,
/// transaction control, cursors and SQL `PREPARE` are other statements.
pub fn shareable(parsed: &[sqlparser::ast::Statement], routes: &[Route], text: &str) -> bool {
    use sqlparser::ast::Statement;
    !routes.is_empty()
        && routes
            .iter()
            .all(|r| matches!(r, Route::Keyed { .. } | Route::Any | Route::Default))
        && parsed.iter().all(|s| {
            matches!(
                s,
                Statement::Query(_)
                    | Statement::Insert(_)
                    | Statement::Update { .. }
                    | Statement::Delete(_)
            )
        })
        && !temporary::mentioned(text)
        && !text
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .any(|w| {
                w.eq_ignore_ascii_case("set_config") || w.to_ascii_lowercase().contains("advisory")
            })
}
