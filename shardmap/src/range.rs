//! Keyspace ranges in the compact hex notation Vitess made familiar.
//!
//! `-80` is the lower half of the keyspace, `80-` the upper half, `40-80` a quarter and `-` all
//! of it. Each bound is a big-endian prefix of the 64-bit keyspace ID given as whole bytes
//! (an even number of hex digits, at most 16); an empty start is 0 and an empty end is the end
//! of the keyspace. A range holds IDs `start <= id < end`.

use std::fmt;

use crate::keyspace::KeyspaceId;

/// A half-open range of keyspace IDs. `end == None` means "to the end of the keyspace"
/// (2^64, which does not fit in a u64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRange {
    pub start: u64,
    pub end: Option<u64>,
}

/// Why a range string is not a range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error(
        "range {0:?} has no '-': write it as START-END in hex, e.g. \"-80\", \"40-80\" or \"80-\""
    )]
    NoDash(String),
    #[error("range bound {bound:?} is not hex: use only 0-9 and a-f")]
    NotHex { bound: String },
    #[error("range bound {bound:?} has an odd number of hex digits: bounds are whole bytes, e.g. \"08\" not \"8\"")]
    OddDigits { bound: String },
    #[error("range bound {bound:?} is longer than 16 hex digits (the keyspace ID has 64 bits)")]
    TooLong { bound: String },
    #[error("range {0:?} is empty: its start must be below its end")]
    Empty(String),
}

impl KeyRange {
    /// The whole keyspace, `-`.
    pub const FULL: KeyRange = KeyRange {
        start: 0,
        end: None,
    };

    /// Builds a range; `None` if it would be empty.
    pub fn new(start: u64, end: Option<u64>) -> Option<KeyRange> {
        match end {
            Some(e) if e <= start => None,
            _ => Some(KeyRange { start, end }),
        }
    }

    /// Parses `START-END` hex notation.
    pub fn parse(text: &str) -> Result<KeyRange, RangeError> {
        let text = text.trim();
        let (start, end) = text
            .split_once('-')
            .ok_or_else(|| RangeError::NoDash(text.to_string()))?;
        let start = parse_bound(start)?.unwrap_or(0);
        let end = parse_bound(end)?;
        // An end bound of all zeros ("00") would be an empty range; an explicit "-00" too.
        KeyRange::new(start, end).ok_or_else(|| RangeError::Empty(text.to_string()))
    }

    /// Whether the range holds this ID.
    #[inline]
    pub fn contains(&self, id: KeyspaceId) -> bool {
        id.0 >= self.start && self.end.is_none_or(|e| id.0 < e)
    }

    /// The exclusive end as a u128, so arithmetic at the top of the keyspace needs no cases.
    pub fn end_u128(&self) -> u128 {
        self.end.map_or(1u128 << 64, u128::from)
    }

    /// Number of IDs in the range.
    pub fn width(&self) -> u128 {
        self.end_u128() - u128::from(self.start)
    }

    /// Whether two ranges share at least one ID.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        u128::from(self.start) < other.end_u128() && u128::from(other.start) < self.end_u128()
    }
}

fn parse_bound(text: &str) -> Result<Option<u64>, RangeError> {
    if text.is_empty() {
        return Ok(None);
    }
    let bound = || text.to_string();
    if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(RangeError::NotHex { bound: bound() });
    }
    if !text.len().is_multiple_of(2) {
        return Err(RangeError::OddDigits { bound: bound() });
    }
    if text.len() > 16 {
        return Err(RangeError::TooLong { bound: bound() });
    }
    let value = u64::from_str_radix(text, 16).map_err(|_| RangeError::NotHex { bound: bound() })?;
    // Left-align: "80" is 0x8000_0000_0000_0000.
    Ok(Some(value << ((64 - 4 * text.len() as u32) % 64)))
}

/// Whole bytes a bound needs once its trailing zero bytes are dropped.
fn bound_bytes(value: u64) -> usize {
    if value == 0 {
        0
    } else {
        8 - (value.trailing_zeros() / 8) as usize
    }
}

/// Writes a bound with `bytes` whole bytes; an empty start (0) is written as nothing.
fn fmt_bound(f: &mut fmt::Formatter<'_>, value: u64, bytes: usize) -> fmt::Result {
    if value == 0 || bytes == 0 {
        return Ok(());
    }
    write!(
        f,
        "{:0width$x}",
        value >> (64 - 8 * bytes),
        width = bytes * 2
    )
}

/// Both bounds are written with the same number of bytes (`0080-0100`, not `0080-01`), the
/// fewest that show them exactly, so the ranges of one map line up.
impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = bound_bytes(self.start).max(self.end.map_or(0, bound_bytes));
        fmt_bound(f, self.start, bytes)?;
        f.write_str("-")?;
        match self.end {
            Some(e) => fmt_bound(f, e, bytes),
            None => Ok(()),
        }
    }
}

impl std::str::FromStr for KeyRange {
    type Err = RangeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyRange::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> KeyRange {
        KeyRange::parse(s).unwrap()
    }

    #[test]
    fn parses_vitess_notation() {
        assert_eq!(r("-"), KeyRange::FULL);
        assert_eq!(
            r("-80"),
            KeyRange {
                start: 0,
                end: Some(1 << 63)
            }
        );
        assert_eq!(
            r("80-"),
            KeyRange {
                start: 1 << 63,
                end: None
            }
        );
        assert_eq!(r("40-80").start, 0x4000_0000_0000_0000);
        assert_eq!(r("0080-0100").end, Some(0x0100_0000_0000_0000));
        assert_eq!(r("ffffffffffffffff-").start, u64::MAX);
        assert_eq!(r("C0-").start, 0xc000_0000_0000_0000);
    }

    #[test]
    fn rejects_malformed() {
        assert!(matches!(KeyRange::parse("80"), Err(RangeError::NoDash(_))));
        assert!(matches!(
            KeyRange::parse("8-"),
            Err(RangeError::OddDigits { .. })
        ));
        assert!(matches!(
            KeyRange::parse("zz-"),
            Err(RangeError::NotHex { .. })
        ));
        assert!(matches!(
            KeyRange::parse("+1-"),
            Err(RangeError::NotHex { .. })
        ));
        assert!(matches!(
            KeyRange::parse("112233445566778899-"),
            Err(RangeError::TooLong { .. })
        ));
        assert!(matches!(
            KeyRange::parse("80-40"),
            Err(RangeError::Empty(_))
        ));
        assert!(matches!(
            KeyRange::parse("80-80"),
            Err(RangeError::Empty(_))
        ));
        assert!(matches!(KeyRange::parse("-00"), Err(RangeError::Empty(_))));
    }

    #[test]
    fn displays_compactly_and_round_trips() {
        for s in [
            "-",
            "-80",
            "80-",
            "40-80",
            "0080-0100",
            "555555-aaaaaa",
            "ffffffffffffffff-",
        ] {
            assert_eq!(r(s).to_string(), s);
        }
        assert_eq!(r("4000-8000").to_string(), "40-80");
    }

    #[test]
    fn contains_and_overlaps() {
        let low = r("-80");
        assert!(low.contains(KeyspaceId(0)));
        assert!(low.contains(KeyspaceId((1 << 63) - 1)));
        assert!(!low.contains(KeyspaceId(1 << 63)));
        assert!(r("80-").contains(KeyspaceId(u64::MAX)));
        assert!(low.overlaps(&r("40-c0")));
        assert!(!low.overlaps(&r("80-")));
    }
}
