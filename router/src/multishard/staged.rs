//! The second stage of a read in two stages (`crate::planner::staged`): the first stage's answer,
//! as the router kept it (a RowDescription and DataRows, every column in binary), turned into
//! one array parameter per column and read back in that stage's place as
//! `(SELECT u.c1, ... FROM unnest($n, ...) AS u(c1, ...)) AS alias(names)`. Each array's
//! elements are the shards' own binary values, untouched, so the rest of the statement sees
//! exactly the values and types the shards had, whatever the session's DateStyle, TimeZone
//! or `extra_float_digits`; a column with a type modifier is cast back to it (`numeric(12,2)`),
//! so the answer's description is Postgres's too.
//!
//! Only built-in types (fixed OIDs) can be carried: a user type's OID differs per database.
//! Pure.

use shardmap::sql::quote_ident_always;

use crate::errors;
use crate::merge::{self, Column};
use crate::planner::staged::StagedTexts;
use crate::protocol::frame::frames;
use crate::protocol::reply::SqlError;

/// The second stage: its text, and the parameters it adds after the client's (`$n+1`..), as
/// array type OIDs and binary array values.
#[derive(Debug)]
pub struct SecondStage {
    pub sql: String,
    pub types: Vec<u32>,
    pub arrays: Vec<Vec<u8>>,
}

/// One column's values as a binary array under way.
struct Array {
    element: u32,
    array: u32,
    values: Vec<u8>,
    nulls: bool,
}

/// The second stage of `texts` over the rows of `answer` (the first stage's frames, binary);
/// the client's statement has `params` parameters, so the arrays are `$params+1`...
pub fn second_stage(
    texts: &StagedTexts,
    answer: &[u8],
    params: usize,
) -> Result<SecondStage, SqlError> {
    let mut columns: Vec<Column> = Vec::new();
    let mut arrays: Vec<Array> = Vec::new();
    let mut rows = 0i32;
    for frame in frames(answer) {
        let frame = frame.map_err(|_| broken("a malformed answer"))?;
        match frame[0] {
            b'T' => {
                columns = merge::columns(&frame[5..]).map_err(|e| broken(e.message()))?;
                arrays = columns.iter().map(array_of).collect::<Result<_, _>>()?;
            }
            b'D' => {
                let fields = merge::fields(&frame[5..]).map_err(|e| broken(e.message()))?;
                if fields.len() != arrays.len() {
                    return Err(broken("a row of another width than its description"));
                }
                for (value, a) in fields.iter().zip(arrays.iter_mut()) {
                    match value {
                        None => {
                            a.nulls = true;
                            a.values.extend_from_slice(&(-1i32).to_be_bytes());
                        }
                        Some(v) => {
                            let len =
                                i32::try_from(v.len()).map_err(|_| broken("a value past 2 GiB"))?;
                            a.values.extend_from_slice(&len.to_be_bytes());
                            a.values.extend_from_slice(v);
                        }
                    }
                }
                rows = rows
                    .checked_add(1)
                    .ok_or_else(|| broken("more than 2^31 rows"))?;
            }
            _ => {}
        }
    }
    if columns.is_empty() {
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "a read finished on one shard needs its first part to have columns",
        ));
    }
    if texts.columns.len() > columns.len() {
        return Err(SqlError::new(
            errors::INVALID_COLUMN_REFERENCE,
            format!(
                "table \"{}\" has {} columns available but {} columns specified",
                texts.alias.trim_matches('"'),
                columns.len(),
                texts.columns.len()
            ),
        ));
    }
    let sql = text(texts, &columns, params)?;
    let types = arrays.iter().map(|a| a.array).collect();
    let arrays = arrays.into_iter().map(|a| a.finish(rows)).collect();
    Ok(SecondStage { sql, types, arrays })
}

impl Array {
    /// The array in Postgres's binary format: dimensions, a NULL flag, the element type, the
    /// length and lower bound of its one dimension (none when empty), then the elements.
    fn finish(self, rows: i32) -> Vec<u8> {
        let mut out = Vec::with_capacity(20 + self.values.len());
        out.extend_from_slice(&i32::from(rows > 0).to_be_bytes());
        out.extend_from_slice(&i32::from(self.nulls).to_be_bytes());
        out.extend_from_slice(&self.element.to_be_bytes());
        if rows > 0 {
            out.extend_from_slice(&rows.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
        }
        out.extend_from_slice(&self.values);
        out
    }
}

/// The text in the first stage's place: the arrays unnested, each column cast back to its
/// type modifier, named as the statement names them.
fn text(texts: &StagedTexts, columns: &[Column], params: usize) -> Result<String, SqlError> {
    let mut select = String::from("(SELECT ");
    let mut names = String::new();
    let mut from = String::from(" FROM unnest(");
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            select.push_str(", ");
            names.push_str(", ");
            from.push_str(", ");
        }
        select.push_str(&format!("u.c{i}"));
        if let Some(modified) = with_modifier(c)? {
            select.push_str("::");
            select.push_str(&modified);
        }
        from.push_str(&format!("${}", params + i + 1));
        match texts.columns.get(i) {
            Some(name) => names.push_str(name),
            None => names.push_str(&quote_ident_always(&String::from_utf8_lossy(&c.name))),
        }
    }
    let u: Vec<String> = (0..columns.len()).map(|i| format!("c{i}")).collect();
    let mut sql =
        String::with_capacity(texts.before.len() + texts.after.len() + 64 * columns.len());
    sql.push_str(&texts.before);
    sql.push_str(&select);
    sql.push_str(&from);
    sql.push_str(&format!(
        ") AS u({})) AS {}({names})",
        u.join(", "),
        texts.alias
    ));
    sql.push_str(&texts.after);
    Ok(sql)
}

fn broken(what: &str) -> SqlError {
    errors::internal(format!(
        "the first stage of a read finished on one shard gave {what}"
    ))
}

/// An empty array of `column`'s type, or why its values cannot be carried.
fn array_of(column: &Column) -> Result<Array, SqlError> {
    if !column.binary {
        return Err(broken("a column in text"));
    }
    let Some((_, array)) = builtin_type(column.type_oid) else {
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            format!(
                "a read that the router finishes on one shard carries a column \"{}\" of type OID {}, which it cannot carry (only built-in types that are not arrays)",
                String::from_utf8_lossy(&column.name),
                column.type_oid
            ),
        ));
    };
    Ok(Array {
        element: column.type_oid,
        array,
        values: Vec::new(),
        nulls: false,
    })
}

/// `column`'s type with its modifier as SQL writes it, when it has one (`numeric(12, 2)`).
fn with_modifier(column: &Column) -> Result<Option<String>, SqlError> {
    let (oid, typmod) = (column.type_oid, column.type_modifier);
    let name = builtin_type(oid).map_or("", |(name, _)| name);
    let modifier = match oid {
        _ if typmod < 0 => return Ok(None),
        // numeric(p, s): ((p << 16) | s) + 4, the scale an 11-bit signed number.
        1700 => {
            let t = typmod - 4;
            let scale = ((t & 0x7ff) ^ 1024) - 1024;
            format!("({}, {scale})", (t >> 16) & 0xffff)
        }
        // varchar(n), bpchar(n): n + 4.
        1042 | 1043 => format!("({})", typmod - 4),
        // Fractional digits of times; bit lengths.
        1083 | 1114 | 1184 | 1266 | 1560 | 1562 => format!("({typmod})"),
        // An interval's modifier also holds its fields: its values already obey it.
        _ => return Ok(None),
    };
    Ok(Some(format!("{name}{modifier}")))
}

/// The built-in types a read commonly carries, by OID: their name and their array type's OID.
fn builtin_type(oid: u32) -> Option<(&'static str, u32)> {
    Some(match oid {
        16 => ("bool", 1000),
        17 => ("bytea", 1001),
        18 => ("\"char\"", 1002),
        19 => ("name", 1003),
        20 => ("int8", 1016),
        21 => ("int2", 1005),
        23 => ("int4", 1007),
        25 => ("text", 1009),
        26 => ("oid", 1028),
        114 => ("json", 199),
        142 => ("xml", 143),
        650 => ("cidr", 651),
        700 => ("float4", 1021),
        701 => ("float8", 1022),
        790 => ("money", 791),
        829 => ("macaddr", 1040),
        869 => ("inet", 1041),
        1042 => ("bpchar", 1014),
        1043 => ("varchar", 1015),
        1082 => ("date", 1182),
        1083 => ("time", 1183),
        1114 => ("timestamp", 1115),
        1184 => ("timestamptz", 1185),
        1186 => ("interval", 1187),
        1266 => ("timetz", 1270),
        1560 => ("bit", 1561),
        1562 => ("varbit", 1563),
        1700 => ("numeric", 1231),
        2950 => ("uuid", 2951),
        3802 => ("jsonb", 3807),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::{begin_frame, end_frame};
    use bytes::BytesMut;

    /// A first stage's answer: columns `(name, type, typmod)` in binary, and rows.
    fn answer(columns: &[(&str, u32, i32)], rows: &[Vec<Option<&[u8]>>]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let at = begin_frame(&mut out, b'T');
        out.extend_from_slice(&(columns.len() as i16).to_be_bytes());
        for (name, oid, typmod) in columns {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&oid.to_be_bytes());
            out.extend_from_slice(&(-1i16).to_be_bytes());
            out.extend_from_slice(&typmod.to_be_bytes());
            out.extend_from_slice(&1i16.to_be_bytes());
        }
        end_frame(&mut out, at);
        for row in rows {
            let at = begin_frame(&mut out, b'D');
            out.extend_from_slice(&merge::data_row_body(row));
            end_frame(&mut out, at);
        }
        out.to_vec()
    }

    fn texts(columns: &[&str]) -> StagedTexts {
        StagedTexts {
            first: String::new(),
            before: "SELECT * FROM ".into(),
            after: " ORDER BY 1".into(),
            alias: "s".into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn columns_become_binary_arrays_unnested_in_place() {
        let (one, two) = (1i64.to_be_bytes(), 2i64.to_be_bytes());
        let a = answer(
            &[("n", 20, -1), ("user", 1700, (12 << 16 | 2) + 4)],
            &[
                vec![Some(&one[..]), None],
                vec![Some(&two[..]), Some(&b"\0\0"[..])],
            ],
        );
        let s = second_stage(&texts(&[]), &a, 2).unwrap();
        assert_eq!(
            s.sql,
            "SELECT * FROM (SELECT u.c0, u.c1::numeric(12, 2) FROM unnest($3, $4) AS u(c0, c1)) AS s(\"n\", \"user\") ORDER BY 1"
        );
        assert_eq!(s.types, [1016, 1231]);
        // int8[]: one dimension, no NULLs, element int8, 2 elements from 1, then each value.
        let mut int8s = Vec::new();
        for word in [1i32, 0, 20, 2, 1, 8] {
            int8s.extend_from_slice(&word.to_be_bytes());
        }
        int8s.extend_from_slice(&one);
        int8s.extend_from_slice(&8i32.to_be_bytes());
        int8s.extend_from_slice(&two);
        assert_eq!(s.arrays[0], int8s);
        // numeric[]: with a NULL.
        assert_eq!(&s.arrays[1][4..8], &1i32.to_be_bytes());
        assert_eq!(&s.arrays[1][20..24], &(-1i32).to_be_bytes());
    }

    #[test]
    fn no_rows_are_empty_arrays_of_the_same_types() {
        let a = answer(&[("count", 20, -1), ("Max", 1043, 14)], &[]);
        let s = second_stage(&texts(&["c"]), &a, 0).unwrap();
        assert_eq!(
            s.sql,
            "SELECT * FROM (SELECT u.c0, u.c1::varchar(10) FROM unnest($1, $2) AS u(c0, c1)) AS s(c, \"Max\") ORDER BY 1"
        );
        let mut empty = Vec::new();
        for word in [0i32, 0, 1043] {
            empty.extend_from_slice(&word.to_be_bytes());
        }
        assert_eq!(s.arrays[1], empty);
    }

    #[test]
    fn what_cannot_be_carried_is_refused() {
        let x = b"x";
        let a = answer(&[("e", 16_385, -1)], &[vec![Some(&x[..])]]);
        let err = second_stage(&texts(&[]), &a, 0).unwrap_err();
        assert!(err.message.contains("OID 16385"), "{}", err.message);
        let a = answer(&[("a", 1007, -1)], &[]);
        assert!(second_stage(&texts(&[]), &a, 0).is_err(), "arrays");
        let a = answer(&[("a", 23, -1)], &[]);
        let err = second_stage(&texts(&["x", "y"]), &a, 0).unwrap_err();
        assert_eq!(err.code, "42P10");
        assert!(
            second_stage(&texts(&[]), &answer(&[], &[]), 0).is_err(),
            "no columns"
        );
    }
}
