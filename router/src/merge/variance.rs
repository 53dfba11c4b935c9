//! `var_pop`, `var_samp` (`variance`), `stddev_pop` and `stddev_samp` (`stddev`) of integer and
//! `numeric` values across shards. Each shard sends `count(x)`, `sum(x)` and
//! `sum(x::numeric * x::numeric)`; the router adds them up and finishes as Postgres's
//! `numeric_stddev_internal` does, digit for digit: the numerator `N * sumX2 - sumX * sumX` at
//! twice the scale of `sumX`, the quotient at `select_div_scale`'s scale rounded half away from
//! zero, the square root of that quotient at the same scale, rounded the same way (Postgres's
//! `sqrt_var` computes the exact integer square root one decimal past the scale, then rounds).
//! Floating-point inputs are refused by the caller: Postgres accumulates those in float8, in an
//! order the shards cannot reproduce.

use num_bigint::{BigInt, BigUint, Sign};

use super::numeric::Numeric;
use super::MergeError;

/// Which statistic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispersion {
    VarPop,
    VarSamp,
    StddevPop,
    StddevSamp,
}

impl Dispersion {
    /// The statistic a function name (lower case, unqualified) computes.
    pub fn of_function(name: &str) -> Option<Dispersion> {
        Some(match name {
            "var_pop" => Dispersion::VarPop,
            "var_samp" | "variance" => Dispersion::VarSamp,
            "stddev_pop" => Dispersion::StddevPop,
            "stddev_samp" | "stddev" => Dispersion::StddevSamp,
            _ => return None,
        })
    }

    fn sample(self) -> bool {
        matches!(self, Dispersion::VarSamp | Dispersion::StddevSamp)
    }

    fn root(self) -> bool {
        matches!(self, Dispersion::StddevPop | Dispersion::StddevSamp)
    }
}

/// The statistic of `n` values whose sum is `sum` and whose sum of squares is `squares`
/// (`None` when Postgres gives NULL: no values, or one for a sample statistic).
pub fn finish(
    kind: Dispersion,
    n: i128,
    sum: Option<&Numeric>,
    squares: Option<&Numeric>,
) -> Result<Option<Numeric>, MergeError> {
    if n == 0 || (kind.sample() && n <= 1) {
        return Ok(None);
    }
    let (Some(sum), Some(squares)) = (sum, squares) else {
        return Err("a shard sent a NULL sum with a non-zero count".into());
    };
    // Any NaN or infinity among the values gives NaN, as in Postgres.
    // The sum's sign does not matter: only its square is used.
    let (Some((_, sum_mag, scale)), Some((_, sq_mag, sq_scale))) = (sum.to_big(), squares.to_big())
    else {
        return Ok(Some(Numeric::NaN));
    };
    let n_big = BigUint::from(u128::try_from(n).map_err(|_| "a negative count")?);
    // N * sumX2 and sumX * sumX, both at rscale = 2 * dscale(sumX) (mul_var rounds to it).
    let rscale = scale * 2;
    let n_times_squares = rescale(&(&n_big * &sq_mag), sq_scale, rscale);
    let sum_squared = &sum_mag * &sum_mag;
    let numerator = BigInt::from_biguint(Sign::Plus, n_times_squares)
        - BigInt::from_biguint(Sign::Plus, sum_squared);
    if numerator.sign() != Sign::Plus {
        // Postgres guards against a negative numerator from rounding: the result is 0.
        return Ok(Some(Numeric::from_big(false, &BigUint::default(), 0)));
    }
    let denominator = if kind.sample() { n * (n - 1) } else { n * n };
    let denominator =
        u64::try_from(denominator).map_err(|_| "too many values for variance across shards")?;
    let (_, numerator) = numerator.into_parts();
    let variance = Numeric::from_big(false, &numerator, rscale).div_count(denominator)?;
    if !kind.root() {
        return Ok(Some(variance));
    }
    let Some((_, v, v_scale)) = variance.to_big() else {
        return Ok(Some(variance));
    };
    Ok(Some(Numeric::from_big(
        false,
        &sqrt_rounded(&v, v_scale),
        v_scale,
    )))
}

/// `magnitude * 10^-from` as a magnitude at scale `to`, rounded half away from zero.
fn rescale(magnitude: &BigUint, from: usize, to: usize) -> BigUint {
    if from <= to {
        return magnitude * pow10(to - from);
    }
    let divisor = pow10(from - to);
    (magnitude + &divisor / 2u32) / divisor
}

fn pow10(n: usize) -> BigUint {
    BigUint::from(10u32).pow(u32::try_from(n).unwrap_or(u32::MAX))
}

/// The magnitude at `scale` of the square root of `v * 10^-scale`, rounded half away from
/// zero: the exact integer root one decimal further, then rounded.
fn sqrt_rounded(v: &BigUint, scale: usize) -> BigUint {
    // sqrt(v * 10^-s) * 10^(s+1) = sqrt(v * 10^(s+2)).
    let root = (v * pow10(scale + 2)).sqrt();
    (root + 5u32) / 10u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(kind: Dispersion, values: &[&str]) -> Option<String> {
        let mut sum = Numeric::zero();
        let mut squares = Numeric::zero();
        for v in values {
            let x = Numeric::parse(v.as_bytes()).unwrap();
            sum = sum.add(&x);
            let (_, m, s) = x.to_big().unwrap();
            squares = squares.add(&Numeric::from_big(false, &(&m * &m), s * 2));
        }
        finish(kind, values.len() as i128, Some(&sum), Some(&squares))
            .unwrap()
            .map(|n| n.to_text())
    }

    #[test]
    fn as_postgres_15_prints_them() {
        use Dispersion::*;
        // What Postgres 15 answers for the same values (checked with postgres --single).
        let ints = ["1", "2", "3", "4"];
        assert_eq!(
            stat(StddevPop, &ints).as_deref(),
            Some("1.1180339887498948")
        );
        assert_eq!(
            stat(StddevSamp, &ints).as_deref(),
            Some("1.2909944487358056")
        );
        assert_eq!(stat(VarPop, &ints).as_deref(), Some("1.2500000000000000"));
        assert_eq!(stat(VarSamp, &ints).as_deref(), Some("1.6666666666666667"));
        // Equal values: a zero numerator prints as 0.
        assert_eq!(stat(StddevPop, &["7", "7"]).as_deref(), Some("0"));
        assert_eq!(stat(VarSamp, &["7"]), None);
        assert_eq!(stat(VarPop, &["7"]).as_deref(), Some("0"));
        assert_eq!(stat(StddevPop, &[]), None);
        let money = ["1.25", "2.50", "1234.99", "-17.01"];
        assert_eq!(stat(StddevPop, &money).as_deref(), Some("536.735829918918"));
        assert_eq!(
            stat(VarSamp, &money).as_deref(),
            Some("384113.801491666667")
        );
        assert_eq!(
            stat(StddevSamp, &money).as_deref(),
            Some("619.769151774809")
        );
        let big = ["123456789012", "5", "-99999999999"];
        assert_eq!(stat(StddevPop, &big).as_deref(), Some("91393237841"));
        assert_eq!(
            stat(VarSamp, &big).as_deref(),
            Some("12529085884637581067364")
        );
    }
}
