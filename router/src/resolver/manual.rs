//! Statements pinned to one shard by hand, for maintenance (to repair one shard) and for
//! statements the router cannot route by itself: a leading comment, `/* shard: RANGE */` or
//! `/* sharding_key: VALUE */`, or the session settings `shardgate.shard` and
//! `shardgate.sharding_key`. A comment wins over the settings, a range over a key. With
//! `[hints] allow = "admins"` only admin users may pin.

use shardmap::{Key, KeyType, ShardMap};

use crate::errors;
use crate::protocol::reply::SqlError;

/// The session setting that pins a client's statements to the shard of a range.
pub const SETTING: &str = "shardgate.shard";

/// The session setting that pins a client's statements to the shard of a key.
pub const KEY_SETTING: &str = "shardgate.sharding_key";

/// What the session says about pinning by hand.
#[derive(Clone, Copy, Debug)]
pub struct Pins<'a> {
    /// The SQL value of `shardgate.shard`, e.g. `'80-'`.
    pub shard: Option<&'a str>,
    /// The SQL value of `shardgate.sharding_key`, e.g. `'42'`.
    pub key: Option<&'a str>,
    /// This client may pin (`[hints] allow`).
    pub allowed: bool,
}

impl Default for Pins<'_> {
    fn default() -> Self {
        Pins {
            shard: None,
            key: None,
            allowed: true,
        }
    }
}

/// What pinned a statement, as the operator wrote it (for `EXPLAIN (ROUTE)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint<'a> {
    /// A shard's range.
    Range(&'a str),
    /// A key value, whose shard it is.
    Key(&'a str),
}

/// The shard an operator pinned `sql` to, and by what: its leading comment, or else the
/// session's settings. `None` when nothing names one (or a setting is empty); an error when
/// the range is not one of the map's shards, the key is not a key, or the client may not pin.
pub fn pinned<'a>(
    sql: &'a str,
    pins: Pins<'a>,
    map: &ShardMap,
) -> Result<Option<(usize, Hint<'a>)>, SqlError> {
    let comment = sql
        .trim_start()
        .strip_prefix("/*")
        .and_then(|rest| rest.split_once("*/"))
        .map(|(inside, _)| inside.trim());
    let from_comment = comment.and_then(|c| {
        c.strip_prefix("shard:")
            .map(|r| Hint::Range(r.trim()))
            .or_else(|| c.strip_prefix("sharding_key:").map(|k| Hint::Key(k.trim())))
    });
    let hint = from_comment.or_else(|| {
        let value = |v: &'a str| v.trim().trim_matches('\'');
        match (pins.shard.map(value), pins.key.map(value)) {
            (Some(r), _) if !r.is_empty() => Some(Hint::Range(r)),
            (_, Some(k)) if !k.is_empty() => Some(Hint::Key(k)),
            _ => None,
        }
    });
    let Some(hint) = hint else {
        return Ok(None);
    };
    if !pins.allowed {
        return Err(SqlError::new(
            errors::INSUFFICIENT_PRIVILEGE,
            "only admin users may pin a statement to a shard here ([hints] allow = \"admins\")",
        ));
    }
    let shard = match hint {
        Hint::Range(range) => by_range(range, map)?,
        Hint::Key(value) => map.shard_for_key(&key(value, map)?),
    };
    Ok(Some((shard, hint)))
}

fn by_range(range: &str, map: &ShardMap) -> Result<usize, SqlError> {
    let bad = |why: String| {
        SqlError::new(errors::INVALID_PARAMETER_VALUE, format!("shard {range:?}: {why}"))
            .with_hint("name a shard by its exact range from the shard map, e.g. /* shard: 80- */ or SET shardgate.shard = '80-'")
    };
    let parsed = shardmap::KeyRange::parse(range).map_err(|e| bad(e.to_string()))?;
    map.shard_by_range(&parsed)
        .ok_or_else(|| bad("no shard has this range".into()))
}

/// A key hint's value as a key: of the type every sharded table's key has (integers of any
/// width hash alike), or, when the map's tables differ, as it reads: an integer, a UUID, else
/// text. A value in single quotes (`'alice'`) is the text inside.
pub fn key<'v>(value: &'v str, map: &ShardMap) -> Result<Key<'v>, SqlError> {
    let value = value.trim();
    let quoted = value.len() >= 2 && value.starts_with('\'') && value.ends_with('\'');
    let text = if quoted {
        &value[1..value.len() - 1]
    } else {
        value
    };
    let class = |t: KeyType| match t {
        KeyType::SmallInt | KeyType::Integer | KeyType::BigInt => KeyType::BigInt,
        other => other,
    };
    let mut types = map.tables().iter().map(|t| class(t.key_type));
    let first = types.next();
    let key_type = match first {
        Some(t) if types.all(|u| u == t) => t,
        _ if text.parse::<i64>().is_ok() => KeyType::BigInt,
        _ if KeyType::Uuid.parse_key(text).is_ok() => KeyType::Uuid,
        _ => KeyType::Text,
    };
    key_type.parse_key(text).map_err(|e| {
        SqlError::new(errors::INVALID_TEXT_REPRESENTATION, format!("sharding_key {value}: {e}"))
            .with_hint(format!(
                "the map's tables are keyed by {key_type}: give a key of that type, e.g. /* sharding_key: 42 */"
            ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardmap::Table;

    fn map(tables: Vec<Table>) -> ShardMap {
        let urls: Vec<String> = (0..4).map(|i| format!("postgres://h/s{i}")).collect();
        ShardMap::even_split(&urls, tables).unwrap()
    }

    #[test]
    fn a_key_hint_pins_the_shard_of_its_key() {
        let m = map(vec![Table::new("kv", "id", KeyType::BigInt)]);
        let shard = m.shard_for_key(&Key::Int(42));
        let pins = Pins::default();
        assert_eq!(
            pinned("/* sharding_key: 42 */ SELECT 1", pins, &m).unwrap(),
            Some((shard, Hint::Key("42")))
        );
        let set = Pins {
            key: Some("'42'"),
            ..pins
        };
        assert_eq!(
            pinned("SELECT 1", set, &m).unwrap(),
            Some((shard, Hint::Key("42")))
        );
        // A comment wins over the settings; no hint at all is no pin.
        let range = m.shards()[0].range.to_string();
        let sql = format!("/* shard: {range} */ SELECT 1");
        let by_comment = pinned(&sql, set, &m).unwrap();
        assert_eq!(by_comment.map(|p| p.0), Some(0));
        assert_eq!(pinned("SELECT 1", pins, &m).unwrap(), None);
        // Not an integer, for a map keyed by integers.
        let err = pinned("/* sharding_key: abc */ SELECT 1", pins, &m).unwrap_err();
        assert_eq!(err.code, errors::INVALID_TEXT_REPRESENTATION);
    }

    #[test]
    fn mixed_key_types_read_the_value_as_it_is_written() {
        let m = map(vec![
            Table::new("kv", "id", KeyType::BigInt),
            Table::new("names", "name", KeyType::Text),
        ]);
        let pins = Pins::default();
        let at = |sql: &str| pinned(sql, pins, &m).unwrap().map(|p| p.0);
        assert_eq!(
            at("/* sharding_key: 7 */ x"),
            Some(m.shard_for_key(&Key::Int(7)))
        );
        assert_eq!(
            at("/* sharding_key: 'alice' */ x"),
            Some(m.shard_for_key(&Key::Text("alice")))
        );
    }

    #[test]
    fn only_admins_pin_when_the_config_says_so() {
        let m = map(vec![Table::new("kv", "id", KeyType::BigInt)]);
        let pins = Pins {
            allowed: false,
            ..Pins::default()
        };
        let err = pinned("/* sharding_key: 1 */ SELECT 1", pins, &m).unwrap_err();
        assert_eq!(err.code, errors::INSUFFICIENT_PRIVILEGE);
        assert_eq!(pinned("SELECT 1", pins, &m).unwrap(), None);
    }
}
