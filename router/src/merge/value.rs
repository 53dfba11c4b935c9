//! Single field values: which types the router understands, and comparing two values of a
//! column the way Postgres's default btree ordering would, in text or binary format.
//!
//! A value is compared only after [`check_comparable`] accepted its column, once per result;
//! the per-row path then just decodes and compares.

use std::cmp::Ordering;

use super::datetime::{self, DateKind};
use super::numeric::{self, Numeric};
use super::row::Column;
use super::{float, MergeError};

/// The types the merge engine knows, by OID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int2,
    Int4,
    Int8,
    Oid,
    Float4,
    Float8,
    Numeric,
    Bool,
    /// text, varchar, name; `bpchar` ignores trailing spaces, as `bpcharcmp` does.
    Text {
        bpchar: bool,
    },
    Uuid,
    Date(DateKind),
}

impl Kind {
    pub fn of(type_oid: u32) -> Option<Kind> {
        Some(match type_oid {
            21 => Kind::Int2,
            23 => Kind::Int4,
            20 => Kind::Int8,
            26 => Kind::Oid,
            700 => Kind::Float4,
            701 => Kind::Float8,
            1700 => Kind::Numeric,
            16 => Kind::Bool,
            25 | 1043 | 19 => Kind::Text { bpchar: false },
            1042 => Kind::Text { bpchar: true },
            2950 => Kind::Uuid,
            1082 => Kind::Date(DateKind::Date),
            1114 => Kind::Date(DateKind::Timestamp),
            1184 => Kind::Date(DateKind::TimestampTz),
            _ => return None,
        })
    }
}

/// `pg_type.typlen` of the types the engine produces (-1 when variable or unknown).
pub fn type_len(type_oid: u32) -> i16 {
    match type_oid {
        16 => 1,
        21 => 2,
        23 | 26 | 700 | 1082 => 4,
        20 | 701 | 1114 | 1184 => 8,
        2950 => 16,
        19 => 64,
        _ => -1,
    }
}

/// The error for a column whose type the engine does not know.
pub fn unsupported(col: &Column) -> MergeError {
    MergeError::from(format!(
        "column \"{}\" has a type (OID {}) whose values cannot be merged across shards",
        String::from_utf8_lossy(&col.name),
        col.type_oid
    ))
}

/// Whether values of `col` can be ordered by the router. Text needs the C collation, where
/// Postgres compares bytes; `text_bytewise` says the database has it.
pub fn check_comparable(col: &Column, text_bytewise: bool) -> Result<Kind, MergeError> {
    let kind = Kind::of(col.type_oid).ok_or_else(|| unsupported(col))?;
    match kind {
        Kind::Text { .. } if !text_bytewise => {
            Err("ORDER BY a text column across shards needs the C collation".into())
        }
        _ => Ok(kind),
    }
}

/// Compares two non-NULL values of a column of `kind`.
pub fn compare(kind: Kind, binary: bool, a: &[u8], b: &[u8]) -> Result<Ordering, MergeError> {
    Ok(match kind {
        Kind::Int2 | Kind::Int4 | Kind::Int8 => int(kind, binary, a)?.cmp(&int(kind, binary, b)?),
        Kind::Oid => oid(binary, a)?.cmp(&oid(binary, b)?),
        Kind::Float4 | Kind::Float8 => {
            float::compare(float(kind, binary, a)?, float(kind, binary, b)?)
        }
        Kind::Numeric if binary => numeric::compare_binary(a, b)?,
        Kind::Numeric => numeric::compare_text(a, b)?,
        Kind::Bool => boolean(binary, a)?.cmp(&boolean(binary, b)?),
        Kind::Text { bpchar } => {
            if bpchar {
                trim_spaces(a).cmp(trim_spaces(b))
            } else {
                a.cmp(b)
            }
        }
        // Binary uuids are 16 bytes; text ones lowercase hex in a fixed layout: both sort
        // bytewise exactly as uuid_cmp (a memcmp) does.
        Kind::Uuid => a.cmp(b),
        Kind::Date(dk) if binary => match dk {
            // Binary dates are int32 days, timestamps int64 microseconds; the infinities are
            // the extreme values, so plain integer order is Postgres's order.
            DateKind::Date => be_int(a, 4)?.cmp(&be_int(b, 4)?),
            _ => be_int(a, 8)?.cmp(&be_int(b, 8)?),
        },
        Kind::Date(dk) => datetime::sort_key(dk, a)?.cmp(&datetime::sort_key(dk, b)?),
    })
}

/// `bpchar` values compare without their trailing spaces.
pub fn trim_spaces(v: &[u8]) -> &[u8] {
    let end = v.iter().rposition(|&c| c != b' ').map_or(0, |p| p + 1);
    &v[..end]
}

const BAD_INT: &str = "malformed integer value from a shard";

/// A big-endian two's-complement integer of exactly `len` bytes.
pub fn be_int(v: &[u8], len: usize) -> Result<i64, MergeError> {
    if v.len() != len {
        return Err("binary value of the wrong length from a shard".into());
    }
    let mut buf = if v.first().is_some_and(|b| b & 0x80 != 0) {
        [0xff; 8]
    } else {
        [0; 8]
    };
    buf[8 - len..].copy_from_slice(v);
    Ok(i64::from_be_bytes(buf))
}

/// An int2/int4/int8 value.
pub fn int(kind: Kind, binary: bool, v: &[u8]) -> Result<i64, MergeError> {
    if binary {
        let len = match kind {
            Kind::Int2 => 2,
            Kind::Int4 => 4,
            _ => 8,
        };
        return be_int(v, len);
    }
    std::str::from_utf8(v)
        .ok()
        .filter(|s| !s.starts_with('+'))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| BAD_INT.into())
}

fn oid(binary: bool, v: &[u8]) -> Result<u32, MergeError> {
    if binary {
        return Ok(be_int(v, 4)? as u32);
    }
    std::str::from_utf8(v)
        .ok()
        .filter(|s| !s.starts_with('+'))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| BAD_INT.into())
}

/// A float4/float8 value, widened to f64 (exact, so order and equality are kept).
pub fn float(kind: Kind, binary: bool, v: &[u8]) -> Result<f64, MergeError> {
    match (kind, binary) {
        (Kind::Float4, true) => Ok(f32::from_bits(be_int(v, 4)? as u32) as f64),
        (Kind::Float4, false) => Ok(float::parse_f32(v)? as f64),
        (_, true) => Ok(f64::from_bits(be_int(v, 8)? as u64)),
        (_, false) => float::parse_f64(v),
    }
}

/// A numeric value, in text or binary format.
pub fn numeric(binary: bool, v: &[u8]) -> Result<Numeric, MergeError> {
    if binary {
        Numeric::from_binary(v)
    } else {
        Numeric::parse(v)
    }
}

fn boolean(binary: bool, v: &[u8]) -> Result<bool, MergeError> {
    match (binary, v) {
        (false, b"t") | (true, [1]) => Ok(true),
        (false, b"f") | (true, [0]) => Ok(false),
        _ => Err("malformed boolean value from a shard".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(kind: Kind, binary: bool, a: &[u8], b: &[u8]) -> Ordering {
        compare(kind, binary, a, b).unwrap()
    }

    #[test]
    fn integers_text_and_binary() {
        assert_eq!(cmp(Kind::Int4, false, b"-10", b"9"), Ordering::Less);
        assert_eq!(cmp(Kind::Int8, false, b"100", b"99"), Ordering::Greater);
        let (a, b) = ((-2i16).to_be_bytes(), 1i16.to_be_bytes());
        assert_eq!(cmp(Kind::Int2, true, &a, &b), Ordering::Less);
        let (a, b) = (i64::MIN.to_be_bytes(), i64::MAX.to_be_bytes());
        assert_eq!(cmp(Kind::Int8, true, &a, &b), Ordering::Less);
        // oid is unsigned.
        let (a, b) = (1u32.to_be_bytes(), 0xffff_fff0u32.to_be_bytes());
        assert_eq!(cmp(Kind::Oid, true, &a, &b), Ordering::Less);
        assert!(compare(Kind::Int4, true, &[0, 1], &[0, 0, 0, 1]).is_err());
        assert!(compare(Kind::Int4, false, b"1x", b"1").is_err());
    }

    #[test]
    fn floats_text_and_binary() {
        assert_eq!(
            cmp(Kind::Float8, false, b"NaN", b"Infinity"),
            Ordering::Greater
        );
        assert_eq!(cmp(Kind::Float8, false, b"-0", b"0"), Ordering::Equal);
        assert_eq!(
            cmp(Kind::Float8, false, b"1e+20", b"9.5e+19"),
            Ordering::Greater
        );
        let nan = f64::NAN.to_be_bytes();
        let inf = f64::INFINITY.to_be_bytes();
        assert_eq!(cmp(Kind::Float8, true, &nan, &inf), Ordering::Greater);
        let (a, b) = ((-0.0f32).to_be_bytes(), 0.0f32.to_be_bytes());
        assert_eq!(cmp(Kind::Float4, true, &a, &b), Ordering::Equal);
    }

    #[test]
    fn other_types() {
        assert_eq!(cmp(Kind::Bool, false, b"f", b"t"), Ordering::Less);
        assert_eq!(cmp(Kind::Bool, true, &[1], &[0]), Ordering::Greater);
        let bp = Kind::Text { bpchar: true };
        assert_eq!(cmp(bp, false, b"a  ", b"a"), Ordering::Equal);
        assert_eq!(cmp(bp, false, b"a ", b"a\x01"), Ordering::Less);
        assert_eq!(
            cmp(Kind::Text { bpchar: false }, false, b"B", b"a"),
            Ordering::Less
        );
        let date = Kind::Date(DateKind::Date);
        assert_eq!(
            cmp(date, false, b"0001-01-01 BC", b"0001-01-01"),
            Ordering::Less
        );
        let (a, b) = (i32::MIN.to_be_bytes(), 0i32.to_be_bytes());
        assert_eq!(cmp(date, true, &a, &b), Ordering::Less);
    }

    #[test]
    fn numeric_text_and_binary() {
        let bin = |s: &str| Numeric::parse(s.as_bytes()).unwrap().to_binary().unwrap();
        assert_eq!(cmp(Kind::Numeric, false, b"1.0", b"1.00"), Ordering::Equal);
        let (a, b) = (bin("1.0"), bin("1.00"));
        assert_eq!(cmp(Kind::Numeric, true, &a, &b), Ordering::Equal);
        let (a, b) = (bin("-10000"), bin("-9999.99"));
        assert_eq!(cmp(Kind::Numeric, true, &a, &b), Ordering::Less);
        let (a, b) = (bin("NaN"), bin("Infinity"));
        assert_eq!(cmp(Kind::Numeric, true, &a, &b), Ordering::Greater);
        assert!(compare(Kind::Numeric, true, &a, &[0, 0]).is_err());
        assert!(compare(Kind::Numeric, true, &a, b"1").is_err());
    }

    #[test]
    fn what_cannot_be_compared() {
        let text = Column::new(b"t", 25, false);
        assert!(check_comparable(&text, false).is_err());
        assert!(check_comparable(&text, true).is_ok());
        assert!(check_comparable(&Column::new(b"n", 1700, true), true).is_ok());
        let interval = Column::new(b"i", 1186, false);
        let err = check_comparable(&interval, true).unwrap_err();
        assert!(err.to_string().contains("OID 1186"), "{err}");
    }
}
