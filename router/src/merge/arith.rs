//! `a + b`, `a - b` and `a * b` of two merged aggregates (`max(qty) - min(qty)`,
//! `sum(a) * count(*)`), as Postgres's operators compute them: the result type from the
//! operand types (`int2`/`int4`/`int8` of the wider, `numeric` if either is), integer overflow
//! an error as `int4pl` &co. raise it, `numeric` exact (the product's scale the sum of the
//! operands' scales, as `numeric_mul`).

use num_bigint::BigUint;

use super::numeric::Numeric;
use super::value::Kind;
use super::MergeError;

/// The operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
}

/// A merged operand: an integer of one of Postgres's integer types, or a numeric.
#[derive(Clone, Debug)]
pub enum Operand {
    Int(i128, Kind),
    Numeric(Numeric),
}

/// The type of `a op b` for operands of these types (Postgres's operator resolution for the
/// integer and numeric operators); `None` for other types.
pub fn result_kind(a: Kind, b: Kind) -> Option<Kind> {
    let rank = |k: Kind| match k {
        Kind::Int2 => Some(0),
        Kind::Int4 => Some(1),
        Kind::Int8 => Some(2),
        Kind::Numeric => Some(3),
        _ => None,
    };
    Some(match rank(a)?.max(rank(b)?) {
        0 => Kind::Int2,
        1 => Kind::Int4,
        2 => Kind::Int8,
        _ => Kind::Numeric,
    })
}

/// `a op b`, of type `kind` (from [`result_kind`]).
pub fn apply(op: ArithOp, a: Operand, b: Operand, kind: Kind) -> Result<Operand, MergeError> {
    if kind != Kind::Numeric {
        let (Operand::Int(x, _), Operand::Int(y, _)) = (&a, &b) else {
            return Err("internal: an integer operation of a numeric".into());
        };
        let v = match op {
            ArithOp::Add => x + y,
            ArithOp::Sub => x - y,
            ArithOp::Mul => x.checked_mul(*y).ok_or("bigint out of range")?,
        };
        let (lo, hi, message) = match kind {
            Kind::Int2 => (i16::MIN as i128, i16::MAX as i128, "smallint out of range"),
            Kind::Int4 => (i32::MIN as i128, i32::MAX as i128, "integer out of range"),
            _ => (i64::MIN as i128, i64::MAX as i128, "bigint out of range"),
        };
        if v < lo || v > hi {
            return Err(message.into());
        }
        return Ok(Operand::Int(v, kind));
    }
    let (x, y) = (numeric(a), numeric(b));
    Ok(Operand::Numeric(match op {
        ArithOp::Add => x.add(&y),
        ArithOp::Sub => x.add(&negate(&y)),
        ArithOp::Mul => multiply(&x, &y)?,
    }))
}

fn numeric(o: Operand) -> Numeric {
    match o {
        Operand::Int(v, _) => Numeric::from_i128(v),
        Operand::Numeric(n) => n,
    }
}

fn negate(n: &Numeric) -> Numeric {
    match n {
        Numeric::PosInf => Numeric::NegInf,
        Numeric::NegInf => Numeric::PosInf,
        Numeric::NaN => Numeric::NaN,
        finite => match finite.to_big() {
            Some((neg, m, s)) => Numeric::from_big(!neg, &m, s),
            None => Numeric::NaN,
        },
    }
}

/// `numeric_mul`: exact, at the sum of the scales. Infinities and NaN are refused rather than
/// reproduced.
fn multiply(a: &Numeric, b: &Numeric) -> Result<Numeric, MergeError> {
    let (Some((an, am, as_)), Some((bn, bm, bs))) = (a.to_big(), b.to_big()) else {
        return Err("a product of NaN or infinity across shards is not supported".into());
    };
    let product: BigUint = am * bm;
    Ok(Numeric::from_big(an != bn, &product, as_ + bs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Operand {
        Operand::Numeric(Numeric::parse(s.as_bytes()).unwrap())
    }

    fn text(o: Operand) -> String {
        match o {
            Operand::Int(v, _) => v.to_string(),
            Operand::Numeric(n) => n.to_text(),
        }
    }

    #[test]
    fn as_postgres_operators() {
        let i4 = |v| Operand::Int(v, Kind::Int4);
        assert_eq!(result_kind(Kind::Int4, Kind::Int4), Some(Kind::Int4));
        assert_eq!(result_kind(Kind::Int2, Kind::Int8), Some(Kind::Int8));
        assert_eq!(result_kind(Kind::Int8, Kind::Numeric), Some(Kind::Numeric));
        assert_eq!(result_kind(Kind::Float8, Kind::Int4), None);
        assert_eq!(
            text(apply(ArithOp::Sub, i4(9), i4(3), Kind::Int4).unwrap()),
            "6"
        );
        assert!(apply(ArithOp::Add, i4(i32::MAX as i128), i4(1), Kind::Int4)
            .unwrap_err()
            .message()
            .contains("integer out of range"));
        // SELECT 12.50 - 2.125, 1.5 * 2.25, 3 - 10.0  -> 10.375, 3.375, -7.0
        let k = Kind::Numeric;
        assert_eq!(
            text(apply(ArithOp::Sub, n("12.50"), n("2.125"), k).unwrap()),
            "10.375"
        );
        assert_eq!(
            text(apply(ArithOp::Mul, n("1.5"), n("2.25"), k).unwrap()),
            "3.375"
        );
        assert_eq!(
            text(apply(ArithOp::Sub, i4(3), n("10.0"), k).unwrap()),
            "-7.0"
        );
        assert_eq!(
            text(apply(ArithOp::Mul, n("-0.50"), n("2"), k).unwrap()),
            "-1.00"
        );
        assert_eq!(
            text(apply(ArithOp::Sub, n("Infinity"), n("1"), k).unwrap()),
            "Infinity"
        );
    }
}
