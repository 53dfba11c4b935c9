//! Reading `shardmap.toml`: TOML syntax first, then every field, then the map as a whole.
//!
//! Each problem is reported with the line it is on, so a map with several mistakes is fixed
//! in one pass.

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{line_of, MapError, Problems};
use crate::keyspace::KeyType;
use crate::map::{Lines, Lookup, Reference, Shard, ShardMap, Table};
use crate::primary::Primary;
use crate::range::KeyRange;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMap {
    version: Spanned<i64>,
    default_shard: Option<Spanned<String>>,
    #[serde(default)]
    tables: Vec<Spanned<RawTable>>,
    #[serde(default)]
    shards: Vec<Spanned<RawShard>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    name: Spanned<String>,
    key: Option<Spanned<String>>,
    #[serde(rename = "type")]
    key_type: Option<Spanned<String>>,
    /// A reference table: whole on every shard, no key.
    #[serde(default)]
    reference: bool,
    /// Unique columns routed by a lookup table: column name to type.
    lookup: Option<Spanned<std::collections::BTreeMap<String, String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShard {
    range: Spanned<String>,
    primary: Spanned<String>,
}

/// The lookups of table `name` (keyed by `key`) from its `lookup = { column = "type", ... }`.
fn lookups(
    name: &str,
    key: &str,
    raw: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<Lookup>, String> {
    let mut out = Vec::with_capacity(raw.len());
    for (column, type_name) in raw {
        let column = column.trim();
        if column.is_empty() || column == key {
            return Err(format!(
                "table {name:?}: lookup column {column:?} must be a column other than the key {key:?}"
            ));
        }
        let Some(key_type) = KeyType::parse(type_name) else {
            return Err(format!(
                "table {name:?}: lookup column {column:?} has type {type_name:?}, which cannot route; use one of: {}",
                KeyType::ACCEPTED
            ));
        };
        let lookup = Lookup {
            column: column.to_string(),
            key_type,
        };
        let table = Table::new(name, key, key_type).lookup_table(&lookup);
        // Postgres cuts longer names to 63 bytes, which could make two lookups one table.
        if table.name.len() > 63 {
            return Err(format!(
                "table {name:?}: the lookup table of {column:?} would be named {:?}, longer than Postgres's 63 bytes; shorten the table or column name",
                table.name
            ));
        }
        out.push(lookup);
    }
    Ok(out)
}

/// Reads and validates a shard map file.
pub fn load(path: &Path) -> Result<ShardMap, MapError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| MapError::single(&origin, 0, format!("cannot read the shard map: {e}")))?;
    parse(&text, &origin)
}

/// Parses and validates shard map text; `origin` names it in errors (usually the file path).
pub fn parse(text: &str, origin: &str) -> Result<ShardMap, MapError> {
    let raw: RawMap = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| line_of(text, s.start));
        MapError::single(origin, line, e.message().trim().to_string())
    })?;
    let line = |span: std::ops::Range<usize>| line_of(text, span.start);
    let mut problems = Problems::default();

    let version = raw.version.get_ref();
    let version = if *version < 0 {
        problems.add(
            line(raw.version.span()),
            format!("version must be 0 or more, not {version}"),
        );
        0
    } else {
        *version as u64
    };

    let mut tables = Vec::new();
    let mut references = Vec::new();
    for t in &raw.tables {
        let item = line(t.span());
        let t = t.get_ref();
        let name = t.name.get_ref().trim();
        if name.is_empty() || name.starts_with('.') || name.ends_with('.') {
            problems.add(
                line(t.name.span()),
                format!("table name {name:?} is not a table name"),
            );
            continue;
        }
        if let (true, Some(lookup)) = (t.reference, &t.lookup) {
            problems.add(
                line(lookup.span()),
                format!("table {name:?} is a reference table (whole on every shard): any shard answers for any value, so it needs no `lookup`"),
            );
            continue;
        }
        if t.reference {
            match t.key.as_ref().or(t.key_type.as_ref()) {
                Some(field) => problems.add(
                    line(field.span()),
                    format!("table {name:?} is a reference table (whole on every shard), which has no sharding key: remove `key` and `type`, or `reference = true`"),
                ),
                None => references.push((Reference::new(name), Lines { item })),
            }
            continue;
        }
        let (Some(key), Some(key_type)) = (&t.key, &t.key_type) else {
            problems.add(
                item,
                format!("table {name:?} needs its key column in `key` and the key's type in `type` (or `reference = true` for a table kept whole on every shard)"),
            );
            continue;
        };
        let key_name = key.get_ref().trim();
        if key_name.is_empty() {
            problems.add(
                line(key.span()),
                format!("table {name:?} needs its key column in `key`"),
            );
            continue;
        }
        let lookups = match &t.lookup {
            None => Vec::new(),
            Some(l) => match lookups(name, key_name, l.get_ref()) {
                Ok(lookups) => lookups,
                Err(why) => {
                    problems.add(line(l.span()), why);
                    continue;
                }
            },
        };
        match KeyType::parse(key_type.get_ref()) {
            Some(kt) => tables.push((
                Table::new(name, key_name, kt).with_lookups(lookups),
                Lines { item },
            )),
            None => problems.add(
                line(key_type.span()),
                format!(
                    "table {name:?} has key type {:?}, which cannot be a sharding key; use one of: {}",
                    key_type.get_ref(),
                    KeyType::ACCEPTED
                ),
            ),
        }
    }

    let mut lookup_names = std::collections::HashMap::new();
    for (t, lines) in &tables {
        for l in &t.lookups {
            let table = t.lookup_table(l).name;
            if let Some(other) = lookup_names.insert(table.clone(), t.qualified_name()) {
                problems.add(
                    lines.item,
                    format!("the lookups of tables {other:?} and {:?} would both be the table shardgate.{table}: rename a column or table", t.qualified_name()),
                );
            }
        }
    }

    let mut shards = Vec::new();
    for s in &raw.shards {
        let item = line(s.span());
        let s = s.get_ref();
        let range = KeyRange::parse(s.range.get_ref());
        let primary = Primary::parse(s.primary.get_ref());
        if let Err(e) = &range {
            problems.add(line(s.range.span()), e.to_string());
        }
        if let Err(e) = &primary {
            problems.add(line(s.primary.span()), e.clone());
        }
        match (range, primary) {
            (Ok(range), Ok(primary)) => shards.push((Shard { range, primary }, Lines { item })),
            _ => problems.shards_dropped = true,
        }
    }

    let default_shard = match &raw.default_shard {
        None => None,
        Some(d) => match KeyRange::parse(d.get_ref()) {
            Ok(r) => Some((r, line(d.span()))),
            Err(e) => {
                problems.add(line(d.span()), format!("default_shard: {e}"));
                None
            }
        },
    };

    ShardMap::build(
        origin,
        version,
        tables,
        references,
        shards,
        default_shard,
        problems,
    )
}
