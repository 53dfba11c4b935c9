//! What an INSERT into a sharded table pins: the key of each VALUES row (also of a SELECT of
//! `(VALUES ...) AS alias(columns)`, as SQLAlchemy writes many rows), the array of keys of
//! `SELECT * FROM UNNEST(arrays)`, or, when it leaves out a key that comes from a sequence, the
//! rows the router gives keys to (`super::Route::NewKeys`). Part of [`super::refs`]'s one pass.

use shardmap::Table;
use sqlparser::ast::{
    Expr, OnConflictAction, OnInsert, Query, Select, SetExpr, TableFactor, TableObject,
    TableWithJoins,
};

use super::lookups::LookupSource;
use super::pins::assigned_columns;
use super::pins::{fold, name_parts};
use super::refs::{KeyDefault, Pin, Refs, Rel};
use super::{KeySource, NewRows};

impl<'m> Refs<'m> {
    pub(super) fn insert(&mut self, ins: &sqlparser::ast::Insert) {
        let TableObject::TableName(name) = &ins.table else {
            return;
        };
        let Rel::Sharded(table) = self.classify(name) else {
            return;
        };
        self.writes(table);
        let (tname, key) = (table.qualified_name(), table.key.as_str());
        let facts = self.learned.get(&tname).cloned().unwrap_or_default();
        let position = if ins.columns.is_empty() {
            // Without a column list the values are in table order, which a shard's catalog told.
            match facts.key_position {
                Some(p) => Some(p),
                None => {
                    return self.refuse(format!(
                        "INSERT INTO {tname} needs a column list that names its sharding key, as in INSERT INTO {tname} ({key}, ...) VALUES (...) (the router could not read the table's column order from a shard)"
                    ))
                }
            }
        } else {
            ins.columns.iter().position(|c| {
                name_parts(c)
                    .and_then(|p| p.last().cloned())
                    .is_some_and(|n| n == key)
            })
        };
        let Some(mut position) = position else {
            return self.leaves_out_key(ins, table, facts.key_default);
        };
        if let Some(OnInsert::OnConflict(oc)) = &ins.on {
            if let OnConflictAction::DoUpdate(du) = &oc.action {
                if assigned_columns(&du.assignments).iter().any(|c| c == key) {
                    return self.refuse(format!(
                        "ON CONFLICT DO UPDATE must not change the sharding key {key} of {tname}: that would move the row to another shard"
                    ));
                }
            }
        }
        let mut of_values = None;
        let rows = match ins.source.as_deref().map(|q| (&*q.body, values_rows_of(q))) {
            Some((SetExpr::Values(values), _)) => values.rows.as_slice(),
            Some((_, Some((values, columns)))) => match select_of_values(values, columns, position) {
                Some((rows, at)) => {
                    position = at;
                    of_values = Some((values, columns));
                    rows
                }
                None => {
                    return self.refuse(format!(
                        "this INSERT INTO {tname} selects its rows from VALUES, but the router could not tell which of them is the sharding key {key}: select it as a plain column of the VALUES"
                    ))
                }
            },
            _ if ins.source.as_deref().and_then(unnest_arrays).is_some() => {
                if let Some(arrays) = ins.source.as_deref().and_then(unnest_arrays) {
                    self.insert_lookups(ins, table, LookupSource::Arrays(arrays));
                }
                return self.insert_unnest(ins, table, position);
            }
            _ => {
                return self.refuse(format!(
                    "INSERT INTO the sharded table {tname} can only take VALUES rows for now, not a query or DEFAULT VALUES"
                ))
            }
        };
        let mut keys = Vec::with_capacity(rows.len());
        for (n, row) in rows.iter().enumerate() {
            match row.content.get(position).and_then(|e| super::pins::key_source(e, table.key_type)) {
                Some(k) => keys.push(k),
                None => {
                    return self.refuse(format!(
                        "row {} of this INSERT INTO {tname} gives {key} as an expression: the sharding key must be a literal or a parameter",
                        n + 1
                    ))
                }
            }
        }
        // Which element of a row holds a column of the INSERT's list.
        let element = |p: usize, key_type| match of_values {
            Some((values, columns)) => {
                // A cast in the select list that could change the value (`::varchar(5)`) would
                // store another value than the VALUES row's.
                let cast = match values.projection.get(p) {
                    Some(sqlparser::ast::SelectItem::UnnamedExpr(Expr::Cast {
                        data_type, ..
                    }))
                    | Some(sqlparser::ast::SelectItem::ExprWithAlias {
                        expr: Expr::Cast { data_type, .. },
                        ..
                    }) => Some(data_type),
                    _ => None,
                };
                if cast.is_some_and(|t| !super::pins::cast_keeps_value(t, key_type)) {
                    return None;
                }
                select_of_values(values, columns, p).map(|(_, at)| at)
            }
            None => Some(p),
        };
        self.insert_lookups(ins, table, LookupSource::Rows(rows, &element));
        self.pins.push(Pin { table, keys });
    }

    /// An INSERT with a column list that leaves out the key: the router gives the key when the
    /// table takes it from a sequence, row by row of its VALUES.
    fn leaves_out_key(&mut self, ins: &sqlparser::ast::Insert, table: &Table, default: KeyDefault) {
        let (tname, key) = (table.qualified_name(), table.key.as_str());
        if default == KeyDefault::None {
            return self.refuse(format!(
                "INSERT INTO {tname} must give the sharding key {key} in its column list (the router gives a key only where the column takes one from a sequence: serial, identity or DEFAULT nextval(...))"
            ));
        }
        if table.key_type.integer_max().is_none() {
            return self.refuse(format!(
                "INSERT INTO {tname} must give the sharding key {key} in its column list: the router gives keys only to integer key columns, and {key} is {}",
                table.key_type
            ));
        }
        let source = ins.source.as_deref();
        if let Some(rows) = source.and_then(values_count) {
            self.new_keys = Some((NewRows::Values(rows), default));
            return;
        }
        let arrays = source.and_then(unnest_arrays).and_then(|arrays| {
            arrays
                .iter()
                .map(super::pins::array_value)
                .collect::<Option<Vec<_>>>()
        });
        match arrays {
            // One array per column: the rows are the arrays' elements.
            Some(arrays) if arrays.len() == ins.columns.len() => {
                self.new_keys = Some((NewRows::Unnest(arrays), default));
            }
            _ => self.refuse(format!(
                "INSERT INTO {tname} leaves out its sharding key {key}, which the router gives only to the rows of VALUES or of SELECT * FROM UNNEST(arrays): give {key}, or insert with INSERT INTO {tname} (...) VALUES (...)"
            )),
        }
    }

    /// `INSERT INTO t (cols) SELECT * FROM UNNEST(a1, a2, ...)`: the rows are the arrays'
    /// elements, so the key array pins the rows (element by element, like `= ANY`) and every
    /// array must be a value the router can cut by element.
    fn insert_unnest(&mut self, ins: &sqlparser::ast::Insert, table: &'m Table, position: usize) {
        let tname = table.qualified_name();
        let Some(arrays) = ins.source.as_deref().and_then(unnest_arrays) else {
            return;
        };
        if ins.columns.len() != arrays.len() {
            // Which array fills which column is certain only when each array is one column.
            return self.refuse(format!(
                "INSERT INTO {tname} ... SELECT * FROM UNNEST(...) needs a column list with one column per array, as in INSERT INTO {tname} ({}, ...) SELECT * FROM UNNEST($1::bigint[], ...)",
                table.key
            ));
        }
        let Some(key_array) = arrays.get(position) else {
            return self.refuse(format!(
                "this INSERT INTO {tname} takes its rows from UNNEST, which has no array for the sharding key {}",
                table.key
            ));
        };
        let key = match super::pins::array_keys(key_array, table.key_type).as_deref() {
            Some([one @ KeySource::Array(_)]) => one.clone(),
            _ => {
                return self.refuse(format!(
                    "the sharding key {} of this INSERT INTO {tname} ... SELECT * FROM UNNEST(...) must come from one array parameter or literal (as in UNNEST($1::bigint[], ...))",
                    table.key
                ))
            }
        };
        let Some(sources) = arrays
            .iter()
            .map(super::pins::array_value)
            .collect::<Option<Vec<_>>>()
        else {
            return self.refuse(format!(
                "every array of this INSERT INTO {tname} ... SELECT * FROM UNNEST(...) must be a parameter or a literal (optionally cast), so that its rows can be split by shard"
            ));
        };
        self.pins.push(Pin {
            table,
            keys: vec![key],
        });
        self.unnest = Some((sources, position));
    }
}

/// The arrays of `SELECT * FROM UNNEST(a1, a2, ...)`, when the query is exactly that (an alias
/// allowed, nothing else: no filter, order, limit or ordinality, which would make the rows
/// something other than the arrays' elements).
fn unnest_arrays(q: &Query) -> Option<&[Expr]> {
    if q.with.is_some() || q.order_by.is_some() || q.limit_clause.is_some() || q.fetch.is_some() {
        return None;
    }
    let SetExpr::Select(select) = &*q.body else {
        return None;
    };
    let plain = plain(select)
        && matches!(
            select.projection.as_slice(),
            [sqlparser::ast::SelectItem::Wildcard(_)]
        );
    match select.from.as_slice() {
        [TableWithJoins {
            relation:
                TableFactor::UNNEST {
                    array_exprs,
                    with_offset: false,
                    with_ordinality: false,
                    ..
                },
            joins,
        }] if plain && joins.is_empty() => Some(array_exprs),
        _ => None,
    }
}

/// A SELECT that gives the rows of its FROM as they are: no DISTINCT, filter, grouping or INTO.
fn plain(select: &Select) -> bool {
    select.distinct.is_none()
        && select.selection.is_none()
        && select.having.is_none()
        && select.into.is_none()
        && matches!(&select.group_by, sqlparser::ast::GroupByExpr::Expressions(g, _) if g.is_empty())
}

/// How many rows an INSERT's VALUES has: `VALUES (...), ...` itself, or a plain SELECT of
/// `(VALUES ...) AS alias(columns)` ([`values_rows_of`]).
fn values_count(q: &Query) -> Option<usize> {
    match &*q.body {
        SetExpr::Values(values) => Some(values.rows.len()),
        _ => values_rows_of(q).map(|(select, _)| values_of(select).map_or(0, |v| v.rows.len())),
    }
}

/// A plain SELECT of `(VALUES ...) AS alias(columns)` (how SQLAlchemy inserts many rows and
/// gets their keys back in order: `SELECT p0, p1 FROM (VALUES (.., 0), ..) AS imp_sen(p0, p1,
/// sen_counter) ORDER BY sen_counter`): the SELECT and the alias's columns.
fn values_rows_of(q: &Query) -> Option<(&Select, &[sqlparser::ast::TableAliasColumnDef])> {
    if q.with.is_some() || q.limit_clause.is_some() || q.fetch.is_some() {
        return None;
    }
    let SetExpr::Select(select) = &*q.body else {
        return None;
    };
    let plain = plain(select);
    match select.from.as_slice() {
        [TableWithJoins {
            relation:
                TableFactor::Derived {
                    lateral: false,
                    subquery,
                    alias: Some(alias),
                    ..
                },
            joins,
        }] if plain
            && joins.is_empty()
            && !alias.columns.is_empty()
            && subquery.order_by.is_none()
            && matches!(&*subquery.body, SetExpr::Values(_)) =>
        {
            Some((select, &alias.columns))
        }
        _ => None,
    }
}

/// The VALUES rows of a [`values_rows_of`] SELECT and which element of each row is the
/// inserted column `position`: the SELECT's item there must be a column of the alias (cast or
/// not), or the SELECT is `*`.
fn select_of_values<'q>(
    select: &'q Select,
    columns: &[sqlparser::ast::TableAliasColumnDef],
    position: usize,
) -> Option<(&'q [sqlparser::ast::Parens<Vec<Expr>>], usize)> {
    let values = values_of(select)?;
    let at = match select.projection.as_slice() {
        [sqlparser::ast::SelectItem::Wildcard(_)] => position,
        items => {
            let mut expr = match items.get(position)? {
                sqlparser::ast::SelectItem::UnnamedExpr(e)
                | sqlparser::ast::SelectItem::ExprWithAlias { expr: e, .. } => e,
                _ => return None,
            };
            while let Expr::Cast { expr: inner, .. } | Expr::Nested(inner) = expr {
                expr = inner;
            }
            let Expr::Identifier(name) = expr else {
                return None;
            };
            let name = fold(name);
            columns.iter().position(|c| fold(&c.name) == name)?
        }
    };
    Some((values.rows.as_slice(), at))
}

/// The VALUES a SELECT reads from, when its FROM is `(VALUES ...) AS alias`.
fn values_of(select: &Select) -> Option<&sqlparser::ast::Values> {
    match select.from.first().map(|t| &t.relation) {
        Some(TableFactor::Derived { subquery, .. }) => match &*subquery.body {
            SetExpr::Values(values) => Some(values),
            _ => None,
        },
        _ => None,
    }
}
