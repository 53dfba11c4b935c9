//! Which reads of a sharded table without a key can be answered from all shards, and how their
//! answers combine. Only shapes whose merge is exact are accepted:
//!
//! - a plain SELECT: rows concatenated (a LIMIT without ORDER BY keeps the first N, which is as
//!   correct as Postgres's own choice of N);
//! - `ORDER BY` columns of the select list: each shard sorts, the router merges the sorted
//!   streams; `LIMIT` is applied by each shard and again after the merge, `OFFSET` only after
//!   it (the shards are asked for `LIMIT limit + offset`);
//! - aggregates (`count`, `sum`, `min`, `max`, and `avg`, which the shards are asked as `sum`
//!   and `count`), with `GROUP BY` columns of the select list or `DISTINCT`: the shards group,
//!   the router combines equal groups ([`crate::merge::GroupMerge`]), then sorts, skips and
//!   limits itself.
//!
//! Everything else is refused with the reason, never answered wrongly: HAVING, window
//! functions, DISTINCT ON, set operations, WITH, other functions in the select list of an
//! aggregate query (they might be aggregates), ORDER BY expressions not in the select list.
//! The router then tries to read it in two stages ([`super::staged`]).
//! Whether a column's values can be merged (types, collation) is checked on the shards' first
//! answer, by the merge engine.

use std::ops::ControlFlow;
use std::sync::Arc;

use sqlparser::ast::{
    visit_expressions, CopySource, CopyTarget, Distinct, Expr, GroupByExpr, LimitClause,
    OrderByKind, OrderBySort, Query, SelectItem, SetExpr, Statement, TableFactor, Value,
};

use super::aggregates::{
    arith_item, count_distinct_arg, distinct_key_aggregate, grouped_outputs, plain_aggregate, Item,
};
use super::KeySource;
use crate::merge::{Out, SortKey};

/// How the shards' answers to a scattered statement combine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Merge {
    /// All rows of all shards, in shard order; at most `limit` rows when there is a LIMIT.
    Concat { limit: Option<KeySource> },
    /// Sorted, grouped or aggregated: the merge engine's work.
    Combine(Arc<MergePlan>),
    /// Not a read: the VALUES rows of a multi-row INSERT, split by the shard of each row's key
    /// (the route's keys are one per row, in order).
    SplitRows,
    /// Not a read: `INSERT ... SELECT * FROM UNNEST(arrays)`, whose rows are the arrays'
    /// elements: each shard gets the same statement with only its rows' elements of every
    /// array (`arrays`, in UNNEST order; `key` is the one holding the keys).
    SplitUnnest { arrays: Vec<KeySource>, key: usize },
    /// Not a read: an UPDATE or DELETE whose keys (`IN`, `= ANY`) fall on several shards, run
    /// on the shards of its keys, each in a transaction, all committed only if all succeeded;
    /// row counts summed, RETURNING rows concatenated.
    Write,
    /// `EXPLAIN` of a statement on several shards: each shard's plan, in shard order, under a
    /// line that names the shard.
    Explain,
    /// A read the merge cannot finish: its first stage runs across shards (merged as
    /// `first` says), one shard runs the rest over the first stage's rows
    /// ([`super::staged`]).
    Staged(Arc<super::staged::Staged>),
}

/// A read that the merge engine combines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergePlan {
    /// The client's columns in terms of the shards' columns, when the shards' rows are groups
    /// (or one row of aggregates) to combine; `None` when rows pass through in sorted order.
    pub group: Option<Vec<Out>>,
    /// `ORDER BY`, in the client's columns.
    pub order: Vec<SortKey>,
    /// Sort keys whose column is known only by name (the select list has a `*`): `order[i]`'s
    /// column is the answer's column of that name.
    pub order_names: Vec<(usize, String)>,
    pub limit: Option<KeySource>,
    pub offset: Option<KeySource>,
    /// The output names of the `avg` columns, in order.
    pub avg_names: Vec<String>,
    /// The shards run [`shard_sql`] of the client's text rather than the text itself.
    pub rewrite: bool,
}

/// Where a statement's groups and values live, as `super::refs` found from the shard map, by
/// address into the statement.
#[derive(Default)]
pub(crate) struct Placement {
    /// SELECTs each of whose groups lives on one shard: they group by the sharding key.
    pub whole_groups: Vec<*const sqlparser::ast::Select>,
    /// `count(DISTINCT key)` and `sum(DISTINCT key)` of a sharding key: each key value lives on
    /// one shard, so the shards' answers add up.
    pub distinct_keys: Vec<*const Expr>,
}

/// The merge for a statement, or why it cannot be scattered.
pub(crate) fn merge_for(stmt: &Statement, placed: &Placement) -> Result<Merge, &'static str> {
    let merge = merge_of_query(the_query(stmt)?, placed)?;
    // COPY data is concatenated as it comes: no rows to count, sort or stop at.
    if matches!(stmt, Statement::Copy { .. }) && merge != (Merge::Concat { limit: None }) {
        return Err("COPY of a sorted, grouped or limited query across shards is not supported");
    }
    Ok(merge)
}

pub(super) fn the_query(stmt: &Statement) -> Result<&Query, &'static str> {
    match stmt {
        Statement::Query(q) => Ok(q),
        // COPY (SELECT ...) TO STDOUT: the rows of the query, as COPY data.
        Statement::Copy {
            source: CopySource::Query(q),
            to: true,
            target: CopyTarget::Stdout,
            ..
        } => Ok(q),
        _ => Err("only SELECT can read from all shards (writes need a key)"),
    }
}

/// Whether a FROM item is (or nests) a subquery that does not just pass rows on (or a table
/// function). A subquery that only filters and computes row by row gives on each shard that
/// shard's part of its rows, as a table does, and so does one whose groups each live on one
/// shard ([`whole_groups_query`]); one that groups otherwise, aggregates, DISTINCTs, limits or
/// windows works on one shard's rows only.
fn derived(factor: &TableFactor, placed: &Placement) -> bool {
    match factor {
        TableFactor::Table { args: None, .. } => false,
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => {
            derived(&table_with_joins.relation, placed)
                || table_with_joins
                    .joins
                    .iter()
                    .any(|j| derived(&j.relation, placed))
        }
        TableFactor::Derived { subquery, .. } => {
            !row_by_row(subquery, placed) && !whole_groups_query(subquery, placed)
        }
        // Table functions, and anything else this router does not know to be a plain table.
        _ => true,
    }
}

/// A query that only filters and computes row by row: one SELECT, no WITH, grouping, HAVING,
/// DISTINCT, LIMIT, OFFSET or FETCH, a select list of columns and operators (no function,
/// which may be an aggregate or a window), and a FROM of the same kind.
fn row_by_row(q: &Query, placed: &Placement) -> bool {
    let SetExpr::Select(select) = q.body.as_ref() else {
        return false;
    };
    q.with.is_none()
        && q.limit_clause.is_none()
        && q.fetch.is_none()
        && select.distinct.is_none()
        && select.having.is_none()
        && select.qualify.is_none()
        && select.named_window.is_empty()
        && matches!(&select.group_by, GroupByExpr::Expressions(g, m) if g.is_empty() && m.is_empty())
        && select
            .projection
            .iter()
            .all(|i| item_expr(i).is_none_or(|e| matches!(classify(e), Ok(Item::Plain))))
        && !select.from.iter().any(|t| from_derived(t, placed))
}

/// Whether a FROM item or one it joins is [`derived`].
fn from_derived(t: &sqlparser::ast::TableWithJoins, placed: &Placement) -> bool {
    derived(&t.relation, placed) || t.joins.iter().any(|j| derived(&j.relation, placed))
}

/// A subquery whose rows are groups that each live whole on one shard ([`whole_groups`]),
/// without WITH, LIMIT, OFFSET or FETCH (which would cut across the shards' groups).
fn whole_groups_query(q: &Query, placed: &Placement) -> bool {
    let SetExpr::Select(select) = q.body.as_ref() else {
        return false;
    };
    q.with.is_none()
        && q.limit_clause.is_none()
        && q.fetch.is_none()
        && whole_groups(select, placed)
}

/// A SELECT whose rows are groups that each live whole on one shard: grouped by the sharding key
/// (GROUP BY or DISTINCT ON), without plain DISTINCT (two shards' groups may give equal rows) or
/// window functions (a window spans the groups of every shard). Each shard gives its groups
/// exactly as one Postgres would (aggregates of any kind, HAVING), and no group comes from two
/// shards.
fn whole_groups(select: &sqlparser::ast::Select, placed: &Placement) -> bool {
    placed.whole_groups.iter().any(|g| std::ptr::eq(*g, select))
        && !matches!(select.distinct, Some(Distinct::Distinct))
        && select.qualify.is_none()
        && select.named_window.is_empty()
        && !windows_or_subqueries(select)
        && !select.from.iter().any(|t| from_derived(t, placed))
}

/// Whether a window function or a subquery appears in the select list, HAVING or the ORDER BY
/// of `select`.
fn windows_or_subqueries(select: &sqlparser::ast::Select) -> bool {
    let found = |e: &Expr| {
        visit_expressions(e, |e| match e {
            Expr::Function(f) if f.over.is_some() => ControlFlow::Break(()),
            Expr::Subquery(_)
            | Expr::Exists { .. }
            | Expr::In {
                target: sqlparser::ast::InTarget::Subquery(_),
                ..
            } => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
        .is_break()
    };
    select.projection.iter().filter_map(item_expr).any(found)
        || select.having.as_ref().is_some_and(found)
}

const COLLATE: &str = "COLLATE in a sorted or grouped read across shards is not supported (the router compares text by bytes, as the C collation does)";

/// Rows that are final as their shard gives them, in the order ORDER BY asks: concatenated, or
/// merged as sorted streams (LIMIT applied by each shard and after the merge, OFFSET after it).
fn rows_in_order(
    q: &Query,
    projection: &[SelectItem],
    limit: Option<KeySource>,
    offset: Option<KeySource>,
) -> Result<Merge, &'static str> {
    let (order, order_names) = order_keys(q, projection)?;
    if !order.is_empty() && projection.iter().any(has_collate) {
        return Err(COLLATE);
    }
    if order.is_empty() && offset.is_none() {
        return Ok(Merge::Concat { limit });
    }
    let rewrite = offset.is_some();
    Ok(Merge::Combine(Arc::new(MergePlan {
        group: None,
        order,
        order_names,
        limit,
        offset,
        avg_names: Vec::new(),
        rewrite,
    })))
}

/// The merge of a query read on several shards, or why it cannot be merged.
pub(super) fn merge_of_query(q: &Query, placed: &Placement) -> Result<Merge, &'static str> {
    if q.with.is_some() {
        return Err("WITH is not supported across shards");
    }
    if q.fetch.is_some() || !q.locks.is_empty() || q.for_clause.is_some() {
        return Err("FETCH, FOR UPDATE/SHARE and FOR clauses are not supported across shards");
    }
    let (limit, offset) = limit_offset(q)?;
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Err("UNION, INTERSECT, EXCEPT and VALUES are not supported across shards");
    };
    if select.top.is_some() || select.into.is_some() {
        return Err("TOP and SELECT INTO are not supported across shards");
    }
    // Each shard would run the subquery over its own rows only: its groups, DISTINCT, LIMIT or
    // windows would be per shard, and the merge cannot put them together again.
    if select.from.iter().any(|t| from_derived(t, placed)) {
        return Err("a subquery in FROM is not supported across shards");
    }
    if whole_groups(select, placed) {
        return rows_in_order(q, &select.projection, limit, offset);
    }
    if select.having.is_some() {
        return Err("HAVING across shards is not supported");
    }
    if !select.named_window.is_empty() || select.qualify.is_some() {
        return Err("window functions are not supported across shards");
    }
    let group_by: &[Expr] = match &select.group_by {
        GroupByExpr::Expressions(e, m) if m.is_empty() => e,
        _ => return Err("GROUP BY ALL and grouping modifiers are not supported across shards"),
    };
    let distinct = match &select.distinct {
        None | Some(Distinct::All) => false,
        Some(Distinct::Distinct) => true,
        Some(Distinct::On(_)) => return Err("DISTINCT ON is not supported across shards"),
    };
    let mut items = Vec::with_capacity(select.projection.len());
    for item in &select.projection {
        let Some(expr) = item_expr(item) else {
            // `*` or `t.*`: plain columns.
            items.push(Item::Plain);
            continue;
        };
        let over_keys = placed.distinct_keys.iter().any(|e| std::ptr::eq(*e, expr));
        items.push(match plain_aggregate(expr) {
            None if over_keys => distinct_key_aggregate(expr),
            None if count_distinct_arg(expr).is_some() => Item::CountDistinct,
            None => match arith_item(expr) {
                Some(item) => item,
                None => classify(expr)?,
            },
            _ => classify(expr)?,
        });
    }
    let aggregated = items.iter().any(|i| {
        matches!(
            i,
            Item::Agg(_) | Item::Avg | Item::Dispersion(_) | Item::CountDistinct | Item::Arith(..)
        )
    });
    let grouped = aggregated || distinct || !group_by.is_empty();
    if !grouped {
        if items.iter().any(|i| matches!(i, Item::Function)) {
            return Err("a function in the select list (only plain columns and the aggregates count/sum/min/max/avg are supported across shards)");
        }
        return rows_in_order(q, &select.projection, limit, offset);
    }
    let (order, order_names) = order_keys(q, &select.projection)?;
    if select.projection.iter().any(has_collate) {
        return Err(COLLATE);
    }

    if select.projection.iter().any(|i| {
        !matches!(
            i,
            SelectItem::UnnamedExpr(_) | SelectItem::ExprWithAlias { .. }
        )
    }) {
        return Err("`*` with GROUP BY, DISTINCT or aggregates is not supported across shards: name the columns");
    }
    if distinct && aggregated {
        return Err("DISTINCT with aggregates is not supported across shards");
    }
    // Every GROUP BY expression must be a column of the answer: the router groups by those.
    let mut is_group_key = vec![distinct; items.len()];
    for g in group_by {
        // In GROUP BY a bare name means an input column before an output alias (the other way
        // round from ORDER BY): `SELECT lower(v) AS v ... GROUP BY v` groups by the column v.
        // The router cannot see the input columns, so an alias that is not the very same
        // column is ambiguous to it.
        if let Expr::Identifier(name) = g {
            let aliased = select.projection.iter().any(|item| {
                matches!(item, SelectItem::ExprWithAlias { alias, expr }
                    if super::pins::fold(alias) == super::pins::fold(name)
                        && !matches!(expr, Expr::Identifier(i) if super::pins::fold(i) == super::pins::fold(name)))
            });
            if aliased {
                return Err("GROUP BY an output alias across shards is ambiguous (Postgres prefers an input column of that name): group by the expression or its position");
            }
        }
        let i = output_column(g, &select.projection)
            .ok_or("GROUP BY across shards must group by columns of the select list")?;
        is_group_key[i] = true;
    }
    let (out, avg_names) = grouped_outputs(&items, &select.projection, &is_group_key)?;
    let rewrite = !avg_names.is_empty() || !order.is_empty() || limit.is_some() || offset.is_some();
    if !order_names.is_empty() {
        return Err("ORDER BY across shards must sort by columns of the select list");
    }
    Ok(Merge::Combine(Arc::new(MergePlan {
        group: Some(out),
        order,
        order_names: Vec::new(),
        limit,
        offset,
        avg_names,
        rewrite,
    })))
}

/// Whether ORDER BY or GROUP BY of a query holds a `$n`: in a normalized text that may be a
/// column position (`ORDER BY 1`) or part of an expression of the select list, which the plan
/// must see as the client wrote it.
pub(crate) fn positions_normalized(stmt: &Statement) -> bool {
    let q = match stmt {
        Statement::Declare { stmts, .. } => {
            match stmts.first().and_then(|d| d.for_query.as_deref()) {
                Some(q) => q,
                None => return false,
            }
        }
        _ => match the_query(stmt) {
            Ok(q) => q,
            Err(_) => return false,
        },
    };
    // Anywhere inside, too: `GROUP BY n % 3` must match `n % 3` in the select list, and the two
    // 3s are different `$n`s once normalized.
    let is_param = |e: &Expr| {
        visit_expressions(e, |x| match x {
            Expr::Value(v) if matches!(v.value, Value::Placeholder(_)) => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
        .is_break()
    };
    let in_order = matches!(&q.order_by, Some(o) if matches!(&o.kind,
        OrderByKind::Expressions(list) if list.iter().any(|o| is_param(&o.expr))));
    let in_group = matches!(q.body.as_ref(), SetExpr::Select(s)
        if matches!(&s.group_by, GroupByExpr::Expressions(e, _) if e.iter().any(is_param)));
    in_order || in_group
}

fn has_collate(item: &SelectItem) -> bool {
    item_expr(item).is_some_and(|e| {
        visit_expressions(e, |x| match x {
            Expr::Collate { .. } => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
        .is_break()
    })
}

fn classify(expr: &Expr) -> Result<Item, &'static str> {
    if let Some(op) = plain_aggregate(expr) {
        return Ok(op);
    }
    let mut calls = false;
    let found = visit_expressions(expr, |e| match e {
        // Each shard's window would see only its own rows (also as a DISTINCT or group key).
        Expr::Function(f) if f.over.is_some() => {
            ControlFlow::Break("window functions are not supported across shards")
        }
        Expr::Function(_) => {
            calls = true;
            ControlFlow::Continue(())
        }
        Expr::Subquery(_)
        | Expr::Exists { .. }
        | Expr::In {
            target: sqlparser::ast::InTarget::Subquery(_),
            ..
        } => ControlFlow::Break("a subquery in the select list is not supported across shards"),
        _ => ControlFlow::Continue(()),
    });
    match found {
        ControlFlow::Break(why) => Err(why),
        ControlFlow::Continue(()) if calls => Ok(Item::Function),
        ControlFlow::Continue(()) => Ok(Item::Plain),
    }
}

pub(super) fn item_expr(item: &SelectItem) -> Option<&Expr> {
    match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
        _ => None,
    }
}

/// The select-list column an expression of GROUP BY or ORDER BY means: a 1-based position, an
/// output name, or the same expression as an item.
fn output_column(e: &Expr, projection: &[SelectItem]) -> Option<usize> {
    if let Expr::Value(v) = e {
        if let Value::Number(n, _) = &v.value {
            let n: usize = n.parse().ok()?;
            return (1..=projection.len()).contains(&n).then(|| n - 1);
        }
    }
    if let Expr::Identifier(ident) = e {
        let by_alias = projection.iter().position(|item| {
            matches!(item, SelectItem::ExprWithAlias { alias, .. }
                if super::pins::fold(alias) == super::pins::fold(ident))
        });
        if by_alias.is_some() {
            return by_alias;
        }
    }
    projection
        .iter()
        .position(|item| item_expr(item) == Some(e))
}

type OrderKeys = (Vec<SortKey>, Vec<(usize, String)>);

fn order_keys(q: &Query, projection: &[SelectItem]) -> Result<OrderKeys, &'static str> {
    let Some(order_by) = &q.order_by else {
        return Ok((Vec::new(), Vec::new()));
    };
    let OrderByKind::Expressions(list) = &order_by.kind else {
        return Err("ORDER BY ALL is not supported across shards");
    };
    let wildcard = projection.iter().any(|i| {
        matches!(
            i,
            SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
        )
    });
    let mut keys = Vec::with_capacity(list.len());
    let mut by_name = Vec::new();
    for o in list {
        if o.with_fill.is_some() {
            return Err("ORDER BY ... WITH FILL is not supported");
        }
        let descending = match &o.options.sort {
            None | Some(OrderBySort::Asc) => false,
            Some(OrderBySort::Desc) => true,
            Some(OrderBySort::Using(_)) => {
                return Err("ORDER BY ... USING is not supported across shards")
            }
        };
        let position = match &o.expr {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => n.parse::<usize>().ok().filter(|&n| n > 0),
                _ => None,
            },
            _ => None,
        };
        let column = match output_column(&o.expr, projection) {
            // With a `*` an item's index is not its column: only positions (which count output
            // columns) and names (resolved against the shards' answer) are known.
            Some(c) if !wildcard => c,
            _ if wildcard && position.is_some() => position.unwrap_or(1) - 1,
            // `SELECT * ... ORDER BY v`: the answer's column named v, once the shards say
            // which columns `*` has.
            _ if wildcard => {
                let name = match &o.expr {
                    Expr::Identifier(i) => super::pins::fold(i),
                    // `t.col` may be another relation's column than the `*` one of that name.
                    _ => {
                        return Err(
                            "ORDER BY across shards must sort by columns of the select list",
                        )
                    }
                };
                by_name.push((keys.len(), name));
                0
            }
            _ => return Err("ORDER BY across shards must sort by columns of the select list"),
        };
        keys.push(SortKey {
            column,
            descending,
            nulls_first: o.options.nulls_first.unwrap_or(descending),
        });
    }
    Ok((keys, by_name))
}

fn limit_offset(q: &Query) -> Result<(Option<KeySource>, Option<KeySource>), &'static str> {
    match &q.limit_clause {
        None => Ok((None, None)),
        Some(LimitClause::LimitOffset {
            limit,
            offset,
            limit_by,
        }) if limit_by.is_empty() => {
            let limit = match limit {
                None => None,
                Some(Expr::Value(v)) if matches!(v.value, Value::Null) => None,
                Some(e) => Some(count_source(e).ok_or("LIMIT must be a number or a parameter")?),
            };
            let offset = match offset {
                None => None,
                Some(o) => {
                    Some(count_source(&o.value).ok_or("OFFSET must be a number or a parameter")?)
                }
            };
            Ok((limit, offset))
        }
        Some(_) => Err("this LIMIT form is not supported across shards"),
    }
}

fn count_source(e: &Expr) -> Option<KeySource> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => Some(KeySource::Literal(n.clone())),
            Value::Placeholder(p) => p
                .strip_prefix('$')?
                .parse::<usize>()
                .ok()?
                .checked_sub(1)
                .map(KeySource::Param),
            _ => None,
        },
        // `LIMIT $3::integer`, as SQLAlchemy writes it: the cast changes nothing of the count.
        Expr::Cast { expr, .. } | Expr::Nested(expr) => count_source(expr),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::variance::Dispersion;
    use crate::merge::AggOp;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn plan(sql: &str) -> Result<Merge, &'static str> {
        let stmt = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("sql");
        merge_for(&stmt[0], &Placement::default())
    }

    fn combine(sql: &str) -> MergePlan {
        match plan(sql) {
            Ok(Merge::Combine(p)) => (*p).clone(),
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn shapes() {
        assert_eq!(
            plan("SELECT id, v FROM t LIMIT 3"),
            Ok(Merge::Concat {
                limit: Some(KeySource::Literal("3".into()))
            })
        );
        let p = combine("SELECT id, v FROM t ORDER BY v DESC, 1 LIMIT $1 OFFSET 2");
        assert_eq!(p.group, None);
        assert_eq!(
            p.order,
            [
                SortKey {
                    column: 1,
                    descending: true,
                    nulls_first: true
                },
                SortKey {
                    column: 0,
                    descending: false,
                    nulls_first: false
                }
            ]
        );
        assert_eq!(p.limit, Some(KeySource::Param(0)));
        assert!(p.rewrite);
        let p =
            combine("SELECT k, count(*), avg(n) AS mean, max(n) FROM t GROUP BY k ORDER BY mean");
        assert_eq!(
            p.group,
            Some(vec![
                Out::Key(0),
                Out::Agg {
                    op: AggOp::Count,
                    column: 1
                },
                Out::Avg { sum: 2, count: 3 },
                Out::Agg {
                    op: AggOp::Max,
                    column: 4
                }
            ])
        );
        assert_eq!(p.order[0].column, 2);
        assert_eq!(p.avg_names, ["mean"]);
        let p = combine("SELECT k, stddev(n) AS s, var_pop(n) FROM t GROUP BY k");
        assert_eq!(
            p.group.as_deref(),
            Some(
                &[
                    Out::Key(0),
                    Out::Dispersion {
                        kind: Dispersion::StddevSamp,
                        count: 1,
                        sum: 2,
                        squares: 3
                    },
                    Out::Dispersion {
                        kind: Dispersion::VarPop,
                        count: 4,
                        sum: 5,
                        squares: 6
                    },
                ][..]
            )
        );
        assert_eq!(p.avg_names, ["s", "var_pop"]);
        assert!(p.rewrite);
        // FILTER and DISTINCT would need to reach each part: refused.
        assert!(plan("SELECT stddev(n) FILTER (WHERE n > 1) FROM t").is_err());
        assert!(plan("SELECT variance(DISTINCT n) FROM t").is_err());
        let p = combine("SELECT count(*), sum(n) FROM t");
        assert!(!p.rewrite);
        let p = combine("SELECT DISTINCT v FROM t");
        assert_eq!(p.group, Some(vec![Out::Key(0)]));
        let p = combine("SELECT lower(v), count(*) FROM t GROUP BY lower(v)");
        assert_eq!(p.group.as_ref().map(|g| g[0].clone()), Some(Out::Key(0)));
        for refused in [
            "SELECT k, count(*) FROM t GROUP BY k HAVING count(*) > 1",
            "SELECT count(*) FROM t GROUP BY k",
            "SELECT k, string_agg(v, ',') FROM t GROUP BY k",
            "SELECT id FROM t ORDER BY v",
            "SELECT DISTINCT ON (v) v FROM t",
            "SELECT lower(v) FROM t",
            "SELECT count(DISTINCT v) FILTER (WHERE v > 'a') FROM t",
            "SELECT * FROM t GROUP BY id",
            // Postgres groups by an input column v here, not by the alias.
            "SELECT lower(v) AS v, count(*) FROM t GROUP BY v",
            "SELECT v COLLATE \"de_DE\" AS w FROM t ORDER BY w",
            "SELECT u.* FROM t JOIN u ON t.id = u.id ORDER BY t.created",
        ] {
            assert!(plan(refused).is_err(), "{refused}");
        }
    }
}
