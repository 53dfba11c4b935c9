//! Statements an operator pins to one shard by hand, for example to repair it: a leading
//! `/* shard: RANGE */` comment, or the session setting `shardgate.shard`.

use shardmap::ShardMap;

use crate::errors;
use crate::protocol::reply::SqlError;

/// The session setting that pins a client's statements to one shard.
pub const SETTING: &str = "shardgate.shard";

/// The shard an operator pinned `sql` to: its leading comment, or else `setting` (the SQL value
/// of `shardgate.shard`, e.g. `'80-'`). `None` when neither names one (or the setting is
/// empty); an error when the range is not one of the map's shards.
pub fn shard(sql: &str, setting: Option<&str>, map: &ShardMap) -> Result<Option<usize>, SqlError> {
    let hint = sql
        .trim_start()
        .strip_prefix("/*")
        .and_then(|rest| rest.split_once("*/"))
        .and_then(|(inside, _)| inside.trim().strip_prefix("shard:"))
        .map(str::trim);
    let range = match hint {
        Some(r) => r,
        None => match setting {
            Some(v) => v.trim().trim_matches('\''),
            None => return Ok(None),
        },
    };
    if range.is_empty() {
        return Ok(None);
    }
    let bad = |why: String| {
        SqlError::new(errors::INVALID_PARAMETER_VALUE, format!("shard {range:?}: {why}"))
            .with_hint("name a shard by its exact range from the shard map, e.g. /* shard: 80- */ or SET shardgate.shard = '80-'")
    };
    let parsed = shardmap::KeyRange::parse(range).map_err(|e| bad(e.to_string()))?;
    map.shard_by_range(&parsed)
        .map(Some)
        .ok_or_else(|| bad("no shard has this range".into()))
}
