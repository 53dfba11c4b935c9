//! The text the shards run for a read the router merges, when it is not the client's own:
//! `avg(x)` asked as `sum(x), count(x)` and ORDER BY, LIMIT and OFFSET left to the router when it
//! combines groups; `LIMIT limit + offset` without OFFSET when it merges sorted rows
//! ([`super::scatter::MergePlan::rewrite`]). Pure.

use sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, GroupByExpr,
    LimitClause, Offset, OffsetRows, SelectItem, SetExpr, Statement, Value,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::aggregates::{arith_of, count_distinct_arg, plain_aggregate, Item};
use super::scatter::item_expr;
use crate::merge::Out;

/// Whether the parser's printing of `sql` (which the rewritten texts are made of) means what
/// `sql` means: not when it holds a construct sqlparser reads or prints otherwise than
/// Postgres: the postfix `ISNULL` (read as a column alias: `v ISNULL` printed `v AS ISNULL`),
/// and `INTERVAL (p) '...'` (printed without its precision).
pub(super) fn displays_as_written(sql: &str) -> Result<(), &'static str> {
    let tokens = sqlparser::tokenizer::Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize()
        .map_err(|_| "the statement does not parse")?;
    let significant = tokens
        .iter()
        .filter(|t| !matches!(t, sqlparser::tokenizer::Token::Whitespace(_)));
    use sqlparser::tokenizer::Token;
    let word = |t: &Token, name: &str| matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(name));
    // The literal `INTERVAL (p) '...'`, not the type in a cast (`::interval(p)`, `AS
    // interval(p)`), which prints as written.
    let (mut before, mut interval) = (None::<&Token>, false);
    for t in significant {
        if word(t, "isnull") {
            return Err("ISNULL would be rewritten wrongly: write IS NULL");
        }
        if interval && matches!(t, Token::LParen) {
            return Err("INTERVAL (p) '...' would be rewritten wrongly: write '...'::interval(p)");
        }
        interval = word(t, "interval")
            && !before.is_some_and(|b| matches!(b, Token::DoubleColon) || word(b, "as"));
        before = Some(t);
    }
    Ok(())
}

/// The text the shards run for a [`MergePlan`] with `rewrite`, made from the client's own text
/// (not the normalized one: its literals must stay literals). When the router combines the
/// shards' groups (`grouped`), each `avg(x)` becomes `sum(x), count(x)` and the query loses
/// ORDER BY, LIMIT and OFFSET (the router applies them after combining); otherwise the shards'
/// rows are final (groups whole on one shard too), and each shard is asked for
/// `LIMIT limit + offset` sorted rows without OFFSET. Parameters keep their place and type (`$n::bigint`), so the statement's
/// parameter types do not change.
pub fn shard_sql(sql: &str, group: Option<&[Out]>) -> Result<String, &'static str> {
    displays_as_written(sql)?;
    let grouped = group.is_some();
    let mut stmts = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|_| "the statement does not parse")?;
    let [stmt] = stmts.as_mut_slice() else {
        return Err("one statement expected");
    };
    let Statement::Query(q) = stmt else {
        return Err("only SELECT is rewritten");
    };
    let (limit, offset) = match q.limit_clause.take() {
        None => (None, None),
        Some(LimitClause::LimitOffset { limit, offset, .. }) => (limit, offset.map(|o| o.value)),
        Some(_) => return Err("this LIMIT form is not supported across shards"),
    };
    let SetExpr::Select(select) = q.body.as_mut() else {
        return Err("only a plain SELECT is rewritten");
    };
    // A parameter kept in place with its type, its value unused.
    let typed = |e: Expr| -> Expr {
        let text = format!("0 * ({e})::bigint");
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&text)
            .and_then(|mut p| p.parse_expr())
            .unwrap_or(e)
    };
    let parse = |text: String| -> Result<Expr, &'static str> {
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&text)
            .and_then(|mut p| p.parse_expr())
            .map_err(|_| "internal: a rewritten LIMIT does not parse")
    };
    let is_param =
        |e: &Expr| matches!(e, Expr::Value(v) if matches!(v.value, Value::Placeholder(_)));
    let (new_limit, new_offset) = if grouped {
        // Positions in GROUP BY count the client's columns, which the avg expansion below
        // shifts: name the expressions instead.
        if let GroupByExpr::Expressions(exprs, _) = &mut select.group_by {
            for g in exprs.iter_mut() {
                let position = match &*g {
                    Expr::Value(v) => match &v.value {
                        Value::Number(n, _) => n.parse::<usize>().ok(),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(item) = position
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|i| select.projection.get(i))
                    .and_then(item_expr)
                {
                    *g = item.clone();
                }
            }
        }
        let mut projection = Vec::with_capacity(select.projection.len() + 2);
        let mut group_too = Vec::new();
        for (i, item) in select.projection.drain(..).enumerate() {
            // agg1 op agg2: the shards send both aggregates, the router computes.
            if let Some(Out::Arith { .. }) = group.and_then(|g| g.get(i)) {
                let (_, l, r) = item_expr(&item)
                    .and_then(arith_of)
                    .ok_or("internal: arithmetic not where the plan has it")?;
                projection.push(SelectItem::UnnamedExpr(l.clone()));
                projection.push(SelectItem::UnnamedExpr(r.clone()));
                continue;
            }
            // count(DISTINCT x): the shards send each group's distinct x, grouping by it too.
            if let Some(Out::CountDistinct { .. }) = group.and_then(|g| g.get(i)) {
                let x = item_expr(&item)
                    .and_then(count_distinct_arg)
                    .ok_or("internal: count(DISTINCT) not where the plan has it")?;
                projection.push(SelectItem::UnnamedExpr(x.clone()));
                group_too.push(x.clone());
                continue;
            }
            // The shard columns the router computes avg and variance from.
            let parts = item_expr(&item).and_then(|e| match (plain_aggregate(e), e) {
                (Some(Item::Avg), Expr::Function(f)) => Some((f, &["sum({x})", "count({x})"][..])),
                (Some(Item::Dispersion(_)), Expr::Function(f)) => Some((
                    f,
                    &[
                        "count({x})",
                        "sum({x})",
                        "sum(({x})::numeric * ({x})::numeric)",
                    ][..],
                )),
                _ => None,
            });
            let arg = parts.and_then(|(f, parts)| match &f.args {
                FunctionArguments::List(FunctionArgumentList { args, .. }) => match args.first() {
                    Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(x))) => Some((x, parts)),
                    _ => None,
                },
                _ => None,
            });
            match arg {
                Some((x, parts)) => {
                    for part in parts {
                        let text = part.replace("{x}", &x.to_string());
                        projection.push(SelectItem::UnnamedExpr(parse(text)?));
                    }
                }
                None => projection.push(item),
            }
        }
        select.projection = projection;
        if let GroupByExpr::Expressions(exprs, _) = &mut select.group_by {
            exprs.extend(group_too);
        }
        q.order_by = None;
        // No LIMIT/OFFSET on the shards; parameters stay referenced (and typed).
        let limit = match limit {
            Some(l) if is_param(&l) => Some(parse(format!("NULL::bigint + {}", typed(l)))?),
            _ => None,
        };
        let offset = match offset {
            Some(o) if is_param(&o) => Some(typed(o)),
            _ => None,
        };
        (limit, offset)
    } else {
        match (limit, offset) {
            (Some(l), Some(o)) => (Some(parse(format!("({l})::bigint + ({o})::bigint"))?), None),
            (None, Some(o)) if is_param(&o) => (None, Some(typed(o))),
            (l, _) => (l, None),
        }
    };
    if new_limit.is_some() || new_offset.is_some() {
        q.limit_clause = Some(LimitClause::LimitOffset {
            limit: new_limit,
            offset: new_offset.map(|value| Offset {
                value,
                rows: OffsetRows::None,
            }),
            limit_by: Vec::new(),
        });
    }
    Ok(stmt.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_text() {
        assert_eq!(
            shard_sql("SELECT k, avg(n) AS a, count(*) FROM t WHERE x = 'y' GROUP BY k ORDER BY 2 LIMIT 5", Some(&[])).unwrap(),
            "SELECT k, sum(n), count(n), count(*) FROM t WHERE x = 'y' GROUP BY k"
        );
        assert_eq!(
            shard_sql("SELECT id FROM t ORDER BY id LIMIT $1 OFFSET $2", None).unwrap(),
            "SELECT id FROM t ORDER BY id LIMIT ($1)::BIGINT + ($2)::BIGINT"
        );
        assert_eq!(
            shard_sql("SELECT k, sum(n) FROM t GROUP BY k LIMIT $1 OFFSET $2", Some(&[])).unwrap(),
            "SELECT k, sum(n) FROM t GROUP BY k LIMIT NULL::BIGINT + 0 * ($1)::BIGINT OFFSET 0 * ($2)::BIGINT"
        );
        // Positions in GROUP BY survive the avg expansion.
        assert_eq!(
            shard_sql("SELECT avg(v), k FROM t GROUP BY 2", Some(&[])).unwrap(),
            "SELECT sum(v), count(v), k FROM t GROUP BY k"
        );
        // count(DISTINCT x): the shards send x, grouped by it too.
        assert_eq!(
            shard_sql(
                "SELECT k, count(DISTINCT v), count(*) FROM t GROUP BY k",
                Some(&[
                    Out::Key(0),
                    Out::CountDistinct { column: 1 },
                    Out::Agg {
                        op: crate::merge::AggOp::Count,
                        column: 2
                    }
                ])
            )
            .unwrap(),
            "SELECT k, v, count(*) FROM t GROUP BY k, v"
        );
        // variance and stddev: count, sum and the sum of squares in numeric.
        assert_eq!(
            shard_sql("SELECT k, stddev(n) AS s FROM t GROUP BY k", Some(&[])).unwrap(),
            "SELECT k, count(n), sum(n), sum((n)::NUMERIC * (n)::NUMERIC) FROM t GROUP BY k"
        );
        assert_eq!(
            shard_sql("SELECT id FROM t ORDER BY id OFFSET 10", None).unwrap(),
            "SELECT id FROM t ORDER BY id"
        );
    }
}
