//! The value readers of merges across shards ([`shardgate::merge`]): numeric, float and date text
//! as Postgres prints them, and numeric's binary form. Shards, not clients, write these, but a
//! value a client stored comes back through them, so they get the same treatment.

use rand::rngs::StdRng;
use rand::Rng;

use super::{bytes, mutate, run};
use shardgate::merge::datetime::{sort_key, DateKind};
use shardgate::merge::float::parse_f64;
use shardgate::merge::numeric::{compare_text, Numeric};

/// A numeric as `numeric_out` prints it.
fn numeric_text(rng: &mut StdRng) -> String {
    let digits = |rng: &mut StdRng, n: usize| -> String {
        (0..n)
            .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
            .collect()
    };
    let sign = if rng.random_bool(0.3) { "-" } else { "" };
    let int = rng.random_range(1..30);
    let mut int_part = digits(rng, int);
    if int_part.len() > 1 {
        // numeric_out writes no leading zeros.
        int_part = int_part.trim_start_matches('0').to_string();
        if int_part.is_empty() {
            int_part.push('0');
        }
    }
    match rng.random_range(0..3) {
        0 => format!("{sign}{int_part}"),
        _ => {
            let frac = rng.random_range(1..20);
            format!("{sign}{int_part}.{}", digits(rng, frac))
        }
    }
}

#[test]
fn merge_values_round_trip_and_never_panic() {
    run("merge/values", |rng| {
        let t = numeric_text(rng);
        let n = Numeric::parse(t.as_bytes()).unwrap_or_else(|e| panic!("{t}: {e:?}"));
        let back = Numeric::parse(n.to_text().as_bytes()).expect("its own text");
        assert_eq!(n.cmp_value(&back), std::cmp::Ordering::Equal, "{t}");
        if let Ok(bin) = n.to_binary() {
            let from = Numeric::from_binary(&bin).expect("its own binary form");
            assert_eq!(n.cmp_value(&from), std::cmp::Ordering::Equal, "{t}");
        }
        let u = numeric_text(rng);
        let _ = compare_text(t.as_bytes(), u.as_bytes()).expect("two numerics compare");

        let mut b = t.into_bytes();
        mutate(rng, &mut b);
        let junk = bytes(rng, 24);
        for input in [&b, &junk] {
            let _ = Numeric::parse(input);
            let _ = Numeric::from_binary(input);
            let _ = compare_text(input, u.as_bytes());
            let _ = parse_f64(input);
            for kind in [DateKind::Date, DateKind::Timestamp, DateKind::TimestampTz] {
                let _ = sort_key(kind, input);
            }
        }
        let mut date = b"2024-02-29 23:59:59.123456+05:30".to_vec();
        mutate(rng, &mut date);
        let _ = sort_key(DateKind::TimestampTz, &date);
    });
}
