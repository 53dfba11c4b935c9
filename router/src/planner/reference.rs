//! Writes of reference tables: the table is whole on every shard, so an INSERT, UPDATE or DELETE
//! of it runs on every shard ([`super::Route::Replicated`]), all or nothing, and must do the same
//! there: it may read only reference tables (a sharded table's rows differ per shard, an
//! unsharded table is on the default shard only), and may not call a function whose value
//! differs per shard (`now()`, `random()`, a sequence, a user function). Pure.

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, FromTable, ObjectName, Statement, TableFactor, TableObject, Visit, Visitor,
};

use super::refs::{Refs, Rel};
use super::Route;

/// Functions that are plain (read no table) but give each shard its own value.
const PER_SHARD: &[&str] = &[
    "clock_timestamp",
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
    if let Some(f) = per_shard_function(stmt) {
        return unroutable(format!(
            "and {f}() would give each shard a different value: compute the value in the application and send it as a literal or a parameter"
        ));
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
    use sqlparser::ast::{AssignmentTarget, SetExpr};
    let is_default = |e: &Expr| matches!(e, Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("default"));
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
                left_out.then_some(column.as_str())
            })
        }
        Statement::Update(u) => per_shard.iter().find_map(|(column, _)| {
            u.assignments
                .iter()
                .any(|a| {
                    matches!(&a.target, AssignmentTarget::ColumnName(n)
                        if n.0.last().and_then(|p| p.as_ident()).is_some_and(|i| named(i, column)))
                        && is_default(&a.value)
                })
                .then_some(column.as_str())
        }),
        _ => None,
    }
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

/// The first function `stmt` calls that is not known to give every shard the same value.
fn per_shard_function(stmt: &Statement) -> Option<String> {
    struct Find(Option<String>);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            let Expr::Function(f) = expr else {
                return ControlFlow::Continue(());
            };
            let name = f.name.to_string().to_ascii_lowercase();
            let bare = name.rsplit('.').next().unwrap_or(&name);
            if PER_SHARD.contains(&bare) || !super::refs::is_plain_function(&f.name) {
                self.0 = Some(name);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find(None);
    let _ = stmt.visit(&mut find);
    find.0
}
