//! Routing by a lookup column (`lookup = { email = "text" }` in the shard map,
//! [`shardmap::Lookup`]): what a statement's text says about a sharded table's unique columns
//! other than its key. Part of [`super::refs`]'s one pass, finished by [`with_lookups`].
//!
//! - A statement of one sharded table (and reference tables) whose WHERE fixes no key but a
//!   lookup column to one value becomes [`Route::Lookup`]: the session reads the value's
//!   lookup row, and the statement runs on the shard of that keyspace ID. The rows it can see
//!   all have that value, and the value is unique, so the other shards have none of them.
//! - An INSERT of VALUES rows into a table with lookups becomes [`Route::WithLookups`]: the
//!   lookup rows of its values are written in the same write as its rows.
//! - What would change a lookup column without the router knowing the old and new values
//!   (UPDATE of it, DELETE, `ON CONFLICT`, an INSERT from a query) is refused: a stale or
//!   missing lookup row would send later reads to a shard without the row.
//!
//! Sans-IO.

use shardmap::Table;
use sqlparser::ast::{Expr, Insert, Parens, Statement, Value};

use super::pins::{name_parts, pin_by, ScopeRel};
use super::refs::Refs;
use super::{KeySource, LookupRows, LookupValues, Route};

/// A lookup column that a query's conditions fix (for [`Route::Lookup`]).
pub(crate) struct LookupPin<'m> {
    pub table: &'m Table,
    pub column: String,
    pub values: Vec<KeySource>,
}

impl<'m> Refs<'m> {
    /// Notes the first lookup column of `scope[index]` (a table no key pins) that `conds` fix.
    pub(super) fn lookup_pin(&mut self, scope: &[ScopeRel<'m>], index: usize, conds: &[&Expr]) {
        let table = scope[index].table;
        for lookup in &table.lookups {
            if let Some(values) = pin_by(scope, index, conds, &lookup.column, lookup.key_type) {
                self.lookup_pins.push(LookupPin {
                    table,
                    column: lookup.column.clone(),
                    values,
                });
                return;
            }
        }
    }

    /// Refuses an UPDATE of `table` that sets one of its lookup columns.
    /// Notes an UPDATE of `table` that sets (`set`) one of its lookup columns.
    pub(super) fn sets_lookups(&mut self, table: &Table, set: &[String]) {
        if table.lookups.iter().any(|l| set.contains(&l.column)) {
            self.sets_lookups = true;
            self.lookup_writes += 1;
        }
    }

    /// Notes an INSERT into, or a DELETE from, `table` (counted when it has lookup columns).
    pub(super) fn writes(&mut self, table: &Table) {
        if !table.lookups.is_empty() {
            self.lookup_writes += 1;
        }
    }

    /// The values an INSERT of `rows` (VALUES rows, columns as `ins` names them) into `table`
    /// gives each lookup column; refused when the router could not keep the lookup rows.
    pub(super) fn insert_lookups(&mut self, ins: &Insert, table: &Table, source: LookupSource<'_>) {
        if table.lookups.is_empty() {
            return;
        }
        let name = table.qualified_name();
        if ins.columns.is_empty() || ins.on.is_some() {
            return self.refuse(format!(
                "INSERT INTO {name}, which has lookup columns, needs a column list and no ON CONFLICT, so that the router can write the lookup rows of its values"
            ));
        }
        let mut out = Vec::with_capacity(table.lookups.len());
        for lookup in &table.lookups {
            let position = ins.columns.iter().position(|c| {
                name_parts(c)
                    .and_then(|p| p.last().cloned())
                    .is_some_and(|n| n == lookup.column)
            });
            let Some(position) = position else {
                return self.refuse(format!(
                    "INSERT INTO {name} must give its lookup column {} (NULL when it has none), so that the router can write its lookup row",
                    lookup.column
                ));
            };
            let values = match &source {
                LookupSource::Rows(rows, element) => {
                    match row_values(rows, element(position, lookup.key_type), lookup.key_type) {
                        Ok(values) => LookupValues::Rows(values),
                        Err(row) => {
                            return self.refuse(format!(
                                "row {row} of this INSERT INTO {name} gives the lookup column {} as an expression: it must be a literal, a parameter or NULL",
                                lookup.column
                            ))
                        }
                    }
                }
                LookupSource::Arrays(arrays) => {
                    match arrays.get(position).and_then(|a| super::pins::array_keys(a, lookup.key_type)).as_deref() {
                        Some([one @ KeySource::Array(_)]) => LookupValues::Array(one.clone()),
                        _ => {
                            return self.refuse(format!(
                                "the lookup column {} of this INSERT INTO {name} ... SELECT * FROM UNNEST(...) must come from one array parameter or literal",
                                lookup.column
                            ))
                        }
                    }
                }
            };
            out.push(LookupRows {
                table: table.lookup_table(lookup),
                values,
            });
        }
        self.lookup_rows = out;
    }
}

/// Where an INSERT's rows are, for reading its lookup columns.
pub(super) enum LookupSource<'q> {
    /// VALUES rows, and which element of a row holds a column of the INSERT's list (of a
    /// lookup of that type; `None` when the value stored could differ from the element's).
    Rows(
        &'q [Parens<Vec<Expr>>],
        &'q dyn Fn(usize, shardmap::KeyType) -> Option<usize>,
    ),
    /// `SELECT * FROM UNNEST(arrays)`: one array per column of the INSERT's list.
    Arrays(&'q [Expr]),
}

/// Each row's value of the element at `at`: a literal, a parameter, or NULL (`None`); the
/// 1-based row that has anything else.
fn row_values(
    rows: &[Parens<Vec<Expr>>],
    at: Option<usize>,
    key_type: shardmap::KeyType,
) -> Result<Vec<Option<KeySource>>, usize> {
    let mut values = Vec::with_capacity(rows.len());
    for (n, row) in rows.iter().enumerate() {
        let value = at.and_then(|at| row.content.get(at));
        if value.is_some_and(is_null) {
            values.push(None);
            continue;
        }
        values.push(Some(
            value
                .and_then(|e| super::pins::key_source(e, key_type))
                .ok_or(n + 1)?,
        ));
    }
    Ok(values)
}

/// A DELETE from `table`, which has lookup columns (`tables`: the statement's sharded table
/// references): its route with the lookup rows kept, or refused.
fn delete(d: &sqlparser::ast::Delete, route: Route, table: &Table, tables: usize) -> Route {
    let name = table.qualified_name();
    let refuse = |why: &str| Route::Unroutable {
        message: format!("DELETE from {name}, which has lookup columns, {why}"),
    };
    if tables > 1 {
        return refuse("cannot read other sharded tables (the router removes the lookup rows of the values it deletes)");
    }
    if d.returning.is_some() {
        return refuse("cannot have RETURNING yet (the router reads the deleted values to remove their lookup rows)");
    }
    if !matches!(route, Route::Keyed { .. } | Route::ScatterWrite { .. }) {
        return route;
    }
    // Qualified: a USING table may have columns of the same names.
    let tables = match &d.from {
        sqlparser::ast::FromTable::WithFromKeyword(t)
        | sqlparser::ast::FromTable::WithoutKeyword(t) => t,
    };
    let qualifier = match tables.first().map(|t| &t.relation) {
        Some(sqlparser::ast::TableFactor::Table { alias: Some(a), .. }) => {
            super::pins::fold(&a.name)
        }
        _ => table.name.clone(),
    };
    let q = shardmap::sql::quote_ident_always(&qualifier);
    let returning = std::iter::once(&table.key)
        .chain(table.lookups.iter().map(|l| &l.column))
        .map(|c| format!("{q}.{}", shardmap::sql::quote_ident_always(c)))
        .collect::<Vec<_>>()
        .join(", ");
    Route::DeletesLookups {
        route: Box::new(route),
        key_type: table.key_type,
        returning,
        lookups: table
            .lookups
            .iter()
            .map(|l| table.lookup_table(l))
            .collect(),
    }
}

/// `TRUNCATE` of a table with lookup columns that leaves out one of its lookup tables: refused
/// (their rows would refuse the values again); `None` for anything else.
pub(super) fn truncate(stmt: &Statement, refs: &Refs<'_>) -> Option<Route> {
    if !matches!(stmt, Statement::Truncate(_)) {
        return None;
    }
    let named = |lt: &Table| refs.sharded.iter().any(|t| **t == *lt);
    refs.sharded.iter().find_map(|t| {
        let lt = t
            .lookups
            .iter()
            .map(|l| t.lookup_table(l))
            .find(|lt| !named(lt))?;
        Some(Route::Unroutable {
            message: format!(
                "TRUNCATE {name} would leave the rows of its lookup table: truncate both, as in TRUNCATE {name}, {}",
                lt.qualified_name(),
                name = t.qualified_name(),
            ),
        })
    })
}

/// An UPDATE that sets a lookup column of `table` (`tables`: the statement's sharded table
/// references): its route with the lookup rows kept, or refused.
fn update(u: &sqlparser::ast::Update, route: Route, table: &Table, tables: usize) -> Route {
    let name = table.qualified_name();
    let refuse = |why: &str| Route::Unroutable {
        message: format!("this UPDATE sets a lookup column of {name}, so it {why}"),
    };
    if tables > 1 || u.from.is_some() {
        return refuse("cannot read other tables (the router reads the old and new values of the rows it changes)");
    }
    if u.returning.is_some() {
        return refuse("cannot have RETURNING yet (the router reads the old and new values of the rows it changes)");
    }
    if !matches!(route, Route::Keyed { .. } | Route::ScatterWrite { .. }) {
        return route;
    }
    let qualifier = match &u.table.relation {
        sqlparser::ast::TableFactor::Table { alias: Some(a), .. } => super::pins::fold(&a.name),
        _ => table.name.clone(),
    };
    Route::UpdatesLookups {
        route: Box::new(route),
        key_type: table.key_type,
        qualifier,
        key: table.key.clone(),
        lookups: table
            .lookups
            .iter()
            .map(|l| table.lookup_table(l))
            .collect(),
    }
}

/// An UPDATE (of `qualifier`'s table: its alias, else its name) rewritten to return, for each
/// row it changes, its `key`, the new values of the lookup `columns` and their old values:
///
/// ```text
/// WITH shardgate_old AS (SELECT q.key AS shardgate_key, q.c AS shardgate_old_0, ...
///                        FROM <target> WHERE <where> FOR UPDATE)
/// UPDATE <target> SET <sets> FROM shardgate_old
///   WHERE (<where>) AND q.key = shardgate_old.shardgate_key
/// RETURNING q.key, q.c, ..., shardgate_old.shardgate_old_0, ...
/// ```
///
/// The CTE locks the rows the client's WHERE picks, in their newest versions, and reads their
/// old values; the UPDATE changes the rows its WHERE picks, each with the old values of its key.
/// (Rows that share a key share a keyspace ID, so a mix-up of their old values can only leave a
/// lookup row behind, never drop a live row's.) `None` for any other shape (WITH, FROM,
/// RETURNING, `WHERE CURRENT OF`).
pub fn update_returning_old(
    sql: &str,
    qualifier: &str,
    key: &str,
    columns: &[String],
) -> Option<String> {
    let marks = update_marks(sql)?;
    let q = shardmap::sql::quote_ident_always(qualifier);
    let target = sql[marks.update..marks.set_word].trim();
    let sets = sql[marks.set..marks.where_word.unwrap_or(marks.end)].trim();
    let filter = marks
        .where_word
        .map(|_| format!(" WHERE {}", sql[marks.filter..marks.end].trim()))
        .unwrap_or_default();
    let quoted: Vec<String> = columns
        .iter()
        .map(|c| shardmap::sql::quote_ident_always(c))
        .collect();
    let old: Vec<String> = quoted
        .iter()
        .enumerate()
        .map(|(n, c)| format!("{q}.{c} AS shardgate_old_{n}"))
        .collect();
    let new: Vec<String> = quoted.iter().map(|c| format!("{q}.{c}")).collect();
    let was: Vec<String> = (0..columns.len())
        .map(|n| format!("shardgate_old.shardgate_old_{n}"))
        .collect();
    let key = shardmap::sql::quote_ident_always(key);
    // The rows are matched again by the client's WHERE and their key (not by ctid: under READ
    // COMMITTED a row another transaction updated meanwhile is locked by the CTE in its newest
    // version, while the UPDATE's scan meets the older one and only then follows it).
    let again = marks
        .where_word
        .map(|_| format!("({}) AND ", sql[marks.filter..marks.end].trim()))
        .unwrap_or_default();
    Some(format!(
        "WITH shardgate_old AS (SELECT {q}.{key} AS shardgate_key, {old} FROM {target}{filter} FOR UPDATE) \
         UPDATE {target} SET {sets} FROM shardgate_old WHERE {again}{q}.{key} = shardgate_old.shardgate_key \
         RETURNING {q}.{key}, {new}, {was}{tail}",
        old = old.join(", "),
        new = new.join(", "),
        was = was.join(", "),
        tail = &sql[marks.end..],
    ))
}

/// Where the parts of an UPDATE's text are (byte offsets).
struct UpdateMarks {
    /// After the word UPDATE; the word SET and after it; the word WHERE and after it; the end
    /// of the last word.
    update: usize,
    set_word: usize,
    set: usize,
    where_word: Option<usize>,
    filter: usize,
    end: usize,
}

fn update_marks(sql: &str) -> Option<UpdateMarks> {
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::keywords::Keyword;
    use sqlparser::tokenizer::{Token, Tokenizer};
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let at = |l: sqlparser::tokenizer::Location| super::values::byte_offset(sql, l.line, l.column);
    let words: Vec<_> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
        .collect();
    // The first word is UPDATE: a WITH in front is another shape.
    let first = words.first()?;
    if !matches!(&first.token, Token::Word(w) if w.keyword == Keyword::UPDATE) {
        return None;
    }
    let (mut set, mut filter, mut depth) = (None, None, 0i32);
    for (n, t) in words.iter().enumerate() {
        let keyword = match &t.token {
            Token::LParen => {
                depth += 1;
                continue;
            }
            Token::RParen => {
                depth -= 1;
                continue;
            }
            Token::Word(w) if depth == 0 => w.keyword,
            _ => continue,
        };
        match keyword {
            Keyword::SET if set.is_none() => set = Some((at(t.span.start)?, at(t.span.end)?)),
            Keyword::WHERE if set.is_some() && filter.is_none() => {
                let current = words.get(n + 1).is_some_and(
                    |next| matches!(&next.token, Token::Word(w) if w.keyword == Keyword::CURRENT),
                );
                if current {
                    return None;
                }
                filter = Some((at(t.span.start)?, at(t.span.end)?));
            }
            Keyword::FROM | Keyword::RETURNING if set.is_some() => return None,
            _ => {}
        }
    }
    let last = words
        .iter()
        .rev()
        .find(|t| !matches!(t.token, Token::SemiColon))?;
    let end = at(last.span.end)?;
    let (set_word, set) = set?;
    Some(UpdateMarks {
        update: at(first.span.end)?,
        set_word,
        set,
        where_word: filter.map(|(w, _)| w),
        filter: filter.map_or(end, |(_, f)| f),
        end,
    })
}

/// `sql` (one statement, without RETURNING) with ` RETURNING columns` after its last word
/// (before a closing `;` and comments). `None` when it does not tokenize.
pub fn with_returning(sql: &str, columns: &str) -> Option<String> {
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::tokenizer::{Token, Tokenizer};
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let last = tokens.iter().rev().find(|t| {
        !matches!(
            t.token,
            Token::Whitespace(_) | Token::SemiColon | Token::EOF
        )
    })?;
    let end = super::values::byte_offset(sql, last.span.end.line, last.span.end.column)?;
    Some(format!(
        "{} RETURNING {columns}{}",
        &sql[..end],
        &sql[end..]
    ))
}

fn is_null(e: &Expr) -> bool {
    matches!(e, Expr::Value(v) if v.value == Value::Null)
}

/// The route of `stmt` once its lookups are accounted for: `route` as planned without them,
/// wrapped for a lookup read or an INSERT that writes lookup rows, or refused.
pub(super) fn with_lookups(stmt: &Statement, route: Route, refs: &mut Refs<'_>) -> Route {
    if matches!(route, Route::Unroutable { .. } | Route::TooLong { .. }) && refs.problem.is_some() {
        return route;
    }
    // The router keeps lookup rows only for a write that is the whole statement.
    let root = matches!(
        stmt,
        Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_)
    );
    if refs.lookup_writes > 1 || (refs.lookup_writes == 1 && !root) {
        return Route::Unroutable {
            message: "a write of a table with lookup columns inside another statement (WITH, a subquery, COPY (...), several writes in one) is not supported: the router keeps lookup rows only for an INSERT, UPDATE or DELETE sent as a statement of its own".into(),
        };
    }
    let rows = std::mem::take(&mut refs.lookup_rows);
    if !rows.is_empty() {
        return match route {
            Route::Keyed { .. } => Route::WithLookups {
                route: Box::new(route),
                rows,
            },
            other => other,
        };
    }
    if let (Statement::Delete(d), 1) = (stmt, refs.lookup_writes) {
        if let Some(t) = refs.sharded.iter().find(|t| !t.lookups.is_empty()) {
            return delete(d, route, t, refs.sharded.len());
        }
    }
    if let (Statement::Update(u), true) = (stmt, refs.sets_lookups) {
        if let Some(t) = refs.sharded.first() {
            return update(u, route, t, refs.sharded.len());
        }
    }
    // One reference to one sharded table, which no key pins: its rows are those of one value.
    let one_free_table =
        refs.sharded.len() == 1 && refs.pins.is_empty() && refs.correlated == 0 && refs.tied == 0;
    let pin = match refs.lookup_pins.as_mut_slice() {
        // One value (an array, `= ANY($1)`, may hold several).
        [pin]
            if one_free_table
                && matches!(pin.values.as_slice(), [v] if !matches!(v, KeySource::Array(_))) =>
        {
            pin
        }
        _ => return route,
    };
    // Only what would run on every shard; a refusal stays one.
    if !matches!(stmt, Statement::Query(_) | Statement::Update(_))
        || !matches!(route, Route::Scatter { .. } | Route::ScatterWrite { .. })
    {
        return route;
    }
    let Some(lookup) = pin.table.lookup(&pin.column) else {
        return route;
    };
    Route::Lookup {
        table: pin.table.qualified_name(),
        lookup: pin.table.lookup_table(lookup),
        value: pin.values.remove(0),
        without: Box::new(route),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use shardmap::{KeyType, Lookup, ShardMap, Table};

    use super::super::{LookupValues, NormalizeBuf, Planner, Route};

    fn route(sql: &str) -> Route {
        let urls: Vec<String> = (0..4).map(|i| format!("postgres://h/s{i}")).collect();
        let people = Table::new("people", "id", KeyType::BigInt).with_lookups(vec![Lookup {
            column: "email".into(),
            key_type: KeyType::Text,
        }]);
        let map = ShardMap::even_split(&urls, vec![people]).expect("valid map");
        let p = Planner::new(Arc::new(map), 1000);
        let mut buf = NormalizeBuf::new();
        let planned = p.plan(sql, &mut buf).statements().to_vec();
        assert_eq!(planned.len(), 1, "{sql}");
        planned.into_iter().next().unwrap_or(Route::Unparsed)
    }

    #[test]
    fn reads_and_updates_by_one_lookup_value_route_by_it() {
        for sql in [
            "SELECT * FROM people WHERE email = 'a@x'",
            "SELECT count(*) FROM people p WHERE p.email = $1 AND name IS NOT NULL",
            "SELECT name FROM people WHERE email IN ('a@x')",
            "UPDATE people SET name = 'n' WHERE email = $1",
        ] {
            assert!(matches!(route(sql), Route::Lookup { .. }), "{sql}");
        }
        // The key decides when there is one; several values, an OR or a function do not pin.
        for sql in [
            "SELECT * FROM people WHERE email = 'a@x' AND id = 3",
            "SELECT * FROM people WHERE email IN ('a@x', 'b@x')",
            "SELECT * FROM people WHERE email = 'a@x' OR name = 'b'",
            "SELECT * FROM people WHERE lower(email) = 'a@x'",
        ] {
            assert!(!matches!(route(sql), Route::Lookup { .. }), "{sql}");
        }
    }

    #[test]
    fn inserts_carry_their_lookup_values_and_what_would_lose_them_is_refused() {
        match route("INSERT INTO people (id, email) VALUES (1, 'a@x'), ($1, NULL)") {
            Route::WithLookups { rows, .. } => {
                assert_eq!(rows.len(), 1);
                match &rows[0].values {
                    LookupValues::Rows(values) => {
                        assert_eq!(values.len(), 2);
                        assert!(values[0].is_some() && values[1].is_none());
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(
                    rows[0].table.qualified_name(),
                    "shardgate.lookup_people_email"
                );
            }
            other => panic!("{other:?}"),
        }
        for sql in [
            "UPDATE people SET email = 'b@x' WHERE id = 1 RETURNING id",
            "DELETE FROM people WHERE id = 1 RETURNING *",
            "INSERT INTO people (id) VALUES (1)",
            "INSERT INTO people (id, email) VALUES (1, lower('A'))",
            "INSERT INTO people (id, email) VALUES (1, 'a') ON CONFLICT DO NOTHING",
        ] {
            assert!(
                matches!(route(sql), Route::Unroutable { .. }),
                "{sql}: {:?}",
                route(sql)
            );
        }
        assert!(matches!(
            route("INSERT INTO people (id, email) SELECT p0, p1::varchar(3) FROM (VALUES ($1, $2, 0)) AS s(p0, p1, n) ORDER BY n"),
            Route::Unroutable { .. }
        ));
        for sql in [
            "INSERT INTO people (id, email) SELECT p0, p1::varchar FROM (VALUES ($1, $2, 0)) AS s(p0, p1, n) ORDER BY n",
            "INSERT INTO people (id, email) SELECT * FROM UNNEST($1::bigint[], $2::text[])",
            "INSERT INTO people (id, email) SELECT p0, p1 FROM (VALUES ($1, $2, 0)) AS s(p0, p1, n) ORDER BY n",
        ] {
            assert!(matches!(route(sql), Route::WithLookups { .. }), "{sql}");
        }
        for sql in [
            "DELETE FROM people WHERE id = 1",
            "DELETE FROM people WHERE email = $1",
        ] {
            match route(sql) {
                Route::DeletesLookups {
                    returning, lookups, ..
                } => {
                    assert_eq!(returning, r#""people"."id", "people"."email""#);
                    assert_eq!(lookups.len(), 1);
                }
                other => panic!("{sql}: {other:?}"),
            }
        }
    }

    #[test]
    fn updates_of_lookup_columns_return_old_and_new_values() {
        assert!(matches!(
            route("UPDATE people SET email = $1, name = 'x' WHERE id = $2"),
            Route::UpdatesLookups { .. }
        ));
        let got = super::update_returning_old(
            "UPDATE people p SET email = $1 WHERE p.id = $2;",
            "p",
            "id",
            &["email".into()],
        );
        assert_eq!(
            got.as_deref(),
            Some(concat!(
                r#"WITH shardgate_old AS (SELECT "p"."id" AS shardgate_key, "p"."email" AS shardgate_old_0 "#,
                r#"FROM people p WHERE p.id = $2 FOR UPDATE) "#,
                r#"UPDATE people p SET email = $1 FROM shardgate_old WHERE (p.id = $2) AND "p"."id" = shardgate_old.shardgate_key "#,
                r#"RETURNING "p"."id", "p"."email", shardgate_old.shardgate_old_0;"#
            ))
        );
        let all = super::update_returning_old("UPDATE t SET v = 1", "t", "id", &["v".into()]);
        assert!(all.is_some_and(|s| s.contains("FROM t FOR UPDATE")));
        for sql in [
            "UPDATE t SET v = 1 FROM u WHERE u.id = t.id",
            "UPDATE t SET v = 1 WHERE id = 1 RETURNING v",
            "UPDATE t SET v = 1 WHERE CURRENT OF c",
            "WITH x AS (SELECT 1) UPDATE t SET v = 1",
        ] {
            assert!(
                super::update_returning_old(sql, "t", "id", &["v".into()]).is_none(),
                "{sql}"
            );
        }
        // Parentheses hide what is inside them.
        let nested = "UPDATE t SET v = (SELECT max(v) FROM u WHERE u.k = 1) WHERE id = 2";
        assert!(super::update_returning_old(nested, "t", "id", &["v".into()]).is_some());
    }

    #[test]
    fn writes_the_router_cannot_follow_are_refused_and_refusals_stay_refusals() {
        for sql in [
            "WITH x AS (SELECT 1) UPDATE people SET email = 'b' WHERE id = 1",
            "WITH d AS (DELETE FROM people WHERE id = 1 RETURNING *) SELECT * FROM d",
            "WITH i AS (INSERT INTO people (id, email) VALUES (1, 'a') RETURNING id) SELECT * FROM i",
            "EXPLAIN ANALYZE DELETE FROM people WHERE id = 1",
            "EXPLAIN ANALYZE UPDATE people SET email = 'b' WHERE id = 1",
            "SELECT * INTO t FROM people WHERE email = 'a'",
            "TRUNCATE people",
        ] {
            assert!(matches!(route(sql), Route::Unroutable { .. }), "{sql}: {:?}", route(sql));
        }
        assert!(matches!(
            route("TRUNCATE people, shardgate.lookup_people_email"),
            Route::Broadcast
        ));
        // Plain EXPLAIN plans the client's statement where its rows are.
        assert!(matches!(
            route("EXPLAIN INSERT INTO people (id, email) VALUES (1, 'a')"),
            Route::Keyed { .. }
        ));
        // Several values in one array may be on several shards: every shard, as without.
        assert!(matches!(
            route("SELECT * FROM people WHERE email = ANY($1)"),
            Route::Scatter { .. }
        ));
    }

    #[test]
    fn returning_goes_after_the_last_word() {
        let cases = [
            (
                "DELETE FROM t WHERE id = 1",
                "DELETE FROM t WHERE id = 1 RETURNING a",
            ),
            (
                "DELETE FROM t WHERE id = 1;",
                "DELETE FROM t WHERE id = 1 RETURNING a;",
            ),
            (
                "DELETE FROM t WHERE v = 'x' -- done\n",
                "DELETE FROM t WHERE v = 'x' RETURNING a -- done\n",
            ),
            (
                "DELETE FROM t\nWHERE id = $1 /* c */ ;",
                "DELETE FROM t\nWHERE id = $1 RETURNING a /* c */ ;",
            ),
        ];
        for (sql, want) in cases {
            assert_eq!(
                super::with_returning(sql, "a").as_deref(),
                Some(want),
                "{sql}"
            );
        }
    }
}
