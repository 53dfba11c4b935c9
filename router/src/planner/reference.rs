//! Writes of reference tables: the table is whole on every shard, so an INSERT, UPDATE or DELETE
//! of it runs on every shard ([`super::Route::Replicated`]), all or nothing, and must do the same
//! there: it may read only reference tables (a sharded table's rows differ per shard, an
//! unsharded table is on the default shard only, the catalogs differ), may not call a function
//! whose value differs per shard (`now()`, `random()`, a sequence, a user function), nor depend
//! on the order rows come in (LIMIT, `string_agg`, windows), nor be nested in another statement.
//! Pure.

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, FromTable, ObjectName, Statement, TableFactor, TableObject, Visit, Visitor,
};

use super::refs::{Refs, Rel};
use super::Route;

/// Functions that are plain (read no table) but give each shard its own value.
const PER_SHARD: &[&str] = &[
    "clock_timestamp",
    "current_catalog",
    "current_database",
    "current_setting",
    "inet_server_addr",
    "inet_server_port",
    "txid_current",
    "txid_current_if_assigned",
    "version",
    "current_time",
    "current_timestamp",
    "gen_random_uuid",
    "localtime",
    "localtimestamp",
    "now",
    "random",
    "statement_timestamp",
    "timeofday",
    "transaction_timestamp",
    "uuid_generate_v4",
];

/// The route of a write whose target is a reference table (`None` when the target is not one).
pub(crate) fn write(stmt: &Statement, refs: &Refs<'_>) -> Option<Route> {
    if let Some(name) = nested_write(stmt, refs) {
        return Some(Route::Unroutable {
            message: format!("a write of the reference table {name} must run on every shard, so it cannot be part of another statement (WITH, COPY, DECLARE): send it as a statement of its own"),
        });
    }
    let target = target(stmt)?;
    let Rel::Reference(table) = refs.classify(target) else {
        return None;
    };
    let name = table.qualified_name();
    let unroutable = |why: String| {
        Some(Route::Unroutable {
            message: format!("a write of the reference table {name} runs on every shard, {why}"),
        })
    };
    if let Some(t) = refs.sharded.first() {
        return unroutable(format!(
            "so it can read only reference tables, not the sharded table {}, whose rows differ per shard",
            t.qualified_name()
        ));
    }
    if let Some(t) = refs.unsharded.first() {
        return unroutable(format!(
            "so it can read only reference tables, not {t}, which is only on the default shard (declare it `reference = true` in the shard map if every shard should have it)"
        ));
    }
    if refs.reads_catalog {
        return unroutable(
            "so it cannot read the system catalogs, which differ per shard".to_string(),
        );
    }
    if let Some(why) = per_shard(stmt) {
        return unroutable(why);
    }
    let facts = refs.learned.get(&name).cloned().unwrap_or_default();
    if let Some(column) = defaulted(stmt, &facts.per_shard_defaults) {
        return unroutable(format!(
            "and the default of its column {column} (an identity, a sequence, now(), ...) would give each shard a different value: give {column} a value in the statement"
        ));
    }
    Some(Route::Replicated { table: name })
}

/// A column of `per_shard` (name, position) that `stmt` leaves to its default: not named by an
/// INSERT's column list (or beyond its VALUES rows without one), `DEFAULT` in its VALUES or
/// in an UPDATE's SET, or any of them for `DEFAULT VALUES`.
fn defaulted<'c>(stmt: &Statement, per_shard: &'c [(String, usize)]) -> Option<&'c str> {
    use sqlparser::ast::SetExpr;
    let named = |name: &sqlparser::ast::Ident, column: &str| match name.quote_style {
        Some(_) => name.value == column,
        None => name.value.eq_ignore_ascii_case(column),
    };
    match stmt {
        Statement::Insert(ins) => {
            let rows = ins.source.as_deref().and_then(|q| match q.body.as_ref() {
                SetExpr::Values(v) => Some(&v.rows),
                _ => None,
            });
            per_shard.iter().find_map(|(column, position)| {
                let at = if ins.columns.is_empty() {
                    Some(*position)
                } else {
                    ins.columns.iter().position(|c| {
                        c.0.last()
                            .and_then(|p| p.as_ident())
                            .is_some_and(|i| named(i, column))
                    })
                };
                let left_out = match (at, rows, &ins.source) {
                    (None, _, _) | (_, _, None) => true,
                    (Some(at), Some(rows), _) => {
                        rows.iter().any(|row| row.get(at).is_none_or(is_default))
                    }
                    // INSERT ... SELECT without a column list: its width is unknown here.
                    (Some(_), None, _) => ins.columns.is_empty(),
                };
                let updated = match &ins.on {
                    Some(sqlparser::ast::OnInsert::OnConflict(c)) => match &c.action {
                        sqlparser::ast::OnConflictAction::DoUpdate(u) => {
                            assigns_default(&u.assignments, column)
                        }
                        _ => false,
                    },
                    _ => false,
                };
                (left_out || updated).then_some(column.as_str())
            })
        }
        Statement::Update(u) => per_shard
            .iter()
            .find(|(column, _)| assigns_default(&u.assignments, column))
            .map(|(c, _)| c.as_str()),
        _ => None,
    }
}

/// Whether `assignments` set `column` to `DEFAULT` (`SET c = DEFAULT`, `SET (a, c) = (1,
/// DEFAULT)`).
fn assigns_default(assignments: &[sqlparser::ast::Assignment], column: &str) -> bool {
    use sqlparser::ast::AssignmentTarget;
    let names = |n: &ObjectName| {
        n.0.last()
            .and_then(|p| p.as_ident())
            .is_some_and(|i| match i.quote_style {
                Some(_) => i.value == column,
                None => i.value.eq_ignore_ascii_case(column),
            })
    };
    assignments.iter().any(|a| match &a.target {
        AssignmentTarget::ColumnName(n) => names(n) && is_default(&a.value),
        AssignmentTarget::Tuple(targets) => match &a.value {
            Expr::Tuple(values) => targets
                .iter()
                .zip(values)
                .any(|(n, v)| names(n) && is_default(v)),
            _ => false,
        },
    })
}

/// The `DEFAULT` keyword where a value goes.
fn is_default(e: &Expr) -> bool {
    matches!(e, Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("default"))
}

/// The table an INSERT, UPDATE or DELETE writes.
fn target(stmt: &Statement) -> Option<&ObjectName> {
    let factor = match stmt {
        Statement::Insert(ins) => {
            return match &ins.table {
                TableObject::TableName(name) => Some(name),
                _ => None,
            }
        }
        Statement::Update(u) => &u.table.relation,
        Statement::Delete(d) => match &d.from {
            FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => &t.first()?.relation,
        },
        _ => return None,
    };
    match factor {
        TableFactor::Table { name, .. } => Some(name),
        _ => None,
    }
}

/// Why `stmt` could do something else on each shard, if it could: a function whose value
/// differs per shard (or that reads the shard's own state), an aggregate or window whose value
/// depends on the order rows come in, LIMIT (which rows it keeps depends on that order too), a
/// system column (a row's place differs per shard), or a date literal read when it runs.
fn per_shard<V: Visit>(node: &V) -> Option<String> {
    struct Find(Option<String>);
    impl Find {
        fn found(&mut self, why: String) -> ControlFlow<()> {
            self.0 = Some(why);
            ControlFlow::Break(())
        }
    }
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_query(&mut self, q: &sqlparser::ast::Query) -> ControlFlow<()> {
            if q.limit_clause.is_some() || q.fetch.is_some() {
                return self.found("and LIMIT keeps rows in the order each shard reads them, which differs per shard".into());
            }
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            match expr {
                Expr::Function(f) => {
                    let name = f.name.to_string().to_ascii_lowercase();
                    let bare = name.rsplit('.').next().unwrap_or(&name);
                    if f.over.is_some() || ORDER_SENSITIVE.contains(&bare) {
                        return self.found(format!("and {name}() depends on the order rows come in, which differs per shard"));
                    }
                    if PER_SHARD.contains(&bare)
                        || bare.starts_with("pg_")
                        || !super::refs::is_plain_function(&f.name)
                    {
                        return self.found(format!("and {name}() would give each shard a different value: compute the value in the application and send it as a literal or a parameter"));
                    }
                }
                Expr::Identifier(i) if system_column(&i.value) => {
                    return self
                        .found(format!("and {} (a row's place) differs per shard", i.value));
                }
                Expr::CompoundIdentifier(parts)
                    if parts.last().is_some_and(|i| system_column(&i.value)) =>
                {
                    return self
                        .found("and a system column (a row's place) differs per shard".into());
                }
                Expr::Cast { expr, .. } => {
                    if let Expr::Value(v) = expr.as_ref() {
                        if let sqlparser::ast::Value::SingleQuotedString(text) = &v.value {
                            if moving_date(text) {
                                return self.found(format!("and '{text}' is read when each shard runs it: send the date itself"));
                            }
                        }
                    }
                }
                Expr::TypedString(t) => {
                    if let sqlparser::ast::Value::SingleQuotedString(text) = &t.value.value {
                        if moving_date(text) {
                            return self.found(format!("and '{text}' is read when each shard runs it: send the date itself"));
                        }
                    }
                }
                _ => {}
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find(None);
    let _ = node.visit(&mut find);
    find.0
}

/// Why an `ALTER TABLE` of a reference table would fill the existing rows differently on each
/// shard, if it would: a new column whose value comes from a sequence (serial, identity) or
/// from a default that differs per shard. Each shard fills its rows itself.
pub(crate) fn alter_problem(stmt: &Statement) -> Option<String> {
    use sqlparser::ast::{AlterTableOperation, ColumnOption};
    let Statement::AlterTable(at) = stmt else {
        return None;
    };
    at.operations.iter().find_map(|op| {
        let AlterTableOperation::AddColumn { column_def, .. } = op else {
            return None;
        };
        let name = &column_def.name.value;
        let serial = matches!(
            column_def.data_type.to_string().to_ascii_lowercase().as_str(),
            "serial" | "serial2" | "serial4" | "serial8" | "smallserial" | "bigserial"
        );
        let identity = column_def.options.iter().any(|o| {
            matches!(
                o.option,
                ColumnOption::Generated {
                    generation_expr: None,
                    ..
                } | ColumnOption::Identity(_)
            )
        });
        if serial || identity {
            return Some(format!("the new column {name} takes each shard's own sequence values for the rows already there"));
        }
        column_def.options.iter().find_map(|o| match &o.option {
            ColumnOption::Default(e) => per_shard(e).map(|why| {
                format!("the new column {name}'s default would fill the rows already there differently on each shard ({why})")
            }),
            _ => None,
        })
    })
}

/// Aggregates whose value depends on the order of their input rows.
const ORDER_SENSITIVE: &[&str] = &[
    "array_agg",
    "json_agg",
    "json_object_agg",
    "jsonb_agg",
    "jsonb_object_agg",
    "string_agg",
    "xmlagg",
];

fn system_column(name: &str) -> bool {
    ["ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"]
        .contains(&name.to_ascii_lowercase().as_str())
}

/// A date or time literal whose value is the moment it is read (also as a parameter or a
/// literal that normalization took out of the text: the resolver checks those).
pub fn moving_date(text: &str) -> bool {
    ["now", "today", "tomorrow", "yesterday"].contains(&text.trim().to_ascii_lowercase().as_str())
}

/// A reference table that a statement nested in `stmt` writes (a data-modifying WITH, the
/// INSERT of `WITH .. INSERT`, a write under COPY or DECLARE): such a write would run where
/// `stmt` runs, not on every shard.
fn nested_write<'m>(stmt: &Statement, refs: &Refs<'m>) -> Option<String> {
    struct Find<'a, 'm> {
        root: *const Statement,
        refs: &'a Refs<'m>,
        found: Option<String>,
    }
    impl Visitor for Find<'_, '_> {
        type Break = ();
        fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<()> {
            if std::ptr::eq(s, self.root) {
                return ControlFlow::Continue(());
            }
            if let Some(Rel::Reference(r)) = target(s).map(|t| self.refs.classify(t)) {
                self.found = Some(r.qualified_name());
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find {
        root: stmt,
        refs,
        found: None,
    };
    let _ = stmt.visit(&mut find);
    find.found
}
