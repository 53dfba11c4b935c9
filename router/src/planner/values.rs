//! Where the rows of an `INSERT ... VALUES (...), (...) ...` are in its text, so that the rows
//! of each shard can be sent as an INSERT of their own, written exactly as the client wrote them.
//!
//! Sans-IO: reads text only.

use std::ops::Range;

use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Location, Token, Tokenizer};

/// An INSERT's text cut around its VALUES rows.
#[derive(Debug, PartialEq, Eq)]
pub struct ValuesRows {
    /// Everything up to and including `VALUES`.
    pub head: Range<usize>,
    /// Each row, parentheses included.
    pub rows: Vec<Range<usize>>,
    /// Everything after the last row (`ON CONFLICT ...`, `RETURNING ...`), without a final `;`.
    pub tail: Range<usize>,
}

impl ValuesRows {
    /// The INSERT of only the rows `pick` (indices into [`ValuesRows::rows`]).
    pub fn statement(&self, sql: &str, pick: impl IntoIterator<Item = usize>) -> String {
        let mut out = String::with_capacity(sql.len());
        out.push_str(&sql[self.head.clone()]);
        for (n, i) in pick.into_iter().enumerate() {
            out.push_str(if n == 0 { " " } else { ", " });
            out.push_str(&sql[self.rows[i].clone()]);
        }
        let tail = sql[self.tail.clone()].trim();
        if !tail.is_empty() {
            out.push(' ');
            out.push_str(tail);
        }
        out
    }
}

/// Finds the VALUES rows of one INSERT statement; `None` if the text is not that shape.
pub fn values_rows(sql: &str) -> Option<ValuesRows> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let offset = |l: Location| byte_offset(sql, l.line, l.column);
    let mut depth = 0i32;
    let mut head = None;
    let mut rows = Vec::new();
    let mut row_start = 0;
    let mut tail_start = None;
    for t in &tokens {
        match &t.token {
            Token::Whitespace(_) => continue,
            Token::LParen => {
                if depth == 0 && head.is_some() && tail_start.is_none() {
                    row_start = offset(t.span.start)?;
                }
                depth += 1;
            }
            Token::RParen => {
                depth -= 1;
                if depth == 0 && head.is_some() && tail_start.is_none() {
                    rows.push(row_start..offset(t.span.end)?);
                }
            }
            Token::Word(w) if depth == 0 && head.is_none() && w.keyword == Keyword::VALUES => {
                head = Some(0..offset(t.span.end)?);
            }
            Token::Comma if depth == 0 => {}
            Token::SemiColon if depth == 0 && head.is_some() => {
                tail_start.get_or_insert(offset(t.span.start)?);
                break;
            }
            _ if depth == 0 && head.is_some() && tail_start.is_none() => {
                tail_start = Some(offset(t.span.start)?);
            }
            _ => {}
        }
    }
    let head = head?;
    let tail_start = tail_start.unwrap_or(sql.len());
    let mut tail_end = sql.len();
    if let Some(semi) = sql[tail_start..].rfind(';') {
        if sql[tail_start + semi + 1..].trim().is_empty() {
            tail_end = tail_start + semi;
        }
    }
    (!rows.is_empty()).then_some(ValuesRows {
        head,
        rows,
        tail: tail_start..tail_end,
    })
}

/// `sql` with its parameters numbered afresh from `$1` in the order they first appear, and for
/// each new number the old one (0-based): what a part of a split INSERT with bound parameters
/// sends, with the client's values picked in that order. `None` when the text does not
/// tokenize or numbers a parameter oddly.
pub fn renumber_params(sql: &str) -> Option<(String, Vec<usize>)> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let mut out = String::with_capacity(sql.len());
    let mut old: Vec<usize> = Vec::new();
    let mut copied = 0;
    for t in &tokens {
        let Token::Placeholder(p) = &t.token else {
            continue;
        };
        let n: usize = p.strip_prefix('$')?.parse().ok()?;
        let index = n.checked_sub(1)?;
        let start = byte_offset(sql, t.span.start.line, t.span.start.column)?;
        let end = byte_offset(sql, t.span.end.line, t.span.end.column)?;
        let new = match old.iter().position(|&o| o == index) {
            Some(i) => i + 1,
            None => {
                old.push(index);
                old.len()
            }
        };
        out.push_str(sql.get(copied..start)?);
        out.push('$');
        out.push_str(&new.to_string());
        copied = end;
    }
    out.push_str(sql.get(copied..)?);
    Some((out, old))
}

/// The byte offset of a tokenizer location (1-based line and character column).
pub(crate) fn byte_offset(sql: &str, line: u64, column: u64) -> Option<usize> {
    let mut line_start = 0;
    for _ in 1..line {
        line_start += sql[line_start..].find('\n')? + 1;
    }
    let rest = &sql[line_start..];
    let col = usize::try_from(column.checked_sub(1)?).ok()?;
    Some(line_start + rest.char_indices().nth(col).map_or(rest.len(), |(i, _)| i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_afresh_in_order_of_appearance() {
        let (sql, old) =
            renumber_params("INSERT INTO kv (id, v) VALUES ($5, $6), ($11, '$2') RETURNING $6")
                .expect("renumbered");
        assert_eq!(
            sql,
            "INSERT INTO kv (id, v) VALUES ($1, $2), ($3, '$2') RETURNING $2"
        );
        assert_eq!(old, [4, 5, 10]);
        assert_eq!(
            renumber_params("SELECT 1").expect("none"),
            ("SELECT 1".into(), vec![])
        );
        assert_eq!(renumber_params("SELECT $0"), None);
    }

    #[test]
    fn cuts_rows_as_written() {
        let sql = "INSERT INTO kv (id, v) VALUES (1, 'a, (b)'),\n (2, lower('ÄB')) ,(3,'c') ON CONFLICT (id) DO NOTHING;";
        let v = values_rows(sql).expect("rows");
        assert_eq!(&sql[v.head.clone()], "INSERT INTO kv (id, v) VALUES");
        let rows: Vec<&str> = v.rows.iter().map(|r| &sql[r.clone()]).collect();
        assert_eq!(rows, ["(1, 'a, (b)')", "(2, lower('ÄB'))", "(3,'c')"]);
        assert_eq!(
            v.statement(sql, [0, 2]),
            "INSERT INTO kv (id, v) VALUES (1, 'a, (b)'), (3,'c') ON CONFLICT (id) DO NOTHING"
        );
        let sql = "insert into kv values (1, 'x'), (2, 'y') returning id";
        let v = values_rows(sql).expect("rows");
        assert_eq!(
            v.statement(sql, [1]),
            "insert into kv values (2, 'y') returning id"
        );
        assert!(values_rows("INSERT INTO kv SELECT * FROM t").is_none());
    }
}
