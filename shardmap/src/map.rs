//! The shard map: which tables are sharded by which key, and which primary owns which range.
//!
//! A `ShardMap` is immutable and always valid: ranges are sorted, cover the whole keyspace and
//! never overlap. It is built by [`ShardMap::new`] (which checks all of that) and read by
//! routers on the hot path through [`ShardMap::shard_for`], a binary search that allocates
//! nothing.

use std::fmt::Write as _;

use crate::error::{MapError, Problems};
use crate::keyspace::{Key, KeyType, KeyspaceId};
use crate::primary::Primary;
use crate::range::KeyRange;

/// A sharded table and its sharding key column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Schema, when the map names one (`app.kv`); an unqualified table matches any schema.
    pub schema: Option<String>,
    pub name: String,
    pub key: String,
    pub key_type: KeyType,
    /// Unique columns other than the key that statements may be routed by (`lookup = { email =
    /// "text" }`): each has a lookup table from the column's value to the row's keyspace ID.
    pub lookups: Vec<Lookup>,
}

/// A unique column of a sharded table that routes by a lookup table: `shardgate.<table>` (see
/// [`Table::lookup_table`]), which holds one row per value (the column's value, the keyspace ID
/// of the row that has it), sharded by the value itself as any sharded table is by its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub column: String,
    /// The column's type: how its values hash to the shard of their lookup row.
    pub key_type: KeyType,
}

/// The schema that holds what routers create on the shards (lookup tables among them).
pub const ROUTER_SCHEMA: &str = "shardgate";

impl Table {
    /// A table from its possibly schema-qualified name.
    pub fn new(name: &str, key: &str, key_type: KeyType) -> Table {
        let (schema, name) = split_name(name);
        Table {
            schema,
            name,
            key: key.to_string(),
            key_type,
            lookups: Vec::new(),
        }
    }

    /// The table with `lookups`.
    pub fn with_lookups(self, lookups: Vec<Lookup>) -> Table {
        Table { lookups, ..self }
    }

    /// The lookup table of `lookup`, itself a sharded table: `shardgate.lookup_<schema>_<table>_<column>`,
    /// its key the column (same name, same type), with one more column, `keyspace_id bigint`.
    pub fn lookup_table(&self, lookup: &Lookup) -> Table {
        let mut name = String::from("lookup_");
        if let Some(schema) = &self.schema {
            name.push_str(schema);
            name.push('_');
        }
        name.push_str(&self.name);
        name.push('_');
        name.push_str(&lookup.column);
        Table::new(
            &format!("{ROUTER_SCHEMA}.{name}"),
            &lookup.column,
            lookup.key_type,
        )
    }

    /// The lookup of `column`, if the map declares one.
    pub fn lookup(&self, column: &str) -> Option<&Lookup> {
        self.lookups.iter().find(|l| l.column == column)
    }

    /// The name as written in the map (`schema.name` or `name`).
    pub fn qualified_name(&self) -> String {
        qualified(self.schema.as_deref(), &self.name)
    }

    /// The name as SQL must write it to mean this table (each part quoted where needed).
    pub fn quoted_name(&self) -> String {
        quoted(self.schema.as_deref(), &self.name)
    }

    /// Whether a statement's reference to `schema.name` means this table.
    pub fn matches(&self, schema: Option<&str>, name: &str) -> bool {
        same_table(self.schema.as_deref(), &self.name, schema, name)
    }
}

/// A reference table: no sharding key; every shard holds all of its rows. Writes go to every
/// shard (all or nothing), reads to any one, and a join with a sharded table runs where the
/// sharded rows are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// Schema, when the map names one; an unqualified table matches any schema.
    pub schema: Option<String>,
    pub name: String,
}

impl Reference {
    /// A reference table from its possibly schema-qualified name.
    pub fn new(name: &str) -> Reference {
        let (schema, name) = split_name(name);
        Reference { schema, name }
    }

    /// The name as written in the map.
    pub fn qualified_name(&self) -> String {
        qualified(self.schema.as_deref(), &self.name)
    }

    /// The name as SQL must write it to mean this table.
    pub fn quoted_name(&self) -> String {
        quoted(self.schema.as_deref(), &self.name)
    }

    /// Whether a statement's reference to `schema.name` means this table.
    pub fn matches(&self, schema: Option<&str>, name: &str) -> bool {
        same_table(self.schema.as_deref(), &self.name, schema, name)
    }
}

fn split_name(name: &str) -> (Option<String>, String) {
    match name.rsplit_once('.') {
        Some((s, n)) => (Some(s.to_string()), n.to_string()),
        None => (None, name.to_string()),
    }
}

fn qualified(schema: Option<&str>, name: &str) -> String {
    match schema {
        Some(s) => format!("{s}.{name}"),
        None => name.to_string(),
    }
}

fn quoted(schema: Option<&str>, name: &str) -> String {
    let name = crate::sql::quote_ident(name);
    match schema {
        Some(s) => format!("{}.{name}", crate::sql::quote_ident(s)),
        None => name,
    }
}

/// Whether a name in a statement (`schema.name`) means a map entry's (`mine_schema.mine`): an
/// unqualified name on either side matches any schema.
fn same_table(mine_schema: Option<&str>, mine: &str, schema: Option<&str>, name: &str) -> bool {
    mine == name
        && match (mine_schema, schema) {
            (Some(m), Some(t)) => m == t,
            _ => true,
        }
}

/// Reports every table the map lists twice (sharded or reference, by the same name).
fn listed_twice(
    tables: &[(Table, Lines)],
    references: &[(Reference, Lines)],
    problems: &mut Problems,
) {
    let names: Vec<(Option<&str>, &str, usize)> = tables
        .iter()
        .map(|(t, l)| (t.schema.as_deref(), t.name.as_str(), l.item))
        .chain(
            references
                .iter()
                .map(|(r, l)| (r.schema.as_deref(), r.name.as_str(), l.item)),
        )
        .collect();
    for (i, &(schema, name, line)) in names.iter().enumerate() {
        for &(other_schema, other, other_line) in &names[..i] {
            if same_table(schema, name, other_schema, other) {
                problems.add(
                    line,
                    format!(
                        "table {:?} is listed twice (also as {:?} at line {other_line}); a table is either sharded by one key or a reference table",
                        qualified(schema, name),
                        qualified(other_schema, other),
                    ),
                );
            }
        }
    }
}

/// One shard: a range of the keyspace and the Postgres primary that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub range: KeyRange,
    pub primary: Primary,
}

/// A validated shard map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    version: u64,
    default_shard: usize,
    tables: Vec<Table>,
    /// The lookup tables of `tables`' lookups ([`Table::lookup_table`]): sharded by their values,
    /// found by [`ShardMap::table`] like the tables the map names, never written back to TOML.
    lookups: Vec<Table>,
    references: Vec<Reference>,
    shards: Vec<Shard>,
    /// `shards[i].range.start`, kept apart so the lookup scans a dense array.
    starts: Vec<u64>,
}

/// Where each input came from, for error messages; `0` when it has no line (generated maps).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Lines {
    pub item: usize,
}

impl ShardMap {
    /// Builds and validates a map. `default_shard` must be the exact range of one shard; `None`
    /// picks the first shard (the one holding keyspace ID 0).
    pub fn new(
        version: u64,
        tables: Vec<Table>,
        shards: Vec<Shard>,
        default_shard: Option<KeyRange>,
    ) -> Result<ShardMap, MapError> {
        let table_lines = vec![Lines::default(); tables.len()];
        let shard_lines = vec![Lines::default(); shards.len()];
        Self::build(
            "<generated shard map>",
            version,
            tables.into_iter().zip(table_lines).collect(),
            Vec::new(),
            shards.into_iter().zip(shard_lines).collect(),
            default_shard.map(|r| (r, 0)),
            Problems::default(),
        )
    }

    /// The shared checks of [`ShardMap::new`] and the file loader; `problems` may already
    /// hold what the loader found.
    pub(crate) fn build(
        origin: &str,
        version: u64,
        tables: Vec<(Table, Lines)>,
        references: Vec<(Reference, Lines)>,
        mut shards: Vec<(Shard, Lines)>,
        default_shard: Option<(KeyRange, usize)>,
        mut problems: Problems,
    ) -> Result<ShardMap, MapError> {
        listed_twice(&tables, &references, &mut problems);

        // Shards that failed to parse are already reported; coverage checks would only
        // report their absence again.
        if problems.shards_dropped {
            return problems.into_result(origin, ShardMap::empty());
        }
        if shards.is_empty() {
            problems.add(
                1,
                "the map has no [[shards]]: add at least one, e.g. range = \"-\"",
            );
            return problems.into_result(origin, ShardMap::empty());
        }
        shards.sort_by_key(|(s, _)| (s.range.start, s.range.end_u128()));
        let describe = |(s, l): &(Shard, Lines)| {
            if l.item > 0 {
                format!("shard {} (line {})", s.range, l.item)
            } else {
                format!("shard {}", s.range)
            }
        };
        let first = &shards[0];
        if first.0.range.start != 0 {
            problems.add(
                first.1.item,
                format!(
                    "no shard covers the start of the keyspace: {} starts at {:016x}; the first range must start empty, as in \"-{}\"",
                    describe(first),
                    first.0.range.start,
                    KeyRange { start: 0, end: Some(first.0.range.start) }.to_string().trim_start_matches('-')
                ),
            );
        }
        for pair in shards.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let a_end = a.0.range.end_u128();
            let b_start = u128::from(b.0.range.start);
            if a.0.range.overlaps(&b.0.range) {
                problems.add(
                    b.1.item,
                    format!(
                        "{} overlaps {}: every keyspace ID must belong to exactly one shard",
                        describe(b),
                        describe(a)
                    ),
                );
            } else if a_end < b_start {
                let gap = KeyRange {
                    start: a_end as u64,
                    end: Some(b.0.range.start),
                };
                problems.add(
                    b.1.item,
                    format!(
                        "keyspace IDs in {gap} belong to no shard: there is a gap between {} and {}",
                        describe(a),
                        describe(b)
                    ),
                );
            }
        }
        // Overlaps can hide the true end; the shard reaching furthest decides coverage.
        let furthest = shards
            .iter()
            .max_by_key(|(s, _)| s.range.end_u128())
            .unwrap_or(first);
        if furthest.0.range.end.is_some() {
            problems.add(
                furthest.1.item,
                format!(
                    "no shard covers the end of the keyspace: the last range {} must end open, as in \"{}-\"",
                    furthest.0.range,
                    furthest.0.range.to_string().split('-').next().unwrap_or("")
                ),
            );
        }
        for (i, (shard, lines)) in shards.iter().enumerate() {
            for (other, other_lines) in &shards[..i] {
                if other.primary.endpoint() == shard.primary.endpoint() {
                    problems.add(
                        lines.item,
                        format!(
                            "shard {} uses the same database as shard {} (line {}): {}; each shard needs its own database",
                            shard.range,
                            other.range,
                            other_lines.item,
                            shard.primary.endpoint()
                        ),
                    );
                }
            }
        }

        let default_index = match default_shard {
            None => 0,
            Some((range, line)) => match shards.iter().position(|(s, _)| s.range == range) {
                Some(i) => i,
                None => {
                    problems.add(
                        line,
                        format!("default_shard {range:?} is not the range of any shard; use one of the [[shards]] ranges exactly", range = range.to_string()),
                    );
                    0
                }
            },
        };

        let shards: Vec<Shard> = shards.into_iter().map(|(s, _)| s).collect();
        let tables: Vec<Table> = tables.into_iter().map(|(t, _)| t).collect();
        let map = ShardMap {
            version,
            default_shard: default_index,
            lookups: tables
                .iter()
                .flat_map(|t| t.lookups.iter().map(|l| t.lookup_table(l)))
                .collect(),
            tables,
            references: references.into_iter().map(|(r, _)| r).collect(),
            starts: shards.iter().map(|s| s.range.start).collect(),
            shards,
        };
        problems.into_result(origin, map)
    }

    fn empty() -> ShardMap {
        ShardMap {
            version: 0,
            default_shard: 0,
            tables: Vec::new(),
            lookups: Vec::new(),
            references: Vec::new(),
            shards: Vec::new(),
            starts: Vec::new(),
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Shards in keyspace order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn tables(&self) -> &[Table] {
        &self.tables
    }

    /// The lookup tables of every lookup the map declares (see [`Lookup`]), each with the
    /// table it serves.
    pub fn lookup_tables(&self) -> impl Iterator<Item = (&Table, &Lookup, Table)> {
        self.tables
            .iter()
            .flat_map(|t| t.lookups.iter().map(move |l| (t, l, t.lookup_table(l))))
    }

    /// The reference tables: whole on every shard.
    pub fn references(&self) -> &[Reference] {
        &self.references
    }

    /// The reference table a statement's `schema.name` refers to, if any.
    pub fn reference(&self, schema: Option<&str>, name: &str) -> Option<&Reference> {
        self.references.iter().find(|r| r.matches(schema, name))
    }

    /// This map with these reference tables (none may also be a sharded table).
    pub fn with_references(self, references: Vec<Reference>) -> Result<ShardMap, MapError> {
        let lines = |n: usize| vec![Lines::default(); n];
        let n = references.len();
        Self::build(
            "<generated shard map>",
            self.version,
            self.tables
                .iter()
                .cloned()
                .zip(lines(self.tables.len()))
                .collect(),
            references.into_iter().zip(lines(n)).collect(),
            self.shards
                .iter()
                .cloned()
                .zip(lines(self.shards.len()))
                .collect(),
            self.shards.get(self.default_shard).map(|s| (s.range, 0)),
            Problems::default(),
        )
    }

    /// Index of the shard where unsharded tables live.
    pub fn default_shard(&self) -> usize {
        self.default_shard
    }

    /// The sharded table a statement's `schema.name` refers to, if any.
    pub fn table(&self, schema: Option<&str>, name: &str) -> Option<&Table> {
        self.tables
            .iter()
            .chain(&self.lookups)
            .find(|t| t.matches(schema, name))
    }

    /// Looks a table up by the name written in the map (`kv` or `app.kv`).
    pub fn table_by_name(&self, qualified: &str) -> Option<&Table> {
        let (schema, name) = match qualified.rsplit_once('.') {
            Some((s, n)) => (Some(s), n),
            None => (None, qualified),
        };
        self.table(schema, name)
    }

    /// Index of the shard that owns a keyspace ID: O(log S), no allocation.
    #[inline]
    pub fn shard_for(&self, id: KeyspaceId) -> usize {
        // starts[0] == 0 in every valid map, so at least one start is <= id.
        self.starts.partition_point(|&s| s <= id.0) - 1
    }

    /// Index of the shard that owns a key.
    #[inline]
    pub fn shard_for_key(&self, key: &Key<'_>) -> usize {
        self.shard_for(key.keyspace_id())
    }

    /// Index of the shard with exactly this range.
    pub fn shard_by_range(&self, range: &KeyRange) -> Option<usize> {
        self.shards.iter().position(|s| &s.range == range)
    }

    /// The map with a new version number, everything else equal.
    pub fn with_version(mut self, version: u64) -> ShardMap {
        self.version = version;
        self
    }

    /// The map in `shardmap.toml` form; [`crate::load::parse`] reads it back to an equal map.
    pub fn to_toml(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let mut out = String::new();
        let _ = writeln!(out, "# shardgate shard map: see docs/shardmap.md");
        let _ = writeln!(out, "version = {}", self.version);
        let _ = writeln!(
            out,
            "default_shard = {}",
            q(&self.shards[self.default_shard].range.to_string())
        );
        for t in &self.tables {
            let _ = writeln!(out, "\n[[tables]]");
            let _ = writeln!(out, "name = {}", q(&t.qualified_name()));
            let _ = writeln!(out, "key = {}", q(&t.key));
            let _ = writeln!(out, "type = {}", q(t.key_type.name()));
            if !t.lookups.is_empty() {
                let each: Vec<String> = t
                    .lookups
                    .iter()
                    .map(|l| format!("{} = {}", q(&l.column), q(l.key_type.name())))
                    .collect();
                let _ = writeln!(out, "lookup = {{ {} }}", each.join(", "));
            }
        }
        for r in &self.references {
            let _ = writeln!(out, "\n[[tables]]");
            let _ = writeln!(out, "name = {}", q(&r.qualified_name()));
            let _ = writeln!(out, "reference = true");
        }
        for s in &self.shards {
            let _ = writeln!(out, "\n[[shards]]");
            let _ = writeln!(out, "range = {}", q(&s.range.to_string()));
            let _ = writeln!(out, "primary = {}", q(s.primary.url()));
        }
        out
    }
}
