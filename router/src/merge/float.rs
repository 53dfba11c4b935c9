//! `float4` / `float8` values: parsing Postgres's text output, Postgres's ordering (NaN above
//! everything, `-0` equal to `0`), and formatting exactly as `float4out` / `float8out` do with
//! the default `extra_float_digits = 1`: the shortest digits that read back to the same value,
//! fixed-point for decimal exponents in [-4, 15) (float8) or [-4, 6) (float4), otherwise
//! `d.ddde+XX`; specials as `NaN`, `Infinity`, `-Infinity`, and `-0`.
//!
//! The digits are chosen as Postgres's Ryu code chooses them (see [`shortest_digits`]), in
//! exact decimal arithmetic on the value's exact expansion, which Rust's formatter provides.

use std::cmp::Ordering;

use super::numeric::Numeric;
use super::MergeError;

const BAD: &str = "malformed floating-point value from a shard";

/// Parses `float8out` text.
pub fn parse_f64(text: &[u8]) -> Result<f64, MergeError> {
    match text {
        b"NaN" => Ok(f64::NAN),
        b"Infinity" => Ok(f64::INFINITY),
        b"-Infinity" => Ok(f64::NEG_INFINITY),
        _ => plain(text)?.parse().map_err(|_| BAD.into()),
    }
}

/// Parses `float4out` text (as f32, so the value is exactly the shard's).
pub fn parse_f32(text: &[u8]) -> Result<f32, MergeError> {
    match text {
        b"NaN" => Ok(f32::NAN),
        b"Infinity" => Ok(f32::INFINITY),
        b"-Infinity" => Ok(f32::NEG_INFINITY),
        _ => plain(text)?.parse().map_err(|_| BAD.into()),
    }
}

/// A finite number's text, refusing what Rust would parse but Postgres never prints
/// (`inf`, `nan`, `+1`, whitespace).
fn plain(text: &[u8]) -> Result<&str, MergeError> {
    let ok = !text.is_empty()
        && text
            .iter()
            .all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e'))
        && text.first() != Some(&b'+');
    if !ok {
        return Err(BAD.into());
    }
    std::str::from_utf8(text).map_err(|_| BAD.into())
}

/// Postgres's float ordering (`float8_cmp_internal`): NaN equals NaN and sorts above
/// everything else, `-0` equals `0`.
pub fn compare(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// `float8out`.
pub fn format_f64(v: f64) -> String {
    let shortest = || {
        let a = v.abs();
        let bits = a.to_bits();
        let prev = f64::from_bits(bits.saturating_sub(1));
        let next = f64::from_bits(bits + 1);
        // 800 digits hold any double's exact decimal expansion.
        let exact = |x: f64| format!("{x:.800e}");
        let next = next.is_finite().then(|| exact(next));
        shortest_digits(&exact(a), &exact(prev), next.as_deref())
    };
    let (nan, inf, zero, neg) = (v.is_nan(), v.is_infinite(), v == 0.0, v.is_sign_negative());
    format_with(nan, inf, zero, neg, shortest, 15)
}

/// `float4out`.
pub fn format_f32(v: f32) -> String {
    let shortest = || {
        let a = v.abs();
        let bits = a.to_bits();
        let prev = f32::from_bits(bits.saturating_sub(1));
        let next = f32::from_bits(bits + 1);
        let exact = |x: f32| format!("{x:.200e}");
        let next = next.is_finite().then(|| exact(next));
        shortest_digits(&exact(a), &exact(prev), next.as_deref())
    };
    let (nan, inf, zero, neg) = (v.is_nan(), v.is_infinite(), v == 0.0, v.is_sign_negative());
    format_with(nan, inf, zero, neg, shortest, 6)
}

/// The digits Postgres's Ryu prints for a positive value, as `d.ddde<exp>` text, given the
/// exact decimal expansions (`{:e}` with enough digits) of the value and its neighbours.
///
/// Ryu (as built in Postgres, without `STRICTLY_SHORTEST`) takes the fewest digits whose value
/// lies strictly between the midpoints to the neighbouring floats, and of those the one
/// closest to the exact value, an exact tie going to the even digit. Rust's own shortest
/// formatting also accepts a midpoint that happens to read back correctly, and rounds ties
/// up, so the choice is made here, in exact decimal arithmetic.
fn shortest_digits(exact: &str, prev: &str, next: Option<&str>) -> String {
    let split = |s: &str| -> (String, i32) {
        let (m, e) = s.split_once('e').unwrap_or((s, "0"));
        (
            m.chars().filter(|c| *c != '.').collect(),
            e.parse().unwrap_or(0),
        )
    };
    let num = |digits: &str, exp: i32| {
        Numeric::parse(plain_decimal(digits, exp).as_bytes()).unwrap_or(Numeric::NaN)
    };
    let (digits, exp) = split(exact);
    let value = num(&digits, exp);
    let (pd, pe) = split(prev);
    let low = value.add(&num(&pd, pe)).half();
    let high = match next {
        Some(n) => {
            let (nd, ne) = split(n);
            value.add(&num(&nd, ne)).half()
        }
        // Above the largest finite value the gap is the same as below it.
        None => value.add(&value).add(&negate(&low)),
    };
    let inside = |c: &Numeric| less(&low, c) && less(c, &high);
    for k in 1..digits.len() {
        let floor_digits = &digits[..k];
        let (ceil_digits, ceil_exp) = increment(floor_digits, exp);
        let floor = num(floor_digits, exp);
        let ceil = num(&ceil_digits, ceil_exp);
        let pick_ceil = match (inside(&floor), inside(&ceil)) {
            (false, false) => continue,
            (true, false) => false,
            (false, true) => true,
            (true, true) => {
                // Closest to the value; on a tie, the even one.
                let twice = value.add(&value);
                let sum = floor.add(&ceil);
                match super::numeric::compare_text(
                    twice.to_text().as_bytes(),
                    sum.to_text().as_bytes(),
                ) {
                    Ok(std::cmp::Ordering::Greater) => true,
                    Ok(std::cmp::Ordering::Less) => false,
                    _ => floor_digits
                        .bytes()
                        .last()
                        .is_some_and(|d| (d - b'0') % 2 == 1),
                }
            }
        };
        let (d, e) = if pick_ceil {
            (ceil_digits, ceil_exp)
        } else {
            (floor_digits.to_string(), exp)
        };
        let d = d.trim_end_matches('0');
        let d = if d.is_empty() { "0" } else { d };
        return format!("{}.{}e{e}", &d[..1], &d[1..]);
    }
    exact.to_string()
}

/// `d.ddd × 10^exp` (digits given without the point) as plain decimal text.
fn plain_decimal(digits: &str, exp: i32) -> String {
    let n = digits.len() as i32;
    if exp < 0 {
        format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
    } else if exp + 1 >= n {
        format!("{digits}{}", "0".repeat((exp + 1 - n) as usize))
    } else {
        let (int, frac) = digits.split_at((exp + 1) as usize);
        format!("{int}.{frac}")
    }
}

/// The digits one unit in the last place above `digits` (at exponent `exp`): `199` -> `200`,
/// `99` -> `100` at `exp + 1`.
fn increment(digits: &str, exp: i32) -> (String, i32) {
    let mut d: Vec<u8> = digits.bytes().collect();
    for c in d.iter_mut().rev() {
        if *c == b'9' {
            *c = b'0';
        } else {
            *c += 1;
            return (String::from_utf8_lossy(&d).into_owned(), exp);
        }
    }
    d.insert(0, b'1');
    d.pop();
    (String::from_utf8_lossy(&d).into_owned(), exp + 1)
}

fn negate(n: &Numeric) -> Numeric {
    let text = n.to_text();
    let flipped = match text.strip_prefix('-') {
        Some(t) => t.to_string(),
        None => format!("-{text}"),
    };
    Numeric::parse(flipped.as_bytes()).unwrap_or(Numeric::NaN)
}

fn less(a: &Numeric, b: &Numeric) -> bool {
    super::numeric::compare_text(a.to_text().as_bytes(), b.to_text().as_bytes())
        == Ok(std::cmp::Ordering::Less)
}

/// Lays out the shortest digits Postgres's way. `sci` is Rust's `{:e}` text of the magnitude
/// (`d.ddde-5`); `fixed_below` is the decimal exponent from which scientific notation is used.
fn format_with(
    nan: bool,
    inf: bool,
    zero: bool,
    neg: bool,
    sci: impl FnOnce() -> String,
    fixed_below: i32,
) -> String {
    if nan {
        return "NaN".into();
    }
    let sign = if neg { "-" } else { "" };
    if inf {
        return format!("{sign}Infinity");
    }
    if zero {
        return format!("{sign}0");
    }
    let sci = sci();
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let body = if (-4..fixed_below).contains(&exp) {
        if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if n <= exp + 1 {
            format!("{digits}{}", "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{point}{rest}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float8_text_like_postgres() {
        let parse = |s: &str| s.parse::<f64>().unwrap();
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "-0"),
            (1.0, "1"),
            (0.1, "0.1"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e20, "1e+20"),
            (123456789012345.0, "123456789012345"),
            (1234567890123456.0, "1.234567890123456e+15"),
            (1e15, "1e+15"),
            (-2.5, "-2.5"),
            (1.0 / 3.0, "0.3333333333333333"),
            (1e-300, "1e-300"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
            // An exact tie between ...722.2 and ...722.3: Postgres (Ryu) takes the even digit.
            (parse("624585362004722.25"), "624585362004722.2"),
            // The 16-digit 2.418586751927276e+17 is exactly a midpoint: Ryu needs 17 digits.
            (parse("-2.4185867519272762e17"), "-2.4185867519272762e+17"),
        ];
        for &(v, s) in cases {
            assert_eq!(format_f64(v), s);
            let back = parse_f64(s.as_bytes()).unwrap();
            assert!(back.to_bits() == v.to_bits() || v.is_nan());
        }
    }

    #[test]
    fn float4_text_like_postgres() {
        assert_eq!(format_f32(123456.0), "123456");
        assert_eq!(format_f32(1234567.0), "1.234567e+06");
        assert_eq!(format_f32(0.1), "0.1");
        assert_eq!(format_f32(1.0 / 3.0), "0.33333334");
        assert_eq!(parse_f32(b"0.33333334").unwrap(), 1.0 / 3.0);
    }

    #[test]
    fn rejects_what_postgres_never_prints() {
        for bad in ["inf", "nan", "+1", " 1", "", "1,5"] {
            assert!(parse_f64(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn ordering() {
        assert_eq!(compare(f64::NAN, f64::INFINITY), Ordering::Greater);
        assert_eq!(compare(f64::NAN, f64::NAN), Ordering::Equal);
        assert_eq!(compare(-0.0, 0.0), Ordering::Equal);
        assert_eq!(compare(f64::NEG_INFINITY, -1e308), Ordering::Less);
    }
}
