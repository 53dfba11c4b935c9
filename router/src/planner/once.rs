//! Whether a read run on several shards makes each answer row on exactly one of them.
//!
//! The rows of a sharded table are split among the shards; everything else a shard reads
//! (reference tables, VALUES, table functions, constants) is the same on every shard. A query
//! whose rows come from a sharded table (filtered, or joined to anything) makes each row on the
//! shard of its sharded row, so the shards' answers add up to Postgres's. A query whose rows come
//! only from what every shard has (the sharded table only in a subquery of its WHERE, or a
//! reference table kept by an outer join without a sharded row) makes the same row on every
//! shard: such a read is refused. The merge rules of [`super::scatter`] decide the rest. Pure.

use sqlparser::ast::{JoinOperator, ObjectName, Query, SetExpr, TableFactor, TableWithJoins};

/// Why `q`, run on several shards, would give some rows more than once (`Ok` when it would not).
/// `sharded` says whether a table name in FROM is a sharded table's.
pub(crate) fn each_row_once(
    q: &Query,
    sharded: &dyn Fn(&ObjectName) -> bool,
) -> Result<(), &'static str> {
    // Set operations and VALUES are refused by the merge rules before they get here.
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Ok(());
    };
    if from_sharded(&select.from, sharded)? {
        Ok(())
    } else {
        Err("its rows come only from tables that every shard has whole (the sharded table is only in a subquery), so every shard would answer them")
    }
}

/// Whether the rows of a FROM list come from a sharded table (the items are cross-joined).
fn from_sharded(
    from: &[TableWithJoins],
    sharded: &dyn Fn(&ObjectName) -> bool,
) -> Result<bool, &'static str> {
    let mut any = false;
    for twj in from {
        any |= joined(twj, sharded)?;
    }
    Ok(any)
}

/// Whether the rows of one join tree come from a sharded table, or why they come twice.
fn joined(
    twj: &TableWithJoins,
    sharded: &dyn Fn(&ObjectName) -> bool,
) -> Result<bool, &'static str> {
    let mut left = factor(&twj.relation, sharded)?;
    for join in &twj.joins {
        let right = factor(&join.relation, sharded)?;
        let (keeps_left, keeps_right) = match &join.join_operator {
            JoinOperator::Left(_) | JoinOperator::LeftOuter(_) | JoinOperator::OuterApply => {
                (true, false)
            }
            JoinOperator::Right(_) | JoinOperator::RightOuter(_) => (false, true),
            JoinOperator::FullOuter(_) => (true, true),
            _ => (false, false),
        };
        if (keeps_left && !left) || (keeps_right && !right) {
            return Err("an outer join keeps rows of a table that every shard has whole (a reference table, VALUES, a function) where no sharded row matches, so every shard would answer them: put the sharded table on the kept side, or use an inner join");
        }
        left |= right;
    }
    Ok(left)
}

fn factor(f: &TableFactor, sharded: &dyn Fn(&ObjectName) -> bool) -> Result<bool, &'static str> {
    match f {
        TableFactor::Table {
            name, args: None, ..
        } => Ok(sharded(name)),
        TableFactor::Derived { subquery, .. } => match subquery.body.as_ref() {
            SetExpr::Select(s) => from_sharded(&s.from, sharded),
            _ => Ok(false),
        },
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => joined(table_with_joins, sharded),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::ast::Statement;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn check(sql: &str) -> Result<(), &'static str> {
        let stmt = Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0);
        let Statement::Query(q) = stmt else {
            panic!("not a query: {sql}")
        };
        let sharded = |n: &ObjectName| n.to_string() == "orders";
        each_row_once(&q, &sharded)
    }

    #[test]
    fn rows_of_a_sharded_table_joined_to_anything_come_once() {
        for sql in [
            "SELECT * FROM orders",
            "SELECT * FROM orders o JOIN regions r ON r.code = o.region",
            "SELECT * FROM regions r JOIN orders o ON r.code = o.region",
            "SELECT * FROM regions r, orders o WHERE r.code = o.region",
            "SELECT * FROM orders o LEFT JOIN regions r ON r.code = o.region",
            "SELECT * FROM regions r RIGHT JOIN orders o ON r.code = o.region",
            "SELECT * FROM (SELECT * FROM orders) o LEFT JOIN regions r ON true",
            "SELECT * FROM (orders o JOIN regions r ON true) LEFT JOIN regions s ON true",
            "SELECT * FROM orders o WHERE o.region IN (SELECT code FROM regions)",
        ] {
            assert_eq!(check(sql), Ok(()), "{sql}");
        }
    }

    #[test]
    fn rows_every_shard_has_would_come_from_every_shard() {
        for sql in [
            "SELECT 1 WHERE EXISTS (SELECT 1 FROM orders)",
            "SELECT * FROM regions r WHERE r.code IN (SELECT region FROM orders)",
            "SELECT * FROM (SELECT 1 AS a) s WHERE a IN (SELECT qty FROM orders)",
            "SELECT * FROM regions r LEFT JOIN orders o ON r.code = o.region",
            "SELECT * FROM orders o RIGHT JOIN regions r ON r.code = o.region",
            "SELECT * FROM orders o FULL JOIN regions r ON r.code = o.region",
            "SELECT * FROM generate_series(1, 3) g LEFT JOIN orders o ON o.qty = g",
        ] {
            assert!(check(sql).is_err(), "{sql}");
        }
    }
}
