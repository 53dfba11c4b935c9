//! `SET SESSION CHARACTERISTICS AS TRANSACTION ...`, which sets the `default_transaction_*`
//! settings under another name.

use super::Change;
use shardmap::sql::quote_literal;

/// `SET SESSION CHARACTERISTICS AS TRANSACTION modes` as the settings it changes (the
/// `default_transaction_*` ones); `None` for anything else, or modes it does not read.
pub(super) fn characteristics(sql: &str) -> Option<Vec<Change>> {
    let text = sql.trim().trim_end_matches(';').to_ascii_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    let modes = match words.as_slice() {
        ["set", "session", "characteristics", "as", "transaction", modes @ ..]
            if !modes.is_empty() =>
        {
            modes
        }
        _ => return None,
    };
    let set = |name: &str, value: &str| Change::Set {
        name: name.into(),
        value: quote_literal(value),
    };
    let mut changes = Vec::new();
    let mut rest = modes;
    while !rest.is_empty() {
        let (change, used) = match rest {
            ["isolation", "level", "serializable", ..] => {
                (set("default_transaction_isolation", "serializable"), 3)
            }
            ["isolation", "level", "repeatable", "read", ..] => {
                (set("default_transaction_isolation", "repeatable read"), 4)
            }
            ["isolation", "level", "read", "committed", ..] => {
                (set("default_transaction_isolation", "read committed"), 4)
            }
            ["isolation", "level", "read", "uncommitted", ..] => {
                (set("default_transaction_isolation", "read uncommitted"), 4)
            }
            ["read", "only", ..] => (set("default_transaction_read_only", "on"), 2),
            ["read", "write", ..] => (set("default_transaction_read_only", "off"), 2),
            ["deferrable", ..] => (set("default_transaction_deferrable", "on"), 1),
            ["not", "deferrable", ..] => (set("default_transaction_deferrable", "off"), 2),
            _ => return None,
        };
        changes.push(change);
        rest = &rest[used..];
    }
    Some(changes)
}
