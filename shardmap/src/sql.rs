//! SQL text written by the tools and the router: identifiers and string literals quoted so
//! that Postgres reads them back as exactly the name or value given.

/// Quotes an identifier unless Postgres would read it unquoted as the same name.
pub fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        quote_ident_always(name)
    }
}

/// An identifier quoted whatever it is (a column may be named `user`, which unquoted is a
/// function): Postgres reads it back as exactly `name`.
pub fn quote_ident_always(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as a string literal that means the same whatever `standard_conforming_strings` is:
/// quotes doubled, and where a backslash occurs, an escape string (`E'...'`) with the
/// backslashes doubled.
pub fn quote_literal(text: &str) -> String {
    let escape = text.contains('\\');
    let mut out = String::with_capacity(text.len() + 3);
    if escape {
        out.push('E');
    }
    out.push('\'');
    for c in text.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' if escape => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_mean_the_same_whatever_standard_conforming_strings_is() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(""), "''");
        assert_eq!(quote_literal("{1,2}"), "'{1,2}'");
        assert_eq!(quote_literal(r#"{"a\"b",'c'}"#), r#"E'{"a\\"b",''c''}'"#);
        assert_eq!(quote_literal("pg\\_x"), "E'pg\\\\_x'");
        assert_eq!(quote_literal("é"), "'é'");
    }
}
