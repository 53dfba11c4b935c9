//! SQL cursors: `DECLARE name CURSOR FOR query`, and the commands that use one (`FETCH`,
//! `MOVE`, `CLOSE`), read from their text.
//!
//! A cursor whose query runs on one shard lives there, and its commands follow it; one that
//! reads several shards (or is `WITH HOLD`, which outlives the transaction and its
//! connections) is held by the router, which serves its commands (`crate::session::cursors`).
//! Either way the session must know which cursor a command names before routing it, and the
//! count it asks for: this module reads both from the text. sqlparser does not parse `MOVE`,
//! nor a count that normalization turned into `$1`, so the grammar of the three commands is
//! read here, by hand; it is small.
//!
//! Sans-IO: text in, values out.

use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer};

/// What a command does with its cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Fetch,
    Move,
    Close,
}

/// How far a FETCH or MOVE goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// The next `n` rows (`NEXT` is 1, `FORWARD n`, a bare `n`).
    Forward(u64),
    /// `ALL`, `FORWARD ALL`.
    All,
    /// Backward or absolute (`PRIOR`, `BACKWARD`, `ABSOLUTE n`, `LAST`, a negative count...):
    /// only a cursor on one shard can do it.
    Other,
}

/// One `FETCH`, `MOVE` or `CLOSE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub verb: Verb,
    pub count: Count,
    /// The cursor's name, folded as Postgres folds identifiers; `None` for `CLOSE ALL`.
    pub name: Option<String>,
}

/// The text's words and numbers, or `None` if it does not tokenize or holds anything else
/// (strings, operators other than `-`...).
fn words(text: &str) -> Option<Vec<Token>> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, text)
        .tokenize()
        .ok()?;
    let mut out: Vec<Token> = tokens
        .into_iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    while matches!(out.last(), Some(Token::SemiColon)) {
        out.pop();
    }
    Some(out)
}

fn keyword(t: &Token) -> Option<Keyword> {
    match t {
        Token::Word(w) if w.quote_style.is_none() => Some(w.keyword),
        _ => None,
    }
}

/// An identifier as Postgres folds it: unquoted to lower case, quoted as written.
fn identifier(t: &Token) -> Option<String> {
    match t {
        // Postgres folds ASCII letters only.
        Token::Word(w) if w.quote_style.is_none() => Some(name(w.value.to_ascii_lowercase())),
        Token::Word(w) if w.quote_style == Some('"') => Some(name(w.value.clone())),
        _ => None,
    }
}

/// A cursor's name as Postgres keeps it: at most 63 bytes (NAMEDATALEN - 1), cut at a
/// character boundary; so a long name the client writes out in full names the same cursor.
pub fn name(mut folded: String) -> String {
    if folded.len() > 63 {
        let mut end = 63;
        while !folded.is_char_boundary(end) {
            end -= 1;
        }
        folded.truncate(end);
    }
    folded
}

/// The command a text is, when it is one `FETCH`, `MOVE` or `CLOSE`. A count given as `$n`
/// (a parameter, or a number of normalized text) reads as [`Count::Other`]: read the client's
/// own text for it.
pub fn command(text: &str) -> Option<Command> {
    // Cheap enough for every text the planner has not seen: most are gone after this.
    let head = after_comments(text).as_bytes();
    let starts =
        |w: &str| head.len() >= w.len() && head[..w.len()].eq_ignore_ascii_case(w.as_bytes());
    if !(starts("fetch") || starts("move") || starts("close")) {
        return None;
    }
    let tokens = words(text)?;
    let (verb, rest) = match tokens.split_first()? {
        (t, rest) if keyword(t) == Some(Keyword::FETCH) => (Verb::Fetch, rest),
        (Token::Word(w), rest)
            if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("move") =>
        {
            (Verb::Move, rest)
        }
        (t, rest) if keyword(t) == Some(Keyword::CLOSE) => (Verb::Close, rest),
        _ => return None,
    };
    if verb == Verb::Close {
        return match rest {
            [t] if keyword(t) == Some(Keyword::ALL) => Some(Command {
                verb,
                count: Count::All,
                name: None,
            }),
            [t] => Some(Command {
                verb,
                count: Count::All,
                name: Some(identifier(t)?),
            }),
            _ => None,
        };
    }
    // [direction] [FROM | IN] name
    let (name, before) = rest.split_last()?;
    let name = identifier(name)?;
    let before = match before.split_last() {
        Some((t, b)) if matches!(keyword(t), Some(Keyword::FROM | Keyword::IN)) => b,
        _ => before,
    };
    let number = |ts: &[Token]| -> Option<Count> {
        match ts {
            // `FETCH 0` fetches the current row again: only a cursor on a shard can.
            [Token::Number(n, _)] => match n.parse::<u64>().ok()? {
                0 => Some(Count::Other),
                n => Some(Count::Forward(n)),
            },
            [Token::Minus, Token::Number(..)] | [Token::Placeholder(_)] => Some(Count::Other),
            _ => None,
        }
    };
    let count = match before {
        [] => Count::Forward(1),
        [t] if keyword(t) == Some(Keyword::NEXT) => Count::Forward(1),
        [t] if keyword(t) == Some(Keyword::ALL) => Count::All,
        [t] if keyword(t) == Some(Keyword::FORWARD) => Count::Forward(1),
        [t, u] if keyword(t) == Some(Keyword::FORWARD) && keyword(u) == Some(Keyword::ALL) => {
            Count::All
        }
        [t, n @ ..] if keyword(t) == Some(Keyword::FORWARD) => number(n)?,
        [t, ..]
            if matches!(
                keyword(t),
                Some(
                    Keyword::PRIOR
                        | Keyword::FIRST
                        | Keyword::LAST
                        | Keyword::ABSOLUTE
                        | Keyword::RELATIVE
                        | Keyword::BACKWARD
                )
            ) =>
        {
            Count::Other
        }
        n => number(n)?,
    };
    Some(Command {
        verb,
        count,
        name: Some(name),
    })
}

/// `text` after its leading blanks and comments.
fn after_comments(text: &str) -> &str {
    let mut rest = text.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            return rest;
        }
    }
}

/// Where the query of a `DECLARE name ... CURSOR ... FOR query` starts in its text.
pub fn declare_query(text: &str) -> Option<usize> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, text)
        .tokenize_with_location()
        .ok()?;
    let mut seen_cursor = false;
    for t in &tokens {
        match keyword(&t.token) {
            Some(Keyword::CURSOR) => seen_cursor = true,
            Some(Keyword::FOR) if seen_cursor => {
                let end = t.span.end;
                return byte_offset(text, end.line, end.column);
            }
            _ => {}
        }
    }
    None
}

/// The byte offset of a tokenizer location (1-based line and column, in characters).
fn byte_offset(text: &str, line: u64, column: u64) -> Option<usize> {
    let mut at = 0;
    for (n, l) in text.split_inclusive('\n').enumerate() {
        if n as u64 + 1 == line {
            let chars = usize::try_from(column.checked_sub(1)?).ok()?;
            return Some(at + l.char_indices().nth(chars).map_or(l.len(), |(i, _)| i));
        }
        at += l.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(verb: Verb, count: Count, name: &str) -> Option<Command> {
        Some(Command {
            verb,
            count,
            name: Some(name.into()),
        })
    }

    #[test]
    fn commands_are_read_as_postgres_reads_them() {
        use Count::*;
        use Verb::*;
        assert_eq!(
            command("FETCH FORWARD 7 FROM \"_django_curs_1\""),
            cmd(Fetch, Forward(7), "_django_curs_1")
        );
        assert_eq!(command("fetch c"), cmd(Fetch, Forward(1), "c"));
        assert_eq!(command("FETCH NEXT IN C;"), cmd(Fetch, Forward(1), "c"));
        assert_eq!(command("FETCH 3 c"), cmd(Fetch, Forward(3), "c"));
        assert_eq!(command("FETCH ALL FROM c"), cmd(Fetch, All, "c"));
        assert_eq!(command("FETCH FORWARD ALL FROM c"), cmd(Fetch, All, "c"));
        assert_eq!(command("FETCH FORWARD FROM c"), cmd(Fetch, Forward(1), "c"));
        assert_eq!(command("FETCH PRIOR FROM c"), cmd(Fetch, Other, "c"));
        assert_eq!(command("FETCH ABSOLUTE 3 FROM c"), cmd(Fetch, Other, "c"));
        assert_eq!(command("FETCH -2 FROM c"), cmd(Fetch, Other, "c"));
        assert_eq!(command("FETCH FORWARD $1 FROM c"), cmd(Fetch, Other, "c"));
        assert_eq!(command("FETCH 0 FROM c"), cmd(Fetch, Other, "c"));
        assert_eq!(
            command("/* app */ -- x\n FETCH 2 FROM Ärger"),
            cmd(Fetch, Forward(2), "Ärger".to_ascii_lowercase().as_str())
        );
        assert_eq!(command("MOVE 10 IN c"), cmd(Move, Forward(10), "c"));
        assert_eq!(command("move backward all in c"), cmd(Move, Other, "c"));
        assert_eq!(
            command("CLOSE \"My Cursor\""),
            Some(Command {
                verb: Close,
                count: All,
                name: Some("My Cursor".into())
            })
        );
        assert_eq!(
            command("close all"),
            Some(Command {
                verb: Close,
                count: All,
                name: None
            })
        );
        for not in [
            "SELECT 1",
            "FETCH",
            "FETCH 1 2 c",
            "CLOSE a b",
            "movement",
            "FETCH 'x' FROM c",
            "closed",
        ] {
            assert_eq!(command(not), None, "{not}");
        }
    }

    #[test]
    fn the_query_of_a_declare_is_found() {
        let sql = "DECLARE \"for\" NO SCROLL CURSOR WITH HOLD FOR SELECT * FROM kv";
        assert_eq!(&sql[declare_query(sql).unwrap()..], " SELECT * FROM kv");
        let sql = "declare c\n  cursor for\n select 'é' , id FROM kv";
        assert_eq!(
            &sql[declare_query(sql).unwrap()..],
            "\n select 'é' , id FROM kv"
        );
        assert_eq!(declare_query("DECLARE c CURSOR"), None);
    }
}
