//! Which reads of a sharded table without a key can be answered from all shards, and how their
//! answers combine. Only shapes whose merge is exact are accepted: rows of a plain SELECT are
//! concatenated (a LIMIT without ORDER BY keeps the first N, which is as correct as Postgres's
//! own choice of N), and a lone `count(...)` is summed. Everything else is refused with the
//! reason, never answered wrongly: ORDER BY, OFFSET, DISTINCT, GROUP BY, HAVING, window
//! functions, any other function in the select list (it might be an aggregate), set operations.

use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_expressions, CopySource, CopyTarget, Expr, FunctionArg, FunctionArgExpr,
    FunctionArguments, GroupByExpr, LimitClause, Query, SelectItem, SetExpr, Statement, Value,
};

use super::KeySource;

/// How the shards' answers to a scattered read combine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Merge {
    /// All rows of all shards, in shard order; at most `limit` rows when there is a LIMIT.
    Concat { limit: Option<KeySource> },
    /// One row of aggregates (`count`, `sum`, `min`, `max`), merged column by column.
    Aggregate(Aggregates),
    /// Not a read: the VALUES rows of a multi-row INSERT, split by the shard of each row's key
    /// (the route's keys are one per row, in order).
    SplitRows,
    /// Not a read: an UPDATE or DELETE whose keys (`IN`, `= ANY`) fall on several shards, run
    /// on the shards of its keys, each in a transaction, all committed only if all succeeded;
    /// row counts summed, RETURNING rows concatenated.
    Write,
}

/// One aggregate of a select list, and how the shards' values of it combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggOp {
    /// `count(..)`: the sum of the counts.
    Count,
    /// `sum(..)`: the sum of the sums (NULL only if every shard's is NULL).
    Sum,
    /// `min(..)`: the smallest.
    Min,
    /// `max(..)`: the largest.
    Max,
}

/// The aggregates of a select list, in order (at most [`Aggregates::MAX`]); `Copy` so that a
/// routing decision carrying it stays small.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aggregates {
    ops: [AggOp; Aggregates::MAX],
    len: u8,
}

impl Aggregates {
    pub const MAX: usize = 8;

    pub fn ops(&self) -> &[AggOp] {
        &self.ops[..self.len as usize]
    }

    fn from_ops(list: &[AggOp]) -> Option<Aggregates> {
        if list.is_empty() || list.len() > Self::MAX {
            return None;
        }
        let mut ops = [AggOp::Count; Self::MAX];
        ops[..list.len()].copy_from_slice(list);
        Some(Aggregates {
            ops,
            len: list.len() as u8,
        })
    }
}

/// The merge for a statement, or why it cannot be scattered.
pub(crate) fn merge_for(stmt: &Statement) -> Result<Merge, &'static str> {
    let merge = merge_of_query(stmt)?;
    // COPY data is concatenated as it comes: no count to sum, no rows to stop at.
    if matches!(stmt, Statement::Copy { .. }) && merge != (Merge::Concat { limit: None }) {
        return Err("COPY of a count or a LIMIT across shards is not supported");
    }
    Ok(merge)
}

fn merge_of_query(stmt: &Statement) -> Result<Merge, &'static str> {
    let q: &Query = match stmt {
        Statement::Query(q) => q,
        // COPY (SELECT ...) TO STDOUT: the rows of the query, as COPY data.
        Statement::Copy {
            source: CopySource::Query(q),
            to: true,
            target: CopyTarget::Stdout,
            ..
        } => q,
        _ => return Err("only SELECT can read from all shards (writes need a key)"),
    };
    if q.with.is_some() {
        return Err("WITH is not supported across shards");
    }
    if q.order_by.is_some() {
        return Err("ORDER BY across shards is not supported yet");
    }
    if q.fetch.is_some() || !q.locks.is_empty() || q.for_clause.is_some() {
        return Err("FETCH, FOR UPDATE/SHARE and FOR clauses are not supported across shards");
    }
    let limit = match &q.limit_clause {
        None
        | Some(LimitClause::LimitOffset {
            limit: None,
            offset: None,
            ..
        }) => None,
        Some(LimitClause::LimitOffset {
            limit: Some(e),
            offset: None,
            limit_by,
        }) if limit_by.is_empty() => {
            Some(limit_source(e).ok_or("LIMIT must be a number or a parameter")?)
        }
        Some(_) => return Err("OFFSET across shards is not supported yet"),
    };
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Err("UNION, INTERSECT, EXCEPT and VALUES are not supported across shards");
    };
    if select.distinct.is_some() || select.top.is_some() || select.into.is_some() {
        return Err("DISTINCT is not supported across shards yet");
    }
    if !matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty())
        || select.having.is_some()
    {
        return Err("GROUP BY and HAVING across shards are not supported yet");
    }
    if !select.named_window.is_empty() || select.qualify.is_some() {
        return Err("window functions are not supported across shards");
    }
    let ops: Vec<Option<AggOp>> = select
        .projection
        .iter()
        .map(|i| item_expr(i).and_then(plain_aggregate))
        .collect();
    if ops.iter().any(Option::is_some) {
        let ops: Option<Vec<AggOp>> = ops.into_iter().collect();
        let Some(aggs) = ops.as_deref().and_then(Aggregates::from_ops) else {
            return Err("a select list across shards must be all plain columns, or all count/sum/min/max (at most 8)");
        };
        return if limit.is_none() {
            Ok(Merge::Aggregate(aggs))
        } else {
            Err("LIMIT with aggregates across shards is not supported")
        };
    }
    for item in &select.projection {
        let Some(expr) = item_expr(item) else {
            continue;
        };
        let found = visit_expressions(expr, |e| {
            match e {
            Expr::Function(_) => ControlFlow::Break("a function in the select list (only plain columns and a lone count() are supported across shards yet)"),
            Expr::Subquery(_) | Expr::Exists { .. } => {
                ControlFlow::Break("a subquery in the select list is not supported across shards")
            }
            _ => ControlFlow::Continue(()),
        }
        });
        if let ControlFlow::Break(why) = found {
            return Err(why);
        }
    }
    Ok(Merge::Concat { limit })
}

fn item_expr(item: &SelectItem) -> Option<&Expr> {
    match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
        _ => None,
    }
}

/// `count(*)`, `count(x)`, `sum(x)`, `min(x)`, `max(x)` (not DISTINCT, no FILTER, no OVER):
/// aggregates whose per-shard values combine exactly.
fn plain_aggregate(expr: &Expr) -> Option<AggOp> {
    let Expr::Function(f) = expr else {
        return None;
    };
    if f.name.0.len() != 1 || f.filter.is_some() || f.over.is_some() || !f.within_group.is_empty() {
        return None;
    }
    let op = match f.name.0.last()?.to_string().to_ascii_lowercase().as_str() {
        "count" => AggOp::Count,
        "sum" => AggOp::Sum,
        "min" => AggOp::Min,
        "max" => AggOp::Max,
        _ => return None,
    };
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let args_ok = match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] => op == AggOp::Count,
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(_))] => true,
        _ => false,
    };
    (list.duplicate_treatment.is_none() && list.clauses.is_empty() && args_ok).then_some(op)
}

fn limit_source(e: &Expr) -> Option<KeySource> {
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
        _ => None,
    }
}
