//! Exact decimal arithmetic on Postgres `numeric` values: parsing, comparison, addition, and
//! the division `avg` does, in text format (output byte for byte as `numeric_out` prints it)
//! and in binary format (byte for byte as `numeric_send` sends it).
//!
//! A finite value is kept as decimal digits plus a display scale (`dscale`: the number of
//! digits after the point, which Postgres prints even when they are zeros, e.g. `4.00`).
//! Text and binary are what a shard sent, so decoding is strict and fails rather than guesses.
//!
//! The binary format is `numeric_send`'s: int16 `ndigits`, int16 `weight`, uint16 `sign`,
//! uint16 `dscale`, then `ndigits` int16 base-10000 digits, most significant first; the value
//! is `sum(digit[i] * 10000^(weight - i))`.

use std::cmp::Ordering;

use super::MergeError;

/// Postgres's `NUMERIC_MIN_SIG_DIGITS`: a quotient gets at least this many significant digits.
const MIN_SIG_DIGITS: i64 = 16;
/// Postgres's `NUMERIC_MAX_DISPLAY_SCALE`.
const MAX_DISPLAY_SCALE: i64 = 1000;
/// Postgres's `DEC_DIGITS`: numeric stores base-10000 digits, which the scale rules count in.
const DEC_DIGITS: i64 = 4;
/// Postgres's `NBASE`: the base of binary numeric digits.
const NBASE: u16 = 10000;
/// Postgres's `NUMERIC_DSCALE_MAX`: `numeric_recv` refuses larger display scales.
const MAX_DSCALE: usize = 0x3FFF;

/// The binary `sign` field: Postgres's `NUMERIC_POS`, `NUMERIC_NEG`, `NUMERIC_NAN`,
/// `NUMERIC_PINF` and `NUMERIC_NINF` (the infinities since Postgres 14).
const SIGN_POS: u16 = 0x0000;
const SIGN_NEG: u16 = 0x4000;
const SIGN_NAN: u16 = 0xC000;
const SIGN_PINF: u16 = 0xD000;
const SIGN_NINF: u16 = 0xF000;
/// The dscale `numeric_send` sends for the infinities: it reads the dscale bits of the stored
/// short header, and the flag bits of 0xD000 and 0xF000 overlap them (0x1000 >> 7 = 32).
/// NaN (0xC000) gives 0. Checked against Postgres 15's `numeric_send`.
const INF_DSCALE: u16 = 32;

const BAD_BINARY: &str = "malformed binary numeric value from a shard";
const OVERFLOW: &str = "value overflows numeric format";

/// A numeric value, including the special values Postgres 14+ has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Numeric {
    NaN,
    PosInf,
    NegInf,
    Finite(Decimal),
}

/// A finite decimal: `(-1)^neg * digits * 10^-scale`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decimal {
    neg: bool,
    /// Decimal digits (0..=9), least significant first, without high-order zeros; empty is zero.
    digits: Vec<u8>,
    /// Display scale: digits after the decimal point.
    scale: usize,
}

impl Numeric {
    /// Parses `numeric_out` text: `NaN`, `Infinity`, `-Infinity`, or `-?digits(.digits)?`.
    pub fn parse(text: &[u8]) -> Result<Numeric, MergeError> {
        match text {
            b"NaN" => return Ok(Numeric::NaN),
            b"Infinity" => return Ok(Numeric::PosInf),
            b"-Infinity" => return Ok(Numeric::NegInf),
            _ => {}
        }
        let p = Parts::split(text)?;
        let mut digits: Vec<u8> = p.int.iter().chain(p.frac).rev().map(|c| c - b'0').collect();
        while digits.last() == Some(&0) {
            digits.pop();
        }
        Ok(Numeric::Finite(Decimal {
            neg: p.neg && !digits.is_empty(),
            digits,
            scale: p.frac.len(),
        }))
    }

    /// Decodes `numeric_send`'s binary format (see the module documentation). As `numeric_out`
    /// does, the value shows exactly `dscale` decimals: digits beyond it are cut off.
    pub fn from_binary(v: &[u8]) -> Result<Numeric, MergeError> {
        let word = |i: usize| {
            v.get(2 * i..2 * i + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
                .ok_or(MergeError::from(BAD_BINARY))
        };
        let ndigits = word(0)? as i16;
        let weight = word(1)? as i16;
        let sign = word(2)?;
        let dscale = word(3)? as usize;
        if ndigits < 0 || v.len() != 8 + 2 * ndigits as usize || dscale > MAX_DSCALE {
            return Err(BAD_BINARY.into());
        }
        let groups = (4..4 + ndigits as usize)
            .map(word)
            .collect::<Result<Vec<u16>, _>>()?;
        if groups.iter().any(|&g| g >= NBASE) {
            return Err(BAD_BINARY.into());
        }
        match sign {
            SIGN_NAN => Ok(Numeric::NaN),
            SIGN_PINF => Ok(Numeric::PosInf),
            SIGN_NINF => Ok(Numeric::NegInf),
            SIGN_POS | SIGN_NEG => Ok(Numeric::Finite(Decimal::from_groups(
                sign == SIGN_NEG,
                weight as i64,
                dscale,
                &groups,
            ))),
            _ => Err(BAD_BINARY.into()),
        }
    }

    /// Encodes the value exactly as `numeric_send` sends it: no zero base-10000 digits at
    /// either end (Postgres's `make_result` strips them before storing), zero as no digits
    /// with weight 0 and a positive sign, and the display scale kept.
    pub fn to_binary(&self) -> Result<Vec<u8>, MergeError> {
        let (sign, weight, dscale, groups) = match self {
            Numeric::NaN => (SIGN_NAN, 0, 0, Vec::new()),
            Numeric::PosInf => (SIGN_PINF, 0, INF_DSCALE, Vec::new()),
            Numeric::NegInf => (SIGN_NINF, 0, INF_DSCALE, Vec::new()),
            Numeric::Finite(d) => {
                let (weight, groups) = d.groups();
                let sign = if d.neg { SIGN_NEG } else { SIGN_POS };
                // Postgres cannot store what does not fit these fields either.
                let weight = i16::try_from(weight).map_err(|_| MergeError::from(OVERFLOW))?;
                if d.scale > MAX_DSCALE || groups.len() > i16::MAX as usize {
                    return Err(OVERFLOW.into());
                }
                (sign, weight, d.scale as u16, groups)
            }
        };
        let mut out = Vec::with_capacity(8 + 2 * groups.len());
        out.extend_from_slice(&(groups.len() as u16).to_be_bytes());
        out.extend_from_slice(&weight.to_be_bytes());
        out.extend_from_slice(&sign.to_be_bytes());
        out.extend_from_slice(&dscale.to_be_bytes());
        for g in groups {
            out.extend_from_slice(&g.to_be_bytes());
        }
        Ok(out)
    }

    /// Orders two values as Postgres's `cmp_numerics` does: by value (so `1.0` equals `1.00`),
    /// with `-Infinity` lowest and `NaN` above `Infinity` (and equal to itself).
    pub fn cmp_value(&self, other: &Numeric) -> Ordering {
        fn rank(n: &Numeric) -> i8 {
            match n {
                Numeric::NegInf => 0,
                Numeric::Finite(_) => 1,
                Numeric::PosInf => 2,
                Numeric::NaN => 3,
            }
        }
        match (self, other) {
            (Numeric::Finite(a), Numeric::Finite(b)) => a.cmp_value(b),
            _ => rank(self).cmp(&rank(other)),
        }
    }

    /// Zero with no decimals (the start of a sum).
    pub fn zero() -> Numeric {
        Numeric::Finite(Decimal {
            neg: false,
            digits: Vec::new(),
            scale: 0,
        })
    }

    /// An integer, e.g. a bigint sum on its way to `avg`.
    pub fn from_i128(v: i128) -> Numeric {
        let mut digits = Vec::new();
        let mut m = v.unsigned_abs();
        while m > 0 {
            digits.push((m % 10) as u8);
            m /= 10;
        }
        Numeric::Finite(Decimal {
            neg: v < 0,
            digits,
            scale: 0,
        })
    }

    /// `a + b` as `numeric_add` computes it: the result's scale is the larger input scale;
    /// NaN absorbs everything and opposite infinities give NaN.
    pub fn add(&self, other: &Numeric) -> Numeric {
        use Numeric::*;
        match (self, other) {
            (NaN, _) | (_, NaN) | (PosInf, NegInf) | (NegInf, PosInf) => NaN,
            (PosInf, _) | (_, PosInf) => PosInf,
            (NegInf, _) | (_, NegInf) => NegInf,
            (Finite(a), Finite(b)) => Finite(a.add(b)),
        }
    }

    /// `sum / count` as `numeric_div` computes it for `avg`: the scale from `select_div_scale`,
    /// the last digit rounded half away from zero. `count` must be positive.
    pub fn div_count(&self, count: u64) -> Result<Numeric, MergeError> {
        if count == 0 {
            return Err("division by a zero count".into());
        }
        Ok(match self {
            Numeric::Finite(d) => Numeric::Finite(d.div_count(count)?),
            other => other.clone(),
        })
    }

    /// A finite value as sign, magnitude and display scale (`None` for NaN and infinities).
    pub fn to_big(&self) -> Option<(bool, num_bigint::BigUint, usize)> {
        let Numeric::Finite(d) = self else {
            return None;
        };
        let text: Vec<u8> = d.digits.iter().rev().map(|&g| b'0' + g).collect();
        let magnitude = num_bigint::BigUint::parse_bytes(&text, 10).unwrap_or_default();
        Some((d.neg && !d.is_zero(), magnitude, d.scale))
    }

    /// The finite value `(-1)^neg * magnitude * 10^-scale`, shown with `scale` decimals.
    pub fn from_big(neg: bool, magnitude: &num_bigint::BigUint, scale: usize) -> Numeric {
        let digits: Vec<u8> = if magnitude.bits() == 0 {
            Vec::new()
        } else {
            magnitude
                .to_str_radix(10)
                .bytes()
                .rev()
                .map(|c| c - b'0')
                .collect()
        };
        let neg = neg && !digits.is_empty();
        Numeric::Finite(Decimal { neg, digits, scale })
    }

    /// Half of a finite value, exactly (one more decimal); specials stay as they are.
    pub fn half(&self) -> Numeric {
        match self {
            Numeric::Finite(d) if !d.is_zero() => {
                // x / 2 = 5x / 10.
                let mut five = Vec::new();
                for _ in 0..5 {
                    five = add_mag(&five, &d.digits);
                }
                Numeric::Finite(Decimal {
                    neg: d.neg,
                    digits: five,
                    scale: d.scale + 1,
                })
            }
            other => other.clone(),
        }
    }

    /// The value as `numeric_out` prints it.
    pub fn to_text(&self) -> String {
        match self {
            Numeric::NaN => "NaN".into(),
            Numeric::PosInf => "Infinity".into(),
            Numeric::NegInf => "-Infinity".into(),
            Numeric::Finite(d) => d.to_text(),
        }
    }
}

impl Decimal {
    fn is_zero(&self) -> bool {
        self.digits.is_empty()
    }

    /// The digits scaled up to `scale` (which must not be below ours).
    fn digits_at(&self, scale: usize) -> Vec<u8> {
        if self.is_zero() {
            return Vec::new();
        }
        let mut d = vec![0; scale - self.scale];
        d.extend_from_slice(&self.digits);
        d
    }

    /// The value of binary numeric digits (`groups`, most significant first, the first of
    /// weight `weight`) at display scale `scale`; digits below the scale are dropped.
    fn from_groups(neg: bool, weight: i64, scale: usize, groups: &[u16]) -> Decimal {
        let mut digits = Vec::new();
        for (i, &group) in groups.iter().enumerate() {
            // Index (in `digits`) of the group's lowest decimal digit.
            let low = (weight - i as i64) * DEC_DIGITS + scale as i64;
            let mut g = group;
            for k in 0..DEC_DIGITS {
                let (d, idx) = ((g % 10) as u8, low + k);
                g /= 10;
                // Zeros are left to the resize, so no high-order zero is ever pushed.
                if d == 0 || idx < 0 {
                    continue;
                }
                let idx = idx as usize;
                if idx >= digits.len() {
                    digits.resize(idx + 1, 0);
                }
                digits[idx] = d;
            }
        }
        Decimal {
            neg: neg && !digits.is_empty(),
            digits,
            scale,
        }
    }

    /// The weight and the base-10000 digits (most significant first, none zero at either end)
    /// `make_result` would store; (0, []) for zero.
    fn groups(&self) -> (i64, Vec<u16>) {
        if self.is_zero() {
            return (0, Vec::new());
        }
        // Base-10000 digits are aligned on the decimal point: the lowest decimal digit (of
        // exponent -scale) sits `pad` places above the start of its group.
        let lowest = -(self.scale as i64);
        let low_weight = lowest.div_euclid(DEC_DIGITS);
        let pad = (lowest - low_weight * DEC_DIGITS) as usize;
        let mut groups: Vec<u16> = Vec::with_capacity((pad + self.digits.len()).div_ceil(4));
        let padded = std::iter::repeat_n(&0u8, pad).chain(&self.digits);
        for (i, &d) in padded.enumerate() {
            if i % DEC_DIGITS as usize == 0 {
                groups.push(0);
            }
            if let Some(g) = groups.last_mut() {
                *g += d as u16 * 10u16.pow((i % DEC_DIGITS as usize) as u32);
            }
        }
        let weight = low_weight + groups.len() as i64 - 1;
        // Least significant first here: drop the low-order zero groups, then flip.
        let first = groups.iter().position(|&g| g != 0).unwrap_or(groups.len());
        let mut groups = groups.split_off(first);
        groups.reverse();
        (weight, groups)
    }

    /// Numeric order of two finite values, independent of their display scales.
    fn cmp_value(&self, other: &Decimal) -> Ordering {
        let sign = |d: &Decimal| match (d.is_zero(), d.neg) {
            (true, _) => 0i8,
            (false, true) => -1,
            (false, false) => 1,
        };
        let (sa, sb) = (sign(self), sign(other));
        if sa != sb || sa == 0 {
            return sa.cmp(&sb);
        }
        // Decimal exponent of the leading digit, then the digits from the top down.
        let top = |d: &Decimal| d.digits.len() as i64 - d.scale as i64;
        let width = self.digits.len().max(other.digits.len());
        let from_top =
            |d: &Decimal, k: usize| d.digits.len().checked_sub(k + 1).map_or(0, |i| d.digits[i]);
        let mag = top(self).cmp(&top(other)).then_with(|| {
            (0..width)
                .map(|k| from_top(self, k).cmp(&from_top(other, k)))
                .find(|o| o.is_ne())
                .unwrap_or(Ordering::Equal)
        });
        if sa < 0 {
            mag.reverse()
        } else {
            mag
        }
    }

    fn add(&self, other: &Decimal) -> Decimal {
        let scale = self.scale.max(other.scale);
        let a = self.digits_at(scale);
        let b = other.digits_at(scale);
        let (neg, digits) = if self.neg == other.neg {
            (self.neg, add_mag(&a, &b))
        } else {
            match cmp_mag(&a, &b) {
                Ordering::Less => (other.neg, sub_mag(&b, &a)),
                _ => (self.neg, sub_mag(&a, &b)),
            }
        };
        Decimal {
            neg: neg && !digits.is_empty(),
            digits,
            scale,
        }
    }

    /// Postgres's weight (in base-10000 digits) and value of the first non-zero base-10000
    /// digit; (0, 0) for zero. `select_div_scale` estimates the quotient's size from these.
    fn weight_and_first_digit(&self) -> (i64, u32) {
        if self.is_zero() {
            return (0, 0);
        }
        // Decimal exponent of the most significant digit, then the base-10000 group holding it.
        let exp = self.digits.len() as i64 - 1 - self.scale as i64;
        let weight = exp.div_euclid(DEC_DIGITS);
        let mut first = 0u32;
        for place in (weight * DEC_DIGITS..weight * DEC_DIGITS + DEC_DIGITS).rev() {
            let idx = place + self.scale as i64;
            let d = if idx >= 0 {
                self.digits.get(idx as usize).copied().unwrap_or(0)
            } else {
                0
            };
            first = first * 10 + d as u32;
        }
        (weight, first)
    }

    fn div_count(&self, count: u64) -> Result<Decimal, MergeError> {
        let divisor = Numeric::from_i128(count as i128);
        let Numeric::Finite(divisor) = divisor else {
            return Err("division by a zero count".into());
        };
        let (w1, f1) = self.weight_and_first_digit();
        let (w2, f2) = divisor.weight_and_first_digit();
        // select_div_scale: estimate the quotient's weight, assuming the dividend's first digit
        // is smaller when the two first digits are equal.
        let mut qweight = w1 - w2;
        if f1 <= f2 {
            qweight -= 1;
        }
        // Postgres: at least MIN_SIG_DIGITS digits, not fewer decimals than the dividend's,
        // at most MAX_DISPLAY_SCALE (the dividend's scale is never negative).
        let rscale = (MIN_SIG_DIGITS - qweight * DEC_DIGITS).max(self.scale as i64);
        let rscale = rscale.min(MAX_DISPLAY_SCALE);
        if rscale < self.scale as i64 {
            return Err(
                "avg of numeric values with more than 1000 decimals cannot be merged".into(),
            );
        }
        let rscale = rscale as usize;
        // The exact quotient of the digits scaled to rscale, rounded half away from zero.
        let scaled = self.digits_at(rscale);
        let mut quotient = Vec::with_capacity(scaled.len());
        let mut rem: u128 = 0;
        for &d in scaled.iter().rev() {
            let cur = rem * 10 + d as u128;
            quotient.push((cur / count as u128) as u8);
            rem = cur % count as u128;
        }
        quotient.reverse();
        if rem * 2 >= count as u128 {
            quotient = add_mag(&quotient, &[1]);
        }
        while quotient.last() == Some(&0) {
            quotient.pop();
        }
        Ok(Decimal {
            neg: self.neg && !quotient.is_empty(),
            digits: quotient,
            scale: rscale,
        })
    }

    fn to_text(&self) -> String {
        let mut s = String::with_capacity(self.digits.len().max(self.scale + 1) + 2);
        if self.neg {
            s.push('-');
        }
        // Big-endian digits, padded so there is at least one digit before the point.
        let width = self.digits.len().max(self.scale + 1);
        for i in (0..width).rev() {
            let d = self.digits.get(i).copied().unwrap_or(0);
            s.push((b'0' + d) as char);
            if i == self.scale && i > 0 {
                s.push('.');
            }
        }
        s
    }
}

fn cmp_mag(a: &[u8], b: &[u8]) -> Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.iter().rev().cmp(b.iter().rev()))
}

fn add_mag(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len().max(b.len()) + 1);
    let mut carry = 0u8;
    for i in 0..a.len().max(b.len()) {
        let s = a.get(i).copied().unwrap_or(0) + b.get(i).copied().unwrap_or(0) + carry;
        out.push(s % 10);
        carry = s / 10;
    }
    if carry > 0 {
        out.push(carry);
    }
    out
}

/// `a - b` for `a >= b`, without high-order zeros.
fn sub_mag(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len());
    let mut borrow = 0i8;
    for (i, &da) in a.iter().enumerate() {
        let mut d = da as i8 - b.get(i).copied().unwrap_or(0) as i8 - borrow;
        borrow = 0;
        if d < 0 {
            d += 10;
            borrow = 1;
        }
        out.push(d as u8);
    }
    while out.last() == Some(&0) {
        out.pop();
    }
    out
}

/// A borrowed view of numeric text, for comparing without allocating.
struct Parts<'a> {
    neg: bool,
    /// Integer digits as written.
    int: &'a [u8],
    /// Fraction digits as written.
    frac: &'a [u8],
}

impl<'a> Parts<'a> {
    fn split(text: &'a [u8]) -> Result<Parts<'a>, MergeError> {
        const BAD: &str = "malformed numeric value from a shard";
        let (neg, rest) = match text.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, text),
        };
        let (int, frac) = match rest.iter().position(|&c| c == b'.') {
            Some(dot) => (&rest[..dot], &rest[dot + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        let digits_ok = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
        if int.is_empty() || !digits_ok(int) || !digits_ok(frac) {
            return Err(BAD.into());
        }
        Ok(Parts { neg, int, frac })
    }

    /// Significant digits: integer part without leading zeros, fraction without trailing zeros.
    fn trimmed(&self) -> (&'a [u8], &'a [u8]) {
        let i = self
            .int
            .iter()
            .position(|&c| c != b'0')
            .unwrap_or(self.int.len());
        let f = self
            .frac
            .iter()
            .rposition(|&c| c != b'0')
            .map_or(0, |p| p + 1);
        (&self.int[i..], &self.frac[..f])
    }
}

/// Compares two numeric text values as Postgres orders them: by value (so `1.0` equals `1.00`),
/// with `-Infinity` lowest and `NaN` above `Infinity`.
pub fn compare_text(a: &[u8], b: &[u8]) -> Result<Ordering, MergeError> {
    // Rank of the special values around the finite ones.
    fn rank(t: &[u8]) -> i8 {
        match t {
            b"-Infinity" => 0,
            b"Infinity" => 2,
            b"NaN" => 3,
            _ => 1,
        }
    }
    let (ra, rb) = (rank(a), rank(b));
    if ra != 1 || rb != 1 {
        return Ok(ra.cmp(&rb));
    }
    let (pa, pb) = (Parts::split(a)?, Parts::split(b)?);
    let (ia, fa) = pa.trimmed();
    let (ib, fb) = pb.trimmed();
    let zero_a = ia.is_empty() && fa.is_empty();
    let zero_b = ib.is_empty() && fb.is_empty();
    let sign = |neg: bool, zero: bool| {
        if zero {
            0
        } else if neg {
            -1
        } else {
            1
        }
    };
    let (sa, sb) = (sign(pa.neg, zero_a), sign(pb.neg, zero_b));
    if sa != sb || sa == 0 {
        return Ok(sa.cmp(&sb));
    }
    // Same sign, both non-zero: compare magnitudes, reversed for negatives.
    let mag = ia
        .len()
        .cmp(&ib.len())
        .then_with(|| ia.cmp(ib))
        .then_with(|| fa.cmp(fb));
    Ok(if sa < 0 { mag.reverse() } else { mag })
}

/// Compares two binary numeric values as Postgres orders them (see [`Numeric::cmp_value`]).
pub fn compare_binary(a: &[u8], b: &[u8]) -> Result<Ordering, MergeError> {
    Ok(Numeric::from_binary(a)?.cmp_value(&Numeric::from_binary(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Numeric {
        Numeric::parse(s.as_bytes()).unwrap()
    }

    fn avg(sum: &str, count: u64) -> String {
        n(sum).div_count(count).unwrap().to_text()
    }

    #[test]
    fn parse_and_print_keep_the_display_scale() {
        for s in [
            "0",
            "0.00",
            "-1.50",
            "123456789012345678901234567890.000001",
            "NaN",
        ] {
            assert_eq!(n(s).to_text(), s);
        }
        assert_eq!(n("-0.00").to_text(), "0.00");
        for bad in ["", "-", "1e5", "1.2.3", " 1", "+1", ".5", "Inf"] {
            assert!(Numeric::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn addition() {
        assert_eq!(n("1.50").add(&n("2.5")).to_text(), "4.00");
        assert_eq!(n("1.5").add(&n("-1.5")).to_text(), "0.0");
        assert_eq!(n("-10").add(&n("3.25")).to_text(), "-6.75");
        assert_eq!(n("9999.99").add(&n("0.01")).to_text(), "10000.00");
        assert_eq!(n("0.001").add(&n("-1")).to_text(), "-0.999");
        assert_eq!(n("Infinity").add(&n("1")), Numeric::PosInf);
        assert_eq!(n("Infinity").add(&n("-Infinity")), Numeric::NaN);
        assert_eq!(n("NaN").add(&n("-Infinity")), Numeric::NaN);
    }

    #[test]
    fn average_scale_matches_postgres() {
        // Values printed by Postgres 15 for SELECT avg(x).
        assert_eq!(avg("1", 3), "0.33333333333333333333");
        assert_eq!(avg("2", 3), "0.66666666666666666667");
        assert_eq!(avg("10", 7), "1.4285714285714286");
        assert_eq!(avg("6", 3), "2.0000000000000000");
        assert_eq!(avg("0", 2), "0.00000000000000000000");
        assert_eq!(avg("-5", 2), "-2.5000000000000000");
        assert_eq!(avg("1.5", 1), "1.50000000000000000000");
        assert_eq!(avg("100000", 1), "100000.000000000000");
        assert_eq!(avg("Infinity", 2), "Infinity");
        assert!(n("1").div_count(0).is_err());
    }

    /// Binary numeric from its header fields and digits.
    fn bin(ndigits: i16, weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&ndigits.to_be_bytes());
        v.extend_from_slice(&weight.to_be_bytes());
        v.extend_from_slice(&sign.to_be_bytes());
        v.extend_from_slice(&dscale.to_be_bytes());
        for d in digits {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v
    }

    fn binary_text(v: &[u8]) -> String {
        Numeric::from_binary(v).unwrap().to_text()
    }

    #[test]
    fn text_binary_text_round_trips() {
        let huge = format!("{}.5", "9".repeat(500));
        let tiny = format!("0.{}1", "0".repeat(900));
        let mut values = vec![
            "0",
            "0.00",
            "1",
            "-1",
            "10000",
            "9999",
            "0.0001",
            "0.00001",
            "1.500",
            "-1.500",
            "123456789.123456789",
            "-123456789.123456789",
            "100000000.000000010",
            "0.1000",
            "12345678901234567890",
            "NaN",
            "Infinity",
            "-Infinity",
            &huge,
            &tiny,
        ];
        // Digit strings at every alignment against the base-10000 groups, both signs.
        let mut many = Vec::new();
        for scale in 0..13 {
            for m in [1i128, -7, 10, 99, -1000, 10000, 123456789, -100010001, 5000] {
                let Numeric::Finite(d) = Numeric::from_i128(m) else {
                    unreachable!()
                };
                many.push(Numeric::Finite(Decimal { scale, ..d }).to_text());
            }
        }
        values.extend(many.iter().map(String::as_str));
        for text in values {
            let bytes = n(text).to_binary().unwrap();
            assert_eq!(binary_text(&bytes), text, "{bytes:02x?}");
            // What Postgres would store: no zero digit at either end.
            let nd = i16::from_be_bytes([bytes[0], bytes[1]]) as usize;
            let digits = &bytes[8..];
            if nd > 0 {
                assert_ne!(&digits[..2], &[0, 0], "{text}");
                assert_ne!(&digits[2 * nd - 2..], &[0, 0], "{text}");
            }
        }
        assert_eq!(binary_text(&n("-0.00").to_binary().unwrap()), "0.00");
    }

    #[test]
    fn binary_bytes_are_numeric_send() {
        // Derived from the format rules; each also checked against `SELECT numeric_send(...)`
        // on Postgres 15.
        let b = |s: &str| n(s).to_binary().unwrap();
        // Zero: no digits, weight 0, positive even when written negative, dscale kept.
        assert_eq!(b("0"), bin(0, 0, 0, 0, &[]));
        assert_eq!(b("-0.00"), bin(0, 0, 0, 2, &[]));
        assert_eq!(b("1"), bin(1, 0, 0, 0, &[1]));
        // 10000 = 1 * 10000^1: the trailing zero digit is not stored.
        assert_eq!(b("10000"), bin(1, 1, 0, 0, &[1]));
        // 0.0001 = 1 * 10000^-1.
        assert_eq!(b("0.0001"), bin(1, -1, 0, 4, &[1]));
        // 0.00001 = 1000 * 10000^-2 (digits align on the decimal point).
        assert_eq!(b("0.00001"), bin(1, -2, 0, 5, &[1000]));
        // 1.500: the display scale says 3 decimals, the digits hold 1.5000.
        assert_eq!(b("1.500"), bin(2, 0, 0, 3, &[1, 5000]));
        assert_eq!(
            b("-123456789.123456789"),
            bin(6, 2, 0x4000, 9, &[1, 2345, 6789, 1234, 5678, 9000])
        );
        assert_eq!(b("99999999"), bin(2, 1, 0, 0, &[9999, 9999]));
        assert_eq!(b("100000000000000000000"), bin(1, 5, 0, 0, &[1]));
        assert_eq!(b("NaN"), bin(0, 0, 0xC000, 0, &[]));
        assert_eq!(b("Infinity"), bin(0, 0, 0xD000, 32, &[]));
        assert_eq!(b("-Infinity"), bin(0, 0, 0xF000, 32, &[]));
        // Too many decimals for the dscale field, as Postgres would refuse to store.
        let many = format!("0.{}", "0".repeat(0x4000));
        assert!(n(&many).to_binary().is_err());
    }

    #[test]
    fn binary_decoding_honours_dscale_and_rejects_garbage() {
        assert_eq!(binary_text(&bin(2, 0, 0, 0, &[1, 5000])), "1");
        assert_eq!(binary_text(&bin(2, 0, 0, 2, &[1, 5000])), "1.50");
        assert_eq!(binary_text(&bin(2, 0, 0, 6, &[1, 5000])), "1.500000");
        assert_eq!(binary_text(&bin(1, 2, 0, 1, &[7])), "700000000.0");
        // Leading and trailing zero digits (which Postgres never sends) mean the same value.
        assert_eq!(binary_text(&bin(3, 1, 0x4000, 4, &[0, 3, 0])), "-3.0000");
        assert_eq!(binary_text(&bin(1, -3, 0x4000, 2, &[5])), "0.00");
        // Infinities with another dscale still decode.
        assert_eq!(binary_text(&bin(0, 0, 0xD000, 0, &[])), "Infinity");
        for bad in [
            vec![],
            vec![0, 1, 0, 0, 0, 0, 0],
            bin(1, 0, 0, 0, &[]),
            bin(1, 0, 0, 0, &[1, 2]),
            bin(-1, 0, 0, 0, &[]),
            bin(1, 0, 0, 0, &[10000]),
            bin(1, 0, 0x8000, 0, &[1]),
            bin(0, 0, 0x4001, 0, &[]),
            bin(0, 0, 0, 0x4000, &[]),
        ] {
            assert!(Numeric::from_binary(&bad).is_err(), "{bad:02x?}");
        }
        let c = |a: &str, b: &str| {
            let (a, b) = (n(a).to_binary().unwrap(), n(b).to_binary().unwrap());
            compare_binary(&a, &b).unwrap()
        };
        assert_eq!(c("1.0", "1.00"), Ordering::Equal);
        assert_eq!(c("0", "-0.000"), Ordering::Equal);
        assert_eq!(c("-2", "-10"), Ordering::Greater);
        assert_eq!(c("0.5", "0.45"), Ordering::Greater);
        assert_eq!(c("10000", "9999.9999"), Ordering::Greater);
        assert_eq!(c("-0.001", "0"), Ordering::Less);
        assert_eq!(c("NaN", "Infinity"), Ordering::Greater);
        assert_eq!(c("NaN", "NaN"), Ordering::Equal);
        assert_eq!(c("-Infinity", "-1"), Ordering::Less);
        assert!(compare_binary(&[0], &bin(0, 0, 0, 0, &[])).is_err());
    }

    #[test]
    fn value_order_agrees_with_text_order() {
        let values = [
            "-Infinity",
            "-100",
            "-99.99",
            "-1.5",
            "-1.50",
            "-0.0001",
            "0",
            "-0.0",
            "0.00001",
            "0.0001",
            "1",
            "1.0",
            "1.0001",
            "9999",
            "10000",
            "10000.5",
            "Infinity",
            "NaN",
        ];
        for a in values {
            for b in values {
                let text = compare_text(a.as_bytes(), b.as_bytes()).unwrap();
                assert_eq!(n(a).cmp_value(&n(b)), text, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn comparison() {
        let c = |a: &str, b: &str| compare_text(a.as_bytes(), b.as_bytes()).unwrap();
        assert_eq!(c("1.0", "1.00"), Ordering::Equal);
        assert_eq!(c("0", "-0.000"), Ordering::Equal);
        assert_eq!(c("-2", "-10"), Ordering::Greater);
        assert_eq!(c("0.5", "0.45"), Ordering::Greater);
        assert_eq!(c("10", "9.99"), Ordering::Greater);
        assert_eq!(c("-0.001", "0"), Ordering::Less);
        assert_eq!(c("NaN", "Infinity"), Ordering::Greater);
        assert_eq!(c("NaN", "NaN"), Ordering::Equal);
        assert_eq!(c("-Infinity", "-1"), Ordering::Less);
        assert!(compare_text(b"abc", b"1").is_err());
    }
}
