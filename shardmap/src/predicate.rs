//! SQL predicates that select exactly the rows of one shard, with Postgres's own functions.
//!
//! `SELECT count(*) FROM kv WHERE NOT (<predicate of this shard>)` run on a shard counts rows
//! that are misplaced there; the predicates of all shards of a map together select every row
//! exactly once. The same predicate is the publication row filter when a shard is split.
//!
//! Postgres returns the hash as a signed `bigint`, while ranges are over the unsigned ID, so a
//! range that crosses `80` becomes two signed intervals joined by OR.

use crate::keyspace::KEYSPACE_SEED;
use crate::map::Table;
use crate::range::KeyRange;
pub use crate::sql::quote_ident;

const SIGN: u128 = 1 << 63;

/// The SQL expression for a row's keyspace ID (a signed bigint) in `table`.
pub fn keyspace_id_sql(table: &Table) -> String {
    format!(
        "{}({}, {})",
        table.key_type.pg_hash_function(),
        quote_ident(&table.key),
        KEYSPACE_SEED as i64
    )
}

/// A boolean SQL expression true exactly for the rows of `table` whose keyspace ID is in
/// `range` (NULL keys match no range, as they belong nowhere).
pub fn predicate(table: &Table, range: &KeyRange) -> String {
    let id = keyspace_id_sql(table);
    let (start, end) = (u128::from(range.start), range.end_u128());
    let mut parts = Vec::with_capacity(2);
    // Unsigned IDs below 2^63 are the non-negative bigints.
    if start < SIGN {
        parts.push(interval(
            &id,
            start as i128,
            end.min(SIGN) as i128,
            0,
            SIGN as i128,
        ));
    }
    // Unsigned IDs from 2^63 on are the negative bigints, in the same order.
    if end > SIGN {
        let shift = |v: u128| v as i128 - (1i128 << 64);
        parts.push(interval(
            &id,
            shift(start.max(SIGN)),
            shift(end),
            -(SIGN as i128),
            0,
        ));
    }
    if range == &KeyRange::FULL {
        return format!("{id} IS NOT NULL");
    }
    match parts.as_slice() {
        [one] => one.clone(),
        _ => format!("({})", parts.join(" OR ")),
    }
}

/// `lo <= id < hi` over bigints, leaving out a bound that is the end of the signed half
/// (`floor`/`ceiling`) it is in.
fn interval(id: &str, lo: i128, hi: i128, floor: i128, ceiling: i128) -> String {
    let low = (lo != floor || floor == 0).then(|| format!("{id} >= {lo}"));
    let high = (hi != ceiling || ceiling == 0).then(|| format!("{id} < {hi}"));
    match (low, high) {
        (Some(l), Some(h)) => format!("{l} AND {h}"),
        (Some(one), None) | (None, Some(one)) => one,
        (None, None) => format!("{id} IS NOT NULL"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::KeyType;

    fn p(range: &str) -> String {
        predicate(
            &Table::new("kv", "id", KeyType::BigInt),
            &KeyRange::parse(range).unwrap(),
        )
    }

    #[test]
    fn halves_are_the_signs() {
        assert_eq!(p("-80"), "hashint8extended(id, 0) >= 0");
        assert_eq!(p("80-"), "hashint8extended(id, 0) < 0");
        assert_eq!(p("-"), "hashint8extended(id, 0) IS NOT NULL");
    }

    #[test]
    fn inner_and_crossing_ranges() {
        assert_eq!(p("40-80"), "hashint8extended(id, 0) >= 4611686018427387904");
        assert_eq!(
            p("-40"),
            "hashint8extended(id, 0) >= 0 AND hashint8extended(id, 0) < 4611686018427387904"
        );
        assert_eq!(
            p("c0-"),
            "hashint8extended(id, 0) >= -4611686018427387904 AND hashint8extended(id, 0) < 0"
        );
        assert_eq!(p("80-c0"), "hashint8extended(id, 0) < -4611686018427387904");
        assert_eq!(
            p("40-c0"),
            "(hashint8extended(id, 0) >= 4611686018427387904 OR hashint8extended(id, 0) < -4611686018427387904)"
        );
    }

    #[test]
    fn quotes_identifiers_that_need_it() {
        assert_eq!(quote_ident("id"), "id");
        assert_eq!(quote_ident("userId"), "\"userId\"");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
    }
}
