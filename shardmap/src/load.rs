//! Reading `shardmap.toml`: TOML syntax first, then every field, then the map as a whole.
//!
//! Each problem is reported with the line it is on, so a map with several mistakes is fixed
//! in one pass.

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{line_of, MapError, Problems};
use crate::keyspace::KeyType;
use crate::map::{Lines, Reference, Shard, ShardMap, Table};
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
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShard {
    range: Spanned<String>,
    primary: Spanned<String>,
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
        match KeyType::parse(key_type.get_ref()) {
            Some(kt) => tables.push((Table::new(name, key_name, kt), Lines { item })),
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
