//! `DateStyle` is the one setting whose value merges with the one before it: `SET DateStyle =
//! dmy` keeps the output style (`Postgres, MDY` becomes `Postgres, DMY`), so replaying the bare
//! `dmy` on a reset connection would lose it.

const STYLES: &[&str] = &["iso", "sql", "postgres", "german"];
const ORDERS: &[(&str, &str)] = &[
    ("dmy", "DMY"),
    ("euro", "DMY"),
    ("european", "DMY"),
    ("mdy", "MDY"),
    ("us", "MDY"),
    ("noneuro", "MDY"),
    ("noneuropean", "MDY"),
    ("ymd", "YMD"),
];

/// The style and the order a value names (`None` for a word it does not know).
fn parts(value: &str) -> Option<(Option<String>, Option<&'static str>)> {
    let unquoted = value.trim().trim_matches('\'');
    let (mut style, mut order) = (None, None);
    for word in unquoted.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let lower = word.to_ascii_lowercase();
        if STYLES.contains(&lower.as_str()) {
            style = Some(word.to_string());
        } else if let Some((_, o)) = ORDERS.iter().find(|(w, _)| *w == lower) {
            order = Some(*o);
        } else {
            return None;
        }
    }
    Some((style, order))
}

/// `new` set over `old`: what is left out keeps its old part. A value it cannot read is
/// kept as written (Postgres will say what is wrong with it).
pub(super) fn merge(old: &str, new: &str) -> String {
    let (Some((old_style, old_order)), Some((style, order))) = (parts(old), parts(new)) else {
        return new.to_string();
    };
    // `German` alone also means DMY, as in Postgres's check_datestyle.
    let german = style
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("german"));
    let order = order.or(german.then_some("DMY"));
    let parts: Vec<String> = [style.or(old_style), order.or(old_order).map(str::to_string)]
        .into_iter()
        .flatten()
        .collect();
    format!("'{}'", parts.join(", "))
}
