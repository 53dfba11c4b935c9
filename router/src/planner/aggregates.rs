//! The aggregates of a select list that merge across shards: which call is which kind
//! ([`Item`], [`plain_aggregate`]), and the client's columns of a grouped read in terms of the
//! shards' columns ([`grouped_outputs`]). Used by [`super::scatter`] to plan a merge and by
//! [`super::shard_text`] to write what the shards run instead. Pure.

use sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, SelectItem,
};

use super::scatter::item_expr;
use crate::merge::arith::ArithOp;
use crate::merge::variance::Dispersion;
use crate::merge::{AggOp, Out};

/// One select-list item, classified.
pub(super) enum Item {
    Agg(AggOp),
    Avg,
    /// `stddev`, `variance` and kin: from `count`, `sum` and the sum of squares.
    Dispersion(Dispersion),
    /// `count(DISTINCT x)` (not of a key): the shards group by `x` too, the router counts.
    CountDistinct,
    /// `agg1 op agg2` (`+`, `-`, `*`) of two plain aggregates.
    Arith(ArithOp, AggOp, AggOp),
    /// No function call at all: a column, a constant, operators.
    Plain,
    /// Calls a function (which might be an aggregate unless it is a GROUP BY expression).
    Function,
}

/// The client's columns of a grouped read in terms of the shards' columns (each `avg` is two
/// shard columns, each variance three), and the names of the columns the router computes.
pub(super) fn grouped_outputs(
    items: &[Item],
    projection: &[SelectItem],
    is_group_key: &[bool],
) -> Result<(Vec<Out>, Vec<String>), &'static str> {
    let mut out = Vec::with_capacity(items.len());
    let mut avg_names = Vec::new();
    let mut column = 0;
    for (i, item) in items.iter().enumerate() {
        match item {
            Item::Agg(op) => out.push(Out::Agg { op: *op, column }),
            Item::Avg => {
                out.push(Out::Avg {
                    sum: column,
                    count: column + 1,
                });
                column += 1;
                avg_names.push(output_name(&projection[i], "avg"));
            }
            Item::Dispersion(kind) => {
                out.push(Out::Dispersion {
                    kind: *kind,
                    count: column,
                    sum: column + 1,
                    squares: column + 2,
                });
                column += 2;
                let called = item_expr(&projection[i])
                    .and_then(|e| match e {
                        Expr::Function(f) => f.name.0.last().map(|p| p.to_string()),
                        _ => None,
                    })
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                avg_names.push(output_name(&projection[i], &called));
            }
            Item::CountDistinct => {
                out.push(Out::CountDistinct { column });
                avg_names.push(output_name(&projection[i], "count"));
            }
            Item::Arith(op, left, right) => {
                out.push(Out::Arith {
                    op: *op,
                    left: (*left, column),
                    right: (*right, column + 1),
                });
                column += 1;
                avg_names.push(output_name(&projection[i], "?column?"));
            }
            // A GROUP BY expression, or (when grouping by a primary key) a plain column that
            // depends on it: either way, equal within a group.
            Item::Plain => out.push(Out::Key(column)),
            Item::Function if is_group_key[i] => out.push(Out::Key(column)),
            Item::Function => return Err("a function in the select list of an aggregate query across shards must be a GROUP BY expression (only count/sum/min/max/avg aggregates merge)"),
        }
        column += 1;
    }
    Ok((out, avg_names))
}

/// `count(*)`, `count(x)`, `sum(x)`, `min(x)`, `max(x)`, `avg(x)`, `bool_and(x)` (`every(x)`),
/// `bool_or(x)` (not DISTINCT, no OVER, no ORDER BY inside; `FILTER (WHERE ..)` but for `avg`):
/// aggregates whose per-shard values combine exactly. `bool_and` is the least of the shards'
/// values (false before true, NULLs of shards without rows left out), `bool_or` the greatest; a
/// filter applies at the shards, which then give partial values like any other.
pub(super) fn plain_aggregate(expr: &Expr) -> Option<Item> {
    let Expr::Function(f) = expr else {
        return None;
    };
    if f.name.0.len() != 1 || f.over.is_some() || !f.within_group.is_empty() {
        return None;
    }
    let item = match f.name.0.last()?.to_string().to_ascii_lowercase().as_str() {
        "count" => Item::Agg(AggOp::Count),
        "sum" => Item::Agg(AggOp::Sum),
        "min" | "bool_and" | "every" => Item::Agg(AggOp::Min),
        "max" | "bool_or" => Item::Agg(AggOp::Max),
        "avg" if f.filter.is_none() => Item::Avg,
        name if f.filter.is_none() => Item::Dispersion(Dispersion::of_function(name)?),
        _ => return None,
    };
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let args_ok = match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] => {
            matches!(item, Item::Agg(AggOp::Count))
        }
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(_))] => true,
        _ => false,
    };
    (list.duplicate_treatment.is_none() && list.clauses.is_empty() && args_ok).then_some(item)
}

/// `agg1 op agg2` of two plain aggregates (count, sum, min, max; in parentheses or not): the
/// operator and both operands.
pub(super) fn arith_of(expr: &Expr) -> Option<(ArithOp, &Expr, &Expr)> {
    let Expr::BinaryOp { left, op, right } = unnest(expr) else {
        return None;
    };
    let op = match op {
        BinaryOperator::Plus => ArithOp::Add,
        BinaryOperator::Minus => ArithOp::Sub,
        BinaryOperator::Multiply => ArithOp::Mul,
        _ => return None,
    };
    let (l, r) = (unnest(left), unnest(right));
    let plain = |e: &Expr| matches!(plain_aggregate(e), Some(Item::Agg(_)));
    (plain(l) && plain(r)).then_some((op, l, r))
}

/// [`arith_of`] as a select-list item.
pub(super) fn arith_item(expr: &Expr) -> Option<Item> {
    let (op, l, r) = arith_of(expr)?;
    match (plain_aggregate(l)?, plain_aggregate(r)?) {
        (Item::Agg(a), Item::Agg(b)) => Some(Item::Arith(op, a, b)),
        _ => None,
    }
}

/// An expression without the parentheses around it.
fn unnest(mut e: &Expr) -> &Expr {
    while let Expr::Nested(inner) = e {
        e = inner;
    }
    e
}

/// The `x` of `count(DISTINCT x)` (one argument, no FILTER, ORDER BY or window).
pub(super) fn count_distinct_arg(expr: &Expr) -> Option<&Expr> {
    let Expr::Function(f) = expr else {
        return None;
    };
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let plain = f.name.0.len() == 1
        && f.name.to_string().eq_ignore_ascii_case("count")
        && f.filter.is_none()
        && f.over.is_none()
        && f.within_group.is_empty()
        && list.clauses.is_empty()
        && list.duplicate_treatment == Some(sqlparser::ast::DuplicateTreatment::Distinct);
    match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(x))] if plain => Some(x),
        _ => None,
    }
}

/// The name Postgres gives a select-list item: its alias, else `called` (the function's name).
fn output_name(item: &SelectItem, called: &str) -> String {
    match item {
        SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
        _ => called.to_string(),
    }
}

/// `count(DISTINCT key)` or `sum(DISTINCT key)`: the shards' answers add up.
pub(super) fn distinct_key_aggregate(expr: &Expr) -> Item {
    match expr {
        Expr::Function(f) if f.name.to_string().eq_ignore_ascii_case("sum") => {
            Item::Agg(AggOp::Sum)
        }
        _ => Item::Agg(AggOp::Count),
    }
}
