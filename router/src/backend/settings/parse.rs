//! Reading the settings changes of `SET`, `RESET` and startup `options` text, sans-IO: which
//! setting a statement changes and to what, as [`Change`]s for [`super::Settings::apply`].

use super::Change;

/// The `-c name=value` and `--name=value` switches of the `options` startup parameter
/// (backslash escapes a space, as libpq documents).
pub fn parse_options(options: &str) -> Vec<(String, String)> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    let mut out = Vec::new();
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        let pair = if w == "-c" {
            it.next()
        } else {
            w.strip_prefix("--")
                .or_else(|| w.strip_prefix("-c"))
                .map(str::to_string)
        };
        if let Some((n, v)) = pair.as_deref().and_then(|p| p.split_once('=')) {
            out.push((n.replace('-', "_").to_ascii_lowercase(), v.to_string()));
        }
    }
    out
}

/// What a single `SET`/`RESET`/`DISCARD` statement does. Anything it does not recognise is
/// `Unknown`, which is always safe (the connection is reset before reuse).
/// The changes of a text of several statements that are all `SET`s or `RESET`s the router
/// follows (`SET a = 1; SET b = 2`, as some drivers send at connect), in order; `None` for
/// anything else (one statement, another kind among them, a quoting this splitter does not
/// read: dollar quotes, comments).
pub(super) fn several_changes(sql: &str) -> Option<Vec<Change>> {
    if sql.contains(['$', '\\']) || sql.contains("--") || sql.contains("/*") {
        return None;
    }
    let mut statements = Vec::new();
    let (mut start, mut quote) = (0, None);
    for (i, c) in sql.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => {
                statements.push(&sql[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    statements.push(&sql[start..]);
    let statements: Vec<&str> = statements
        .into_iter()
        .filter(|s| !s.trim().is_empty())
        .collect();
    if statements.len() < 2 || quote.is_some() {
        return None;
    }
    statements
        .into_iter()
        .map(|s| match parse_statement(s.trim()) {
            c @ (Change::Set { .. }
            | Change::Reset { .. }
            | Change::ResetAll
            | Change::DiscardAll) => Some(c),
            _ => None,
        })
        .collect()
}

pub fn parse_change(sql: &str) -> Change {
    let Some(sql) = without_comments(sql) else {
        return Change::Unknown;
    };
    let text = sql.trim().trim_end_matches(';').trim();
    if text.contains(';') {
        return Change::Unknown;
    }
    parse_statement(text)
}

/// `sql` with each comment outside quotes replaced by a space, so that a comment is never
/// taken into a setting's value (`SET search_path = app -- why`), where it would hide what is
/// replayed after it. `None` when that cannot be done surely (a comment not closed, or
/// backslashes, which `E''` strings read as escapes).
fn without_comments(sql: &str) -> Option<std::borrow::Cow<'_, str>> {
    if !sql.contains("--") && !sql.contains("/*") {
        return Some(std::borrow::Cow::Borrowed(sql));
    }
    if sql.contains('\\') {
        return None;
    }
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let mut quote = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '-') if chars.peek() == Some(&'-') => {
                while chars.next_if(|&c| c != '\n').is_some() {}
                out.push(' ');
                continue;
            }
            (None, '/') if chars.peek() == Some(&'*') => {
                chars.next();
                // Block comments nest in Postgres.
                let mut depth = 1;
                while depth > 0 {
                    match (chars.next()?, chars.peek()) {
                        ('/', Some('*')) => {
                            chars.next();
                            depth += 1;
                        }
                        ('*', Some('/')) => {
                            chars.next();
                            depth -= 1;
                        }
                        _ => {}
                    }
                }
                out.push(' ');
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    Some(std::borrow::Cow::Owned(out))
}

/// The change of one statement (`text`, trimmed, without its `;`).
fn parse_statement(text: &str) -> Change {
    let mut words = text.split_whitespace();
    let first = words.next().map(str::to_ascii_lowercase);
    match first.as_deref() {
        Some("reset") => match words.next() {
            Some(w) if w.eq_ignore_ascii_case("all") && words.next().is_none() => Change::ResetAll,
            Some(w) if w.eq_ignore_ascii_case("time") => match (words.next(), words.next()) {
                (Some(z), None) if z.eq_ignore_ascii_case("zone") => Change::Reset {
                    name: "timezone".into(),
                },
                _ => Change::Unknown,
            },
            Some(w) if w.eq_ignore_ascii_case("session") => match (words.next(), words.next()) {
                (Some(a), None) if a.eq_ignore_ascii_case("authorization") => Change::Reset {
                    name: "session_authorization".into(),
                },
                _ => Change::Unknown,
            },
            Some(w) if words.next().is_none() => Change::Reset {
                name: unquote_name(w),
            },
            _ => Change::Unknown,
        },
        Some("discard") => match (words.next(), words.next()) {
            (Some(w), None) if w.eq_ignore_ascii_case("all") => Change::DiscardAll,
            _ => Change::Unknown,
        },
        Some("set") => parse_set(text[3..].trim_start()),
        _ => Change::Unknown,
    }
}

fn parse_set(rest: &str) -> Change {
    let (word, after) = split_word(rest);
    let lower = word.to_ascii_lowercase();
    match lower.as_str() {
        "local" => {
            return Change::Local(match parse_set(after) {
                Change::Set { name, value } => Some((name, Some(value))),
                Change::Reset { name } => Some((name, None)),
                _ => None,
            })
        }
        "session" => {
            let (next, value) = split_word(after);
            if next.eq_ignore_ascii_case("authorization") {
                return set_value("session_authorization", value);
            }
            if next.eq_ignore_ascii_case("characteristics") {
                return Change::Unknown;
            }
            return parse_set(after);
        }
        "role" => {
            // `SET ROLE x`, and the setting's own forms `SET role = 'x'`, `SET role TO x`.
            let value = after.trim();
            let value = match split_word(value) {
                (to, rest) if to.eq_ignore_ascii_case("to") => rest.trim(),
                _ => value.strip_prefix('=').unwrap_or(value).trim(),
            };
            if value.eq_ignore_ascii_case("none") {
                return Change::Reset {
                    name: "role".into(),
                };
            }
            return set_value("role", value);
        }
        "time" => {
            let (zone, value) = split_word(after);
            let value = value.trim();
            if zone.eq_ignore_ascii_case("zone") && value.eq_ignore_ascii_case("local") {
                return Change::Reset {
                    name: "timezone".into(),
                };
            }
            // `TIME ZONE INTERVAL '+02:00' HOUR TO MINUTE` has no `SET timezone = ...` form
            // that replays it: not followed.
            let interval = value
                .get(..8)
                .is_some_and(|w| w.eq_ignore_ascii_case("interval"))
                && !value[8..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
            if zone.eq_ignore_ascii_case("zone") && !value.is_empty() && !interval {
                return set_value("timezone", value);
            }
            return Change::Unknown;
        }
        "schema" => return set_value("search_path", after),
        "names" => return set_value("client_encoding", after),
        "transaction" | "constraints" => return Change::Unknown,
        _ => {}
    }
    // `name = value` or `name TO value`, where the name may be glued to `=`.
    let (name, value) = match rest.find('=') {
        Some(eq) if !rest[..eq].trim().contains(char::is_whitespace) => {
            (rest[..eq].trim(), &rest[eq + 1..])
        }
        _ => {
            let (name, after) = split_word(rest);
            let (to, value) = split_word(after);
            if !to.eq_ignore_ascii_case("to") {
                return Change::Unknown;
            }
            (name, value)
        }
    };
    if name.is_empty() {
        return Change::Unknown;
    }
    set_value(&unquote_name(name), value)
}

fn set_value(name: &str, value: &str) -> Change {
    let value = value.trim();
    if value.is_empty() {
        return Change::Unknown;
    }
    if value.eq_ignore_ascii_case("default") {
        return Change::Reset {
            name: name.to_string(),
        };
    }
    Change::Set {
        name: name.to_ascii_lowercase(),
        value: value.to_string(),
    }
}

fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

fn unquote_name(name: &str) -> String {
    name.split('.')
        .map(
            |p| match p.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
                Some(q) => q.replace("\"\"", "\""),
                None => p.to_ascii_lowercase(),
            },
        )
        .collect::<Vec<_>>()
        .join(".")
}
