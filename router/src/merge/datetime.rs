//! `date`, `timestamp` and `timestamptz` values in text format, turned into numbers that sort
//! as Postgres sorts the values.
//!
//! Only the ISO DateStyle output (`2024-01-31`, `2024-01-31 12:00:00.5`, `... +05:30`, with a
//! trailing ` BC` for years before 1, and `infinity` / `-infinity`) is understood; any other
//! shape is an error, since e.g. `01/02/2024` cannot be ordered without knowing the DateStyle.

use super::MergeError;

const NOT_ISO: &str =
    "date/time values in text format can be merged across shards only with DateStyle ISO";

/// Which of the three types a text value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateKind {
    Date,
    Timestamp,
    TimestampTz,
}

/// A sort key for the value: days (date) or microseconds (timestamps, in UTC for timestamptz)
/// since 0000-03-01 of the proleptic Gregorian calendar; the infinities at the extremes.
pub fn sort_key(kind: DateKind, text: &[u8]) -> Result<i128, MergeError> {
    match text {
        b"infinity" => return Ok(i128::MAX),
        b"-infinity" => return Ok(i128::MIN),
        _ => {}
    }
    let (text, bc) = match text.strip_suffix(b" BC") {
        Some(t) => (t, true),
        None => (text, false),
    };
    let mut p = Cursor { s: text };
    let year = p.number(4, 9)?;
    p.expect(b'-')?;
    let month = p.number(2, 2)?;
    p.expect(b'-')?;
    let day = p.number(2, 2)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || year == 0 {
        return Err(NOT_ISO.into());
    }
    // Year 1 BC is astronomical year 0.
    let year = if bc { 1 - year } else { year };
    let days = days_from_civil(year, month, day);
    if kind == DateKind::Date {
        return p.end().map(|_| days);
    }
    p.expect(b' ')?;
    let h = p.number(2, 2)?;
    p.expect(b':')?;
    let m = p.number(2, 2)?;
    p.expect(b':')?;
    let s = p.number(2, 2)?;
    let mut micros = ((h * 60 + m) * 60 + s) * 1_000_000;
    if p.peek() == Some(b'.') {
        p.expect(b'.')?;
        let start = p.s.len();
        let frac = p.number(1, 6)?;
        let len = (start - p.s.len()) as u32;
        micros += frac * 10i128.pow(6 - len);
    }
    if kind == DateKind::TimestampTz {
        let sign = match p.peek() {
            Some(b'+') => 1,
            Some(b'-') => -1,
            _ => return Err(NOT_ISO.into()),
        };
        p.s = &p.s[1..];
        let mut offset = p.number(2, 2)? * 3600;
        for unit in [60, 1] {
            if p.peek() == Some(b':') {
                p.expect(b':')?;
                offset += p.number(2, 2)? * unit;
            }
        }
        // Local time minus the UTC offset is UTC.
        micros -= sign * offset * 1_000_000;
    }
    p.end()?;
    Ok(days * 86_400_000_000 + micros)
}

struct Cursor<'a> {
    s: &'a [u8],
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.first().copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), MergeError> {
        match self.s.split_first() {
            Some((&x, rest)) if x == c => {
                self.s = rest;
                Ok(())
            }
            _ => Err(NOT_ISO.into()),
        }
    }

    /// Between `min` and `max` ASCII digits.
    fn number(&mut self, min: usize, max: usize) -> Result<i128, MergeError> {
        let n = self.s.iter().take_while(|c| c.is_ascii_digit()).count();
        if n < min || n > max {
            return Err(NOT_ISO.into());
        }
        let v = self.s[..n]
            .iter()
            .fold(0i128, |acc, c| acc * 10 + (c - b'0') as i128);
        self.s = &self.s[n..];
        Ok(v)
    }

    fn end(&self) -> Result<(), MergeError> {
        if self.s.is_empty() {
            Ok(())
        } else {
            Err(NOT_ISO.into())
        }
    }
}

/// Days from 0000-03-01 to the given proleptic Gregorian date (H. Hinnant's algorithm; any
/// fixed origin works, only the order matters).
fn days_from_civil(y: i128, m: i128, d: i128) -> i128 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: DateKind, s: &str) -> i128 {
        sort_key(kind, s.as_bytes()).unwrap()
    }

    #[test]
    fn dates_sort_like_postgres() {
        let d = |s| key(DateKind::Date, s);
        let ordered = [
            "-infinity",
            "4714-11-24 BC",
            "0044-03-15 BC",
            "0001-12-31 BC",
            "0001-01-01",
            "1999-12-31",
            "2000-01-01",
            "2000-03-01",
            "10000-01-01",
            "infinity",
        ];
        for w in ordered.windows(2) {
            assert!(d(w[0]) < d(w[1]), "{} < {}", w[0], w[1]);
        }
        assert_eq!(d("2000-03-01") - d("2000-02-28"), 2);
        for bad in [
            "01/02/2024",
            "2024-1-02",
            "2024-01-02 AD",
            "Tue Jan 02 2024",
        ] {
            assert!(sort_key(DateKind::Date, bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn timestamps_with_fractions_and_zones() {
        let t = |s| key(DateKind::Timestamp, s);
        assert!(t("2024-01-01 00:00:00") < t("2024-01-01 00:00:00.000001"));
        assert!(t("2024-01-01 00:00:00.5") > t("2024-01-01 00:00:00.49"));
        assert!(t("0001-01-01 00:00:00 BC") < t("0001-01-01 00:00:00"));
        let tz = |s| key(DateKind::TimestampTz, s);
        assert_eq!(
            tz("2024-01-01 05:30:00+05:30"),
            tz("2024-01-01 00:00:00+00")
        );
        assert!(tz("2024-01-01 01:00:00+02") < tz("2024-01-01 00:00:00+00"));
        assert_eq!(
            tz("2024-01-01 00:00:00-00:00:10"),
            tz("2024-01-01 00:00:10+00")
        );
        assert!(sort_key(DateKind::TimestampTz, b"2024-01-01 00:00:00").is_err());
    }
}
