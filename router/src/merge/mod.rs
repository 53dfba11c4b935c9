//! Merging the answers of several shards to one scattered `SELECT` into the answer a single
//! Postgres would have given.
//!
//! This is a sans-IO engine: it works on raw wire-protocol bodies (RowDescription 'T' and
//! DataRow 'D', the bytes after the tag and the length) and never touches a socket. The
//! session that scatters a query feeds it what the shards answered:
//!
//! - `ORDER BY`: each shard sorts its own rows; the caller k-way merges the streams, picking
//!   the next row with [`compare_rows`], after checking once per result with
//!   [`check_sortable`] that the key columns' types can be ordered here.
//! - `GROUP BY` and aggregates ([`GroupMerge`]): each shard groups and aggregates its rows;
//!   the engine combines the partial `count`/`sum`/`min`/`max` of equal groups, and computes
//!   `avg` from per-shard `sum(x), count(x)` pairs.
//!
//! The rule is exactness: a result is either byte for byte what one Postgres would have sent,
//! or an error ([`MergeError`], for the caller to turn into SQLSTATE 0A000) naming why it
//! cannot be merged. Values are compared with Postgres's semantics ([`value`]), `numeric` is
//! done in exact decimal ([`numeric`]) and floats are printed as `float8out` prints them
//! ([`float`]).

pub mod arith;
pub mod datetime;
pub mod float;
pub mod group;
pub mod numeric;
pub mod row;
pub mod value;
pub mod variance;

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

pub use group::{AggOp, GroupMerge, Out};
pub use row::{columns, data_row_body, fields, row_description_body, write_data_row_frame, Column};

/// Why shard answers cannot be merged exactly (or a shard sent something malformed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeError(Cow<'static, str>);

impl MergeError {
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MergeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MergeError {}

impl From<&'static str> for MergeError {
    fn from(s: &'static str) -> Self {
        MergeError(Cow::Borrowed(s))
    }
}

impl From<String> for MergeError {
    fn from(s: String) -> Self {
        MergeError(Cow::Owned(s))
    }
}

/// One `ORDER BY` key: a column of the rows being compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    pub column: usize,
    pub descending: bool,
    /// Where NULLs go, independently of `descending` (Postgres's default is NULLS FIRST for
    /// DESC and NULLS LAST for ASC; the caller resolves it).
    pub nulls_first: bool,
}

/// Whether the key columns can be ordered by the router; check once, on the RowDescription,
/// before any row. `text_bytewise`: the database collation is C/POSIX, so text sorts by bytes.
pub fn check_sortable(
    keys: &[SortKey],
    cols: &[Column],
    text_bytewise: bool,
) -> Result<(), MergeError> {
    for key in keys {
        let col = cols
            .get(key.column)
            .ok_or("ORDER BY key refers to a column the result does not have")?;
        value::check_comparable(col, text_bytewise)?;
    }
    Ok(())
}

/// Compares two DataRow bodies by `keys`, as Postgres's `ORDER BY` would. The columns must
/// have passed [`check_sortable`] (text columns are otherwise compared bytewise).
pub fn compare_rows(
    a: &[u8],
    b: &[u8],
    keys: &[SortKey],
    cols: &[Column],
) -> Result<Ordering, MergeError> {
    for key in keys {
        let col = cols
            .get(key.column)
            .ok_or("ORDER BY key refers to a column the result does not have")?;
        let kind = value::Kind::of(col.type_oid).ok_or_else(|| value::unsupported(col))?;
        let fa = row::nth_field(a, key.column)?;
        let fb = row::nth_field(b, key.column)?;
        let ord = match (fa, fb) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) if key.nulls_first => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) if key.nulls_first => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(x), Some(y)) => {
                let ord = value::compare(kind, col.binary, x, y)?;
                if key.descending {
                    ord.reverse()
                } else {
                    ord
                }
            }
        };
        if ord != Ordering::Equal {
            return Ok(ord);
        }
    }
    Ok(Ordering::Equal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(column: usize, descending: bool, nulls_first: bool) -> SortKey {
        SortKey {
            column,
            descending,
            nulls_first,
        }
    }

    #[test]
    fn rows_by_several_keys_and_nulls() {
        let cols = vec![Column::new(b"a", 23, false), Column::new(b"b", 701, false)];
        let r1 = data_row_body(&[Some(b"1"), Some(b"NaN")]);
        let r2 = data_row_body(&[Some(b"1"), Some(b"2.5")]);
        let r3 = data_row_body(&[None, Some(b"0")]);
        let asc = [key(0, false, false), key(1, false, false)];
        assert_eq!(
            compare_rows(&r1, &r2, &asc, &cols).unwrap(),
            Ordering::Greater
        );
        assert_eq!(compare_rows(&r1, &r3, &asc, &cols).unwrap(), Ordering::Less);
        let desc = [key(0, true, false), key(1, true, true)];
        assert_eq!(
            compare_rows(&r1, &r2, &desc, &cols).unwrap(),
            Ordering::Less
        );
        // NULLS LAST even when descending.
        assert_eq!(
            compare_rows(&r3, &r1, &desc, &cols).unwrap(),
            Ordering::Greater
        );
        let nulls_first = [key(0, false, true)];
        assert_eq!(
            compare_rows(&r3, &r1, &nulls_first, &cols).unwrap(),
            Ordering::Less
        );
        assert_eq!(
            compare_rows(&r1, &r1, &asc, &cols).unwrap(),
            Ordering::Equal
        );
    }

    #[test]
    fn sortable_checks() {
        let cols = vec![Column::new(b"t", 25, false), Column::new(b"i", 1186, false)];
        assert!(check_sortable(&[key(0, false, false)], &cols, true).is_ok());
        let err = check_sortable(&[key(0, false, false)], &cols, false).unwrap_err();
        assert!(err.message().contains("C collation"));
        assert!(check_sortable(&[key(1, false, false)], &cols, true).is_err());
        assert!(check_sortable(&[key(2, false, false)], &cols, true).is_err());
    }
}
