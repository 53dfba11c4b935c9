//! Which sharded tables of one SELECT the query joins by equal keys: `a.key = b.key` in WHERE
//! or an inner join's ON, or an inner join `USING` the key column. Tables of the same key type
//! whose keys are equal live on the same shard row by row, so a key that pins one pins the
//! others, and a join of them all without any key runs on every shard with each joined row
//! made on exactly one shard (what a read of one table across shards is). Pure.

use sqlparser::ast::{
    BinaryOperator, Expr, JoinConstraint, JoinOperator, TableFactor, TableWithJoins,
};

use super::pins::{fold, is_key_column, name_parts, ScopeRel};

/// Pairs of `scope` indices whose keys the query makes equal; marks the tables whose key an
/// inner join `USING` merges (an unqualified name then means all of them).
pub(crate) fn equal_keys(
    scope: &mut [ScopeRel<'_>],
    conds: &[&Expr],
    from: &[TableWithJoins],
) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for c in conds {
        let Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = strip(c)
        else {
            continue;
        };
        for a in 0..scope.len() {
            for b in 0..scope.len() {
                if a != b
                    && same_type(scope, a, b)
                    && is_key_column(left, scope, a)
                    && is_key_column(right, scope, b)
                {
                    pairs.push((a, b));
                }
            }
        }
    }
    for twj in from {
        let mut before: Vec<usize> = index_of(scope, &twj.relation).into_iter().collect();
        for join in &twj.joins {
            let Some(r) = index_of(scope, &join.relation) else {
                continue;
            };
            if let JoinOperator::Join(JoinConstraint::Using(cols))
            | JoinOperator::Inner(JoinConstraint::Using(cols)) = &join.join_operator
            {
                let named = |key: &str| {
                    cols.iter().any(|c| {
                        name_parts(c).and_then(|p| p.last().cloned()).as_deref() == Some(key)
                    })
                };
                if named(&scope[r].table.key) {
                    for &e in &before {
                        if scope[e].table.key == scope[r].table.key && same_type(scope, e, r) {
                            pairs.push((e, r));
                            scope[e].merged = true;
                            scope[r].merged = true;
                        }
                    }
                }
            }
            before.push(r);
        }
    }
    pairs
}

/// Whether `pairs` join all `n` tables into one (and there are at least two).
pub(crate) fn connected(n: usize, pairs: &[(usize, usize)]) -> bool {
    if n < 2 {
        return false;
    }
    let mut reached = vec![false; n];
    reached[0] = true;
    let mut changed = true;
    while changed {
        changed = false;
        for &(a, b) in pairs {
            if reached[a] != reached[b] {
                reached[a] = true;
                reached[b] = true;
                changed = true;
            }
        }
    }
    reached.iter().all(|&r| r)
}

fn same_type(scope: &[ScopeRel<'_>], a: usize, b: usize) -> bool {
    scope[a].table.key_type == scope[b].table.key_type
}

fn strip(e: &Expr) -> &Expr {
    match e {
        Expr::Nested(inner) => strip(inner),
        other => other,
    }
}

/// The scope entry of a table named in FROM (by its alias, else its name).
fn index_of(scope: &[ScopeRel<'_>], factor: &TableFactor) -> Option<usize> {
    let TableFactor::Table { name, alias, .. } = factor else {
        return None;
    };
    let parts = name_parts(name)?;
    let table = parts.last()?;
    let alias = alias.as_ref().map(|a| fold(&a.name));
    scope
        .iter()
        .position(|r| r.alias == alias && (alias.is_some() || r.name == *table))
}
