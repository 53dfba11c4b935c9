//! Statement text: the normalizer ([`shardgate::planner::normalize`]), the array literal reader
//! ([`shardgate::planner::keys::array_elements_text`]) and the VALUES cutter
//! ([`shardgate::planner::values`]), over SQL built from real token shapes, mutated, and
//! arbitrary.

use rand::rngs::StdRng;
use rand::Rng;

use super::{bytes, mutate, run, text};
use shardgate::planner::keys::array_elements_text;
use shardgate::planner::values::values_rows;
use shardgate::planner::{normalize, LiteralKind, NormalizeBuf};

/// One SQL token of a shape the normalizer knows.
fn token(rng: &mut StdRng) -> String {
    let digits = |rng: &mut StdRng| rng.random_range(0..100_000u32).to_string();
    match rng.random_range(0..24) {
        0 => [
            "SELECT", "FROM", "WHERE", "AND", "IN", "VALUES", "INSERT", "INTO", "kv", "id",
        ][rng.random_range(0..10)]
        .to_string(),
        1 => digits(rng),
        2 => format!("-{}", digits(rng)),
        3 => format!("{}.{}", digits(rng), digits(rng)),
        4 => format!(".{}e{}", digits(rng), rng.random_range(-5..5)),
        5 => format!("'{}'", text(rng, 6).replace('\'', "''")),
        6 => format!("E'{}'", text(rng, 6).replace('\'', "\\'")),
        7 => r"E'\x41\101\u00e9\n'".to_string(),
        8 => {
            let tag = ["", "a", "fn", "é"][rng.random_range(0..4)];
            format!("${tag}${}${tag}$", text(rng, 6).replace('$', ""))
        }
        9 => format!("${}", rng.random_range(1..20)),
        10 => "/* c /* nested */ */".to_string(),
        11 => "-- line\n".to_string(),
        12 => ["=", "<>", "-", "+", "*", "@-", "||", "::", "..", "~"][rng.random_range(0..10)]
            .to_string(),
        13 => ["(", ")", ",", ";", "[", "]", "."][rng.random_range(0..7)].to_string(),
        14 => format!("\"{}\"", text(rng, 5).replace('"', "\"\"")),
        // Typed literals written without a space, and prefixes that are not strings.
        15 => format!(
            "{}'{}'",
            ["date", "int8", "timestamp", "x", "B", "N", "U&", "some"][rng.random_range(0..8)],
            digits(rng)
        ),
        16 => format!("{}abc", digits(rng)),
        17 => "0x1F".to_string(),
        18 => text(rng, 4),
        19 => "'unterminated".to_string(),
        20 => "$q$ unterminated".to_string(),
        21 => "E'\\".to_string(),
        22 => "/* unterminated".to_string(),
        _ => ["é", "ß", "x$1", "t.and", "1e", "1..5"][rng.random_range(0..6)].to_string(),
    }
}

/// A statement of up to `n` tokens, with or without separating whitespace.
pub(crate) fn sql(rng: &mut StdRng, n: usize) -> String {
    let mut out = String::new();
    for _ in 0..rng.random_range(0..=n) {
        out.push_str(&token(rng));
        match rng.random_range(0..4) {
            0 => {}
            1 => out.push('\n'),
            _ => out.push(' '),
        }
    }
    out
}

/// Lossy text of arbitrary or mutated bytes (the router only normalizes UTF-8).
fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The normalizer's invariants on one text.
fn check_normalize(sql: &str) {
    let mut buf = NormalizeBuf::new();
    let before = normalize(sql, &mut buf);
    let count = buf.literal_count();
    let mut last = 0;
    for i in 0..count {
        let src = buf.literal_source(i).expect("source");
        assert!(last <= src.start && src.start < src.end && src.end <= sql.len());
        assert!(sql.is_char_boundary(src.start) && sql.is_char_boundary(src.end));
        last = src.end;
        let value = buf.literal(i).expect("every literal's value is text");
        if buf.literal_kind(i) == Some(LiteralKind::Number) {
            assert_eq!(value, &sql[src], "a number's value is its text");
        }
    }
    assert_eq!(buf.literal(count), None);
    let normalized = buf.normalized().to_string();
    // Normalizing again finds nothing more to take out, and each placeholder is read back as
    // the parameter it stands for.
    let mut again = NormalizeBuf::new();
    let before_again = normalize(&normalized, &mut again);
    assert_eq!(again.literal_count(), 0, "{sql:?} -> {normalized:?}");
    assert_eq!(again.normalized(), normalized, "{sql:?}");
    let want = if count > 0 { before + count } else { before };
    assert_eq!(
        before_again, want,
        "placeholders of {sql:?} read back wrongly from {normalized:?}"
    );
}

#[test]
fn normalizer_invariants_hold() {
    run("text/normalize", |rng| {
        let s = sql(rng, 12);
        check_normalize(&s);
        let mut b = s.into_bytes();
        mutate(rng, &mut b);
        check_normalize(&lossy(&b));
        check_normalize(&lossy(&bytes(rng, 40)));
    });
}

/// Postgres's text form of a one-dimensional array of `elements`.
fn array_text(rng: &mut StdRng, elements: &[Option<String>]) -> String {
    let items: Vec<String> = elements
        .iter()
        .map(|e| match e {
            None => "NULL".to_string(),
            Some(v) => {
                let plain = !v.is_empty()
                    && !v.eq_ignore_ascii_case("null")
                    && v.chars().all(|c| c.is_ascii_alphanumeric());
                if plain && rng.random_bool(0.5) {
                    v.clone()
                } else {
                    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
                }
            }
        })
        .collect();
    let prefix = if rng.random_bool(0.2) {
        format!("[1:{}]=", elements.len())
    } else {
        String::new()
    };
    format!("{prefix}{{{}}}", items.join(","))
}

#[test]
fn array_literals_round_trip_and_never_panic() {
    run("text/array", |rng| {
        let elements: Vec<Option<String>> = (0..rng.random_range(1..6))
            .map(|_| rng.random_bool(0.85).then(|| text(rng, 6)))
            .collect();
        let t = array_text(rng, &elements);
        assert_eq!(array_elements_text(&t), Ok(elements), "{t:?}");
        let mut b = t.into_bytes();
        mutate(rng, &mut b);
        let _ = array_elements_text(&lossy(&b));
        let _ = array_elements_text(&lossy(&bytes(rng, 30)));
    });
}

/// The VALUES cutter's answer, checked to be usable on `sql`.
fn check_values(sql: &str) -> Option<Vec<String>> {
    let v = values_rows(sql)?;
    for r in std::iter::once(&v.head).chain(&v.rows).chain([&v.tail]) {
        assert!(r.start <= r.end && r.end <= sql.len(), "{r:?} in {sql:?}");
        assert!(sql.is_char_boundary(r.start) && sql.is_char_boundary(r.end));
    }
    let _ = v.statement(sql, 0..v.rows.len());
    Some(v.rows.iter().map(|r| sql[r.clone()].to_string()).collect())
}

#[test]
fn values_rows_are_cut_as_written_and_never_panic() {
    run("text/values", |rng| {
        let rows: Vec<String> = (0..rng.random_range(1..5))
            .map(|_| {
                let id = rng.random_range(-1000..1000i64);
                let v = text(rng, 6).replace('\'', "''");
                format!("({id}, '{v}')")
            })
            .collect();
        let sep = [", ", ",", " ,\n ", ",\t"][rng.random_range(0..4)];
        let tail =
            ["", " RETURNING id", " ON CONFLICT (id) DO NOTHING", ";"][rng.random_range(0..4)];
        let insert = format!("INSERT INTO kv (id, v) VALUES {}{tail}", rows.join(sep));
        assert_eq!(check_values(&insert), Some(rows), "{insert:?}");
        let mut b = insert.into_bytes();
        mutate(rng, &mut b);
        let _ = check_values(&lossy(&b));
        let _ = check_values(&format!("INSERT INTO kv VALUES {}", sql(rng, 8)));
    });
}
