//! The text of an INSERT that left out its table's sharding key ([`super::Route::NewKeys`]),
//! with the keys the router gives written in: the key column first in the column list, each
//! VALUES row's key first in its row (or, for `SELECT * FROM UNNEST(arrays)`, an array of the
//! keys first among the arrays), and `OVERRIDING SYSTEM VALUE` for a `GENERATED ALWAYS`
//! column. What comes out is an ordinary keyed INSERT, planned and routed like one the client
//! wrote, and its `RETURNING` answers with the keys as Postgres would.
//!
//! Sans-IO: reads and writes text only.

use shardmap::sql::quote_ident;
use shardmap::KeyType;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer};

use super::values::{byte_offset, values_rows};

/// `sql` (one INSERT with a column list, and VALUES rows or `SELECT * FROM UNNEST(arrays)`)
/// with `keys[i]` as the value of `key` (of type `key_type`) in row `i`. `None` when the text
/// is not that shape, has another number of VALUES rows, or already says `OVERRIDING`.
pub fn with_keys(
    sql: &str,
    key: &str,
    key_type: KeyType,
    keys: &[i64],
    always: bool,
) -> Option<String> {
    let Some(cut) = values_rows(sql) else {
        return with_key_array(sql, key, key_type, keys, always)
            .or_else(|| with_derived_values(sql, key, keys, always));
    };
    if cut.rows.len() != keys.len() {
        return None;
    }
    let head = &sql[cut.head.clone()];
    let open = landmarks(head)?.column_list;
    // The head ends with the keyword VALUES (six letters, however it is written).
    let before_values = head.len().checked_sub("VALUES".len())?;
    let key = quote_ident(key);
    let mut out = String::with_capacity(sql.len() + keys.len() * (key.len() + 24) + 32);
    out.push_str(&head[..=open]);
    out.push_str(&key);
    out.push_str(", ");
    out.push_str(head[open + 1..before_values].trim_end());
    if always {
        out.push_str(" OVERRIDING SYSTEM VALUE");
    }
    out.push(' ');
    out.push_str(&head[before_values..]);
    for (n, (row, id)) in cut.rows.iter().zip(keys).enumerate() {
        out.push_str(if n == 0 { " (" } else { ", (" });
        out.push_str(&id.to_string());
        out.push_str(", ");
        out.push_str(&sql[row.start + 1..row.end]);
    }
    let tail = sql[cut.tail].trim();
    if !tail.is_empty() {
        out.push(' ');
        out.push_str(tail);
    }
    Some(out)
}

/// `INSERT INTO t (cols) SELECT * FROM UNNEST(arrays)`: the keys as one more array, first.
fn with_key_array(
    sql: &str,
    key: &str,
    key_type: KeyType,
    keys: &[i64],
    always: bool,
) -> Option<String> {
    let marks = landmarks(sql)?;
    let (select, unnest) = (marks.select?, marks.unnest?);
    let mut out = String::with_capacity(sql.len() + keys.len() * 20 + 64);
    out.push_str(&sql[..=marks.column_list]);
    out.push_str(&quote_ident(key));
    out.push_str(", ");
    out.push_str(sql[marks.column_list + 1..select].trim_end());
    out.push_str(if always {
        " OVERRIDING SYSTEM VALUE "
    } else {
        " "
    });
    out.push_str(&sql[select..=unnest]);
    out.push_str("'{");
    for (n, id) in keys.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(&id.to_string());
    }
    out.push_str("}'::");
    out.push_str(key_type.name());
    out.push_str("[], ");
    out.push_str(&sql[unnest + 1..]);
    Some(out)
}

/// The column of `(VALUES ...) AS alias(columns)` that carries the keys.
const KEY_COLUMN: &str = "shardgate_key";

/// `INSERT INTO t (cols) SELECT list FROM (VALUES rows) AS alias(columns) ...`: each row's key
/// first in its row, a column of the alias for it, and that column first in the SELECT list
/// (unless it is `*`, which then takes it first).
fn with_derived_values(sql: &str, key: &str, keys: &[i64], always: bool) -> Option<String> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let at = |l: sqlparser::tokenizer::Location| byte_offset(sql, l.line, l.column);
    let key = quote_ident(key);
    let mut inserts: Vec<(usize, String)> = Vec::new();
    let (mut depth, mut select, mut values, mut alias_list) = (0i32, false, false, false);
    let mut rows = keys.iter();
    let mut after_select = false;
    for t in tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
    {
        if after_select {
            after_select = false;
            if t.token != Token::Mul {
                inserts.push((at(t.span.start)?, format!("{KEY_COLUMN}, ")));
            }
        }
        match &t.token {
            Token::Word(w) if w.keyword == Keyword::OVERRIDING => return None,
            Token::Word(w) if depth == 0 && w.keyword == Keyword::SELECT && !select => {
                select = true;
                after_select = true;
                if always {
                    inserts.push((at(t.span.start)?, "OVERRIDING SYSTEM VALUE ".into()));
                }
            }
            Token::Word(w) if depth == 1 && select && w.keyword == Keyword::VALUES => values = true,
            Token::LParen => {
                let after = at(t.span.end)?;
                match depth {
                    0 if inserts.is_empty() => inserts.push((after, format!("{key}, "))),
                    0 if values && !alias_list => {
                        alias_list = true;
                        inserts.push((after, format!("{KEY_COLUMN}, ")));
                    }
                    1 if values && !alias_list => {
                        inserts.push((after, format!("{}, ", rows.next()?)))
                    }
                    _ => {}
                }
                depth += 1;
            }
            Token::RParen => depth -= 1,
            _ => {}
        }
    }
    if !alias_list || rows.next().is_some() {
        return None;
    }
    let mut out = String::with_capacity(sql.len() + keys.len() * 24 + 64);
    let mut copied = 0;
    for (offset, text) in inserts {
        out.push_str(sql.get(copied..offset)?);
        out.push_str(&text);
        copied = offset;
    }
    out.push_str(&sql[copied..]);
    Some(out)
}

/// Where the parts of an INSERT's text are (byte offsets).
struct Landmarks {
    /// The `(` of the column list: the first parenthesis outside any other.
    column_list: usize,
    /// `SELECT` outside parentheses, after the column list.
    select: Option<usize>,
    /// The `(` that follows `UNNEST`, outside other parentheses.
    unnest: Option<usize>,
}

/// The landmarks of an INSERT's text; `None` without a column list, or with `OVERRIDING`
/// already there.
fn landmarks(sql: &str) -> Option<Landmarks> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let at = |l: sqlparser::tokenizer::Location| byte_offset(sql, l.line, l.column);
    let (mut column_list, mut select, mut unnest) = (None, None, None);
    let mut depth = 0i32;
    let mut after_unnest = false;
    for t in tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
    {
        match &t.token {
            Token::Word(w) if w.keyword == Keyword::OVERRIDING => return None,
            Token::Word(w)
                if depth == 0 && w.keyword == Keyword::SELECT && column_list.is_some() =>
            {
                select.get_or_insert(at(t.span.start)?);
            }
            Token::LParen => {
                if depth == 0 && column_list.is_none() {
                    column_list = Some(at(t.span.start)?);
                } else if depth == 0 && after_unnest && unnest.is_none() {
                    unnest = Some(at(t.span.start)?);
                }
                depth += 1;
            }
            Token::RParen => depth -= 1,
            _ => {}
        }
        after_unnest =
            matches!(&t.token, Token::Word(w) if depth == 0 && w.keyword == Keyword::UNNEST);
    }
    Some(Landmarks {
        column_list: column_list?,
        select,
        unnest,
    })
}

#[cfg(test)]
mod tests {
    use super::with_keys;
    use shardmap::KeyType::BigInt;

    #[test]
    fn keys_go_first_in_the_column_list_and_in_every_row() {
        assert_eq!(
            with_keys("INSERT INTO kv (v) VALUES ('a')", "id", BigInt, &[7], false).as_deref(),
            Some("INSERT INTO kv (id, v) VALUES (7, 'a')")
        );
        assert_eq!(
            with_keys(
                "insert into kv(v, w) values ($1, now()), ('(x)', DEFAULT) returning id, v;",
                "id",
                BigInt,
                &[1, -2],
                false
            )
            .as_deref(),
            Some("insert into kv(id, v, w) values (1, $1, now()), (-2, '(x)', DEFAULT) returning id, v")
        );
    }

    #[test]
    fn a_column_generated_always_is_overridden_and_odd_keys_are_quoted() {
        assert_eq!(
            with_keys(
                "/* app */ INSERT INTO s.\"T\" AS t (v) VALUES (1) ON CONFLICT DO NOTHING",
                "Id",
                BigInt,
                &[5],
                true
            )
            .as_deref(),
            Some("/* app */ INSERT INTO s.\"T\" AS t (\"Id\", v) OVERRIDING SYSTEM VALUE VALUES (5, 1) ON CONFLICT DO NOTHING")
        );
    }

    #[test]
    fn unnest_gets_an_array_of_keys_first() {
        assert_eq!(
            with_keys(
                "INSERT INTO \"autos\" (\"v\", \"n\") SELECT * FROM UNNEST(($1)::text[], ($2)::integer[]) RETURNING \"autos\".\"id\"",
                "id",
                shardmap::KeyType::Integer,
                &[3, 4],
                true
            )
            .as_deref(),
            Some("INSERT INTO \"autos\" (id, \"v\", \"n\") OVERRIDING SYSTEM VALUE SELECT * FROM UNNEST('{3,4}'::integer[], ($1)::text[], ($2)::integer[]) RETURNING \"autos\".\"id\"")
        );
        assert_eq!(
            with_keys(
                "insert into t (v) select * from unnest('{}'::text[])",
                "id",
                BigInt,
                &[],
                false
            )
            .as_deref(),
            Some("insert into t (id, v) select * from unnest('{}'::bigint[], '{}'::text[])")
        );
    }

    #[test]
    fn a_select_of_values_gets_a_key_column() {
        let sql = "INSERT INTO autos (v, n) SELECT p0::VARCHAR, p1::INTEGER FROM (VALUES ($1::VARCHAR, $2::INTEGER, 0), ($3::VARCHAR, $4::INTEGER, 1)) AS imp_sen(p0, p1, sen_counter) ORDER BY sen_counter RETURNING autos.id, autos.id AS id__1";
        assert_eq!(
            with_keys(sql, "id", BigInt, &[8, 9], true).as_deref(),
            Some("INSERT INTO autos (id, v, n) OVERRIDING SYSTEM VALUE SELECT shardgate_key, p0::VARCHAR, p1::INTEGER FROM (VALUES (8, $1::VARCHAR, $2::INTEGER, 0), (9, $3::VARCHAR, $4::INTEGER, 1)) AS imp_sen(shardgate_key, p0, p1, sen_counter) ORDER BY sen_counter RETURNING autos.id, autos.id AS id__1")
        );
        assert_eq!(
            with_keys(
                "INSERT INTO t (v) SELECT * FROM (VALUES ('a')) AS x(v)",
                "id",
                BigInt,
                &[1],
                false
            )
            .as_deref(),
            Some("INSERT INTO t (id, v) SELECT * FROM (VALUES (1, 'a')) AS x(shardgate_key, v)")
        );
        // Fewer keys than rows.
        assert_eq!(with_keys(sql, "id", BigInt, &[8], false), None);
    }

    #[test]
    fn other_shapes_are_left_alone() {
        // A row count that does not match, no column list, an OVERRIDING of the client's, a query.
        assert_eq!(
            with_keys(
                "INSERT INTO kv (v) VALUES (1), (2)",
                "id",
                BigInt,
                &[1],
                false
            ),
            None
        );
        assert_eq!(
            with_keys("INSERT INTO kv VALUES (1)", "id", BigInt, &[1], false),
            None
        );
        assert_eq!(
            with_keys(
                "INSERT INTO kv (v) OVERRIDING USER VALUE VALUES (1)",
                "id",
                BigInt,
                &[1],
                false
            ),
            None
        );
        assert_eq!(
            with_keys("INSERT INTO kv (v) SELECT 1", "id", BigInt, &[1], false),
            None
        );
        assert_eq!(
            with_keys(
                "INSERT INTO kv SELECT * FROM UNNEST($1)",
                "id",
                BigInt,
                &[1],
                false
            ),
            None
        );
    }
}
