//! The second stage of a read in two stages (`crate::planner::staged`): the first stage's answer,
//! as the router kept it (a RowDescription and DataRows, all text), written into the statement
//! in that stage's place as a VALUES list. Every value is a literal cast to the type (and type
//! modifier) the shards described, so the rest of the statement sees the values and types the
//! shards had: Postgres reads back what it printed, under the same session settings.
//!
//! Only types whose OID is fixed (built in) can be named; a user type's OID differs per
//! database. Floats print exactly only with `extra_float_digits` above 0 (the default, 1).
//! Pure.

use shardmap::sql::{quote_ident, quote_literal};

use crate::errors;
use crate::merge::{self, Column};
use crate::planner::staged::StagedTexts;
use crate::protocol::frame::frames;
use crate::protocol::reply::SqlError;

/// The text of the second stage: `texts` around the rows of `answer` (the first stage's
/// frames). `exact_floats`: the session prints floats exactly (`extra_float_digits` > 0).
pub fn second_stage(
    texts: &StagedTexts,
    answer: &[u8],
    exact_floats: bool,
) -> Result<String, SqlError> {
    let mut columns: Vec<Column> = Vec::new();
    let mut types: Vec<String> = Vec::new();
    let mut rows = String::new();
    let mut count = 0usize;
    for frame in frames(answer) {
        let frame = frame.map_err(|_| broken("a malformed answer"))?;
        match frame[0] {
            b'T' => {
                columns = merge::columns(&frame[5..]).map_err(|e| broken(e.message()))?;
                types = columns
                    .iter()
                    .map(|c| type_name(c, exact_floats))
                    .collect::<Result<_, _>>()?;
            }
            b'D' => {
                let fields = merge::fields(&frame[5..]).map_err(|e| broken(e.message()))?;
                if fields.len() != types.len() {
                    return Err(broken("a row of another width than its description"));
                }
                rows.push_str(if count == 0 { "(VALUES (" } else { ", (" });
                for (i, (value, ty)) in fields.iter().zip(&types).enumerate() {
                    if i > 0 {
                        rows.push_str(", ");
                    }
                    push_value(&mut rows, *value, ty)?;
                }
                rows.push(')');
                count += 1;
            }
            _ => {}
        }
    }
    if columns.is_empty() {
        return Err(broken("no columns"));
    }
    if count == 0 {
        // No rows: a query of the same columns that gives none.
        rows.push_str("(SELECT ");
        for (i, ty) in types.iter().enumerate() {
            if i > 0 {
                rows.push_str(", ");
            }
            rows.push_str("NULL::");
            rows.push_str(ty);
        }
        rows.push_str(" WHERE false");
    }
    rows.push_str(") AS ");
    rows.push_str(&texts.alias);
    rows.push('(');
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            rows.push_str(", ");
        }
        match texts.columns.get(i) {
            Some(name) => rows.push_str(name),
            None => rows.push_str(&quote_ident(&String::from_utf8_lossy(&c.name))),
        }
    }
    rows.push(')');
    let mut sql = String::with_capacity(texts.before.len() + rows.len() + texts.after.len());
    sql.push_str(&texts.before);
    sql.push_str(&rows);
    sql.push_str(&texts.after);
    Ok(sql)
}

fn push_value(out: &mut String, value: Option<&[u8]>, ty: &str) -> Result<(), SqlError> {
    match value {
        None => out.push_str("NULL"),
        Some(bytes) => {
            let text = std::str::from_utf8(bytes).map_err(|_| {
                SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "a read that the router finishes on one shard carries text that is not UTF-8: set client_encoding to UTF8",
                )
            })?;
            out.push_str(&quote_literal(text));
        }
    }
    out.push_str("::");
    out.push_str(ty);
    Ok(())
}

fn broken(what: &str) -> SqlError {
    errors::internal(format!(
        "the first stage of a read finished on one shard gave {what}"
    ))
}

/// The name of `column`'s type as SQL writes it, with its modifier.
fn type_name(column: &Column, exact_floats: bool) -> Result<String, SqlError> {
    let (oid, typmod) = (column.type_oid, column.type_modifier);
    if matches!(oid, 700 | 701 | 1021 | 1022) && !exact_floats {
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "a read that the router finishes on one shard carries floating-point values, which this session prints rounded (extra_float_digits is 0 or less): set extra_float_digits to 1 or more",
        ));
    }
    let Some(name) = builtin_type(oid) else {
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            format!(
                "a read that the router finishes on one shard carries a column \"{}\" of type OID {oid}, which the router cannot name in SQL (only built-in types)",
                String::from_utf8_lossy(&column.name)
            ),
        ));
    };
    let modifier = match oid {
        _ if typmod < 0 => None,
        // numeric(p, s): ((p << 16) | s) + 4, the scale an 11-bit signed number.
        1700 => {
            let t = typmod - 4;
            let scale = ((t & 0x7ff) ^ 1024) - 1024;
            Some(format!("({}, {scale})", (t >> 16) & 0xffff))
        }
        // varchar(n), bpchar(n): n + 4.
        1042 | 1043 => Some(format!("({})", typmod - 4)),
        // Fractional digits of times; bit lengths.
        1083 | 1114 | 1184 | 1266 | 1560 | 1562 => Some(format!("({typmod})")),
        _ => None,
    };
    Ok(match modifier {
        Some(m) => format!("{name}{m}"),
        None => name.to_string(),
    })
}

/// The built-in types by OID (those with fixed OIDs that a read commonly carries).
fn builtin_type(oid: u32) -> Option<&'static str> {
    Some(match oid {
        16 => "bool",
        17 => "bytea",
        18 => "\"char\"",
        19 => "name",
        20 => "int8",
        21 => "int2",
        23 => "int4",
        25 => "text",
        26 => "oid",
        114 => "json",
        142 => "xml",
        650 => "cidr",
        700 => "float4",
        701 => "float8",
        790 => "money",
        829 => "macaddr",
        869 => "inet",
        1042 => "bpchar",
        1043 => "varchar",
        1082 => "date",
        1083 => "time",
        1114 => "timestamp",
        1184 => "timestamptz",
        1186 => "interval",
        1266 => "timetz",
        1560 => "bit",
        1562 => "varbit",
        1700 => "numeric",
        2950 => "uuid",
        3802 => "jsonb",
        1000 => "bool[]",
        1001 => "bytea[]",
        1005 => "int2[]",
        1007 => "int4[]",
        1009 => "text[]",
        1014 => "bpchar[]",
        1015 => "varchar[]",
        1016 => "int8[]",
        1021 => "float4[]",
        1022 => "float8[]",
        1115 => "timestamp[]",
        1182 => "date[]",
        1185 => "timestamptz[]",
        1187 => "interval[]",
        1231 => "numeric[]",
        2951 => "uuid[]",
        199 => "json[]",
        3807 => "jsonb[]",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::{begin_frame, end_frame};
    use bytes::BytesMut;

    fn answer(columns: &[(&str, u32, i32)], rows: &[Vec<Option<&str>>]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let at = begin_frame(&mut out, b'T');
        out.extend_from_slice(&(columns.len() as i16).to_be_bytes());
        for (name, oid, typmod) in columns {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&oid.to_be_bytes());
            out.extend_from_slice(&(-1i16).to_be_bytes());
            out.extend_from_slice(&typmod.to_be_bytes());
            out.extend_from_slice(&0i16.to_be_bytes());
        }
        end_frame(&mut out, at);
        for row in rows {
            let fields: Vec<Option<&[u8]>> = row.iter().map(|v| v.map(str::as_bytes)).collect();
            let at = begin_frame(&mut out, b'D');
            out.extend_from_slice(&merge::data_row_body(&fields));
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
    fn rows_become_typed_values() {
        let a = answer(
            &[
                ("status", 25, -1),
                ("n", 20, -1),
                ("amount", 1700, (10 << 16 | 2) + 4),
            ],
            &[
                vec![Some("it's"), Some("3"), Some("1.50")],
                vec![None, Some("-1"), Some("a\\b")],
            ],
        );
        assert_eq!(
            second_stage(&texts(&[]), &a, true).unwrap(),
            "SELECT * FROM (VALUES ('it''s'::text, '3'::int8, '1.50'::numeric(10, 2)), \
             (NULL::text, '-1'::int8, E'a\\\\b'::numeric(10, 2))) AS s(status, n, amount) ORDER BY 1"
        );
    }

    #[test]
    fn no_rows_keep_the_columns_and_their_names() {
        let a = answer(&[("count", 20, -1), ("Max", 1043, 14)], &[]);
        assert_eq!(
            second_stage(&texts(&["c"]), &a, true).unwrap(),
            "SELECT * FROM (SELECT NULL::int8, NULL::varchar(10) WHERE false) AS s(c, \"Max\") ORDER BY 1"
        );
    }

    #[test]
    fn unnamed_types_and_rounded_floats_are_refused() {
        let a = answer(&[("e", 16_385, -1)], &[vec![Some("x")]]);
        let err = second_stage(&texts(&[]), &a, true).unwrap_err();
        assert!(err.message.contains("OID 16385"), "{}", err.message);
        let a = answer(&[("f", 701, -1)], &[vec![Some("0.1")]]);
        assert!(second_stage(&texts(&[]), &a, true).is_ok());
        let err = second_stage(&texts(&[]), &a, false).unwrap_err();
        assert!(
            err.message.contains("extra_float_digits"),
            "{}",
            err.message
        );
    }
}
