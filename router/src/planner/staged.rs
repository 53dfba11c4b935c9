//! Reads across shards that the merge engine cannot finish but one Postgres can, run in two
//! stages. The first stage is a part of the statement that the shards can answer together: a
//! subquery in FROM whose answer merges exactly ([`super::scatter`]), or the rows of the one
//! sharded table the statement reads, filtered by its WHERE. Its rows then take that part's
//! place in the statement (as array parameters, `crate::multishard::staged`), and one shard
//! runs the rest: windows, HAVING, DISTINCT ON, functions over aggregates, groups of groups,
//! whatever the merge refuses. Postgres
//! computes everything after the first stage, so the answer is its own; the price is that the
//! first stage's rows pass through the router (at most `limits.max_merge_bytes` of them).
//!
//! This module decides the shapes (on the normalized statement, by [`staged`]) and makes the
//! texts of both stages from the client's own text ([`texts`]); the session runs them and
//! `crate::multishard::staged` writes the rows into the second. Pure.

use std::ops::ControlFlow;
use std::sync::Arc;

use sqlparser::ast::{
    visit_expressions, visit_relations, Expr, ObjectName, Query, SetExpr, Statement, TableFactor,
    TableWithJoins,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::refs::{Refs, Rel};
use super::scatter::{Merge, Placement};

/// A read in two stages: `first` says how the shards' answers to the first stage merge, `part`
/// which part of the statement the first stage is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    pub first: Merge,
    pub part: Part,
}

/// The part of a statement that runs across shards first, by its place in the top-level FROM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// The subquery at `from` (the index of the FROM item) and `join` (`None`: the item's own
    /// relation, else the relation of that join), which holds every sharded table reference.
    Derived { from: usize, join: Option<usize> },
    /// The statement's one FROM item, a sharded table, filtered by the statement's WHERE:
    /// the `columns` the statement names (in table order), or all of them (`None`: a `*`, or
    /// the table's columns not known).
    Table { columns: Option<Vec<String>> },
}

/// The texts of a read in two stages, from the client's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedTexts {
    /// What the shards run first (before any rewrite the merge asks for).
    pub first: String,
    /// The statement around the first stage's place: `before` + the rows + `after`.
    pub before: String,
    pub after: String,
    /// The name the rows go by, as SQL writes it (the subquery's alias, or the table's).
    pub alias: String,
    /// Names the statement gives the first stage's columns (a subquery alias's column list);
    /// columns past these keep the first stage's own names.
    pub columns: Vec<String>,
}

/// The stand-in for the first stage's place while the second stage's text is made.
const PLACE: &str = "shardgate_first_stage_rows";

/// Columns the first stage's rows do not have, and that the second stage would then read from
/// somewhere else or not at all.
const SYSTEM_COLUMNS: [&str; 6] = ["ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"];

/// The two-stage plan of a read that the merge refused (`why`), or why there is none.
pub(super) fn staged(
    stmt: &Statement,
    refs: &Refs<'_>,
    placed: &Placement,
    why: &'static str,
) -> Result<Merge, &'static str> {
    let Statement::Query(q) = stmt else {
        return Err(why);
    };
    if refs.calls_functions || refs.select_into || !refs.unsharded.is_empty() {
        return Err(why);
    }
    if q.with.is_some() || !q.locks.is_empty() || q.for_clause.is_some() {
        return Err(why);
    }
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Err(why);
    };
    let sharded = |name: &ObjectName| matches!(refs.classify(name), Rel::Sharded(_));
    let total = count_sharded(q, &sharded);
    if mentions_system_column(q) {
        return Err(why);
    }
    for (from, twj) in select.from.iter().enumerate() {
        let relations = std::iter::once((None, &twj.relation)).chain(
            twj.joins
                .iter()
                .enumerate()
                .map(|(i, j)| (Some(i), &j.relation)),
        );
        for (join, factor) in relations {
            let TableFactor::Derived {
                lateral: false,
                subquery,
                alias: Some(_),
                sample: None,
            } = factor
            else {
                continue;
            };
            if count_sharded(subquery, &sharded) != total {
                continue;
            }
            // Text carried to the second stage takes the database's collation, not an explicit one.
            if collates(subquery) {
                return Err(why);
            }
            let first = super::scatter::merge_of_query(subquery, placed)?;
            super::once::each_row_once(subquery, &sharded)?;
            return Ok(Merge::Staged(Arc::new(Staged {
                first,
                part: Part::Derived { from, join },
            })));
        }
    }
    match select.from.as_slice() {
        [TableWithJoins { relation, joins }] if joins.is_empty() && total == 1 => {
            let TableFactor::Table {
                name,
                alias,
                args: None,
                ..
            } = relation
            else {
                return Err(why);
            };
            if !sharded(name) {
                return Err(why);
            }
            // A bare `o` (or `o.*` given to a function) is the whole row, whose type would be
            // the record of the first stage's rows.
            let called = match alias {
                Some(a) => super::pins::fold(&a.name),
                None => match name.0.last().and_then(|p| p.as_ident()) {
                    Some(ident) => super::pins::fold(ident),
                    None => return Err(why),
                },
            };
            if names_whole_row(q, &called) {
                return Err(why);
            }
            let Rel::Sharded(table) = refs.classify(name) else {
                return Err(why);
            };
            // Names from an alias's column list hide the table's: carry every column.
            let renamed = alias.as_ref().is_some_and(|a| !a.columns.is_empty());
            let known = refs
                .learned
                .get(&table.qualified_name())
                .filter(|_| !renamed);
            let columns =
                known.and_then(|facts| named_columns(q, &called, &facts.columns, &table.key));
            Ok(Merge::Staged(Arc::new(Staged {
                first: Merge::Concat { limit: None },
                part: Part::Table { columns },
            })))
        }
        _ => Err(why),
    }
}

/// How many references to sharded tables `q` makes, subqueries included.
fn count_sharded(q: &Query, sharded: &dyn Fn(&ObjectName) -> bool) -> usize {
    let mut n = 0;
    let _ = visit_relations(q, |name| {
        n += usize::from(sharded(name));
        ControlFlow::<()>::Continue(())
    });
    n
}

fn mentions_system_column(q: &Query) -> bool {
    let system =
        |id: &sqlparser::ast::Ident| SYSTEM_COLUMNS.contains(&super::pins::fold(id).as_str());
    visit_expressions(q, |e| match e {
        Expr::Identifier(id) if system(id) => ControlFlow::Break(()),
        Expr::CompoundIdentifier(ids) if ids.last().is_some_and(system) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// The columns of the table (`columns`, in its order) that the statement names (bare, or
/// qualified by `called`); `None` when a select list in it has a `*` or the columns are not
/// known.
/// Naming none, it carries the key (the rows must have a column).
fn named_columns(q: &Query, called: &str, columns: &[String], key: &str) -> Option<Vec<String>> {
    if has_star(q) || columns.is_empty() {
        return None;
    }
    let mut named = std::collections::HashSet::new();
    let _ = visit_expressions(q, |e| {
        match e {
            Expr::Identifier(id) => {
                named.insert(super::pins::fold(id));
            }
            Expr::CompoundIdentifier(ids)
                if ids.len() >= 2 && super::pins::fold(&ids[ids.len() - 2]) == called =>
            {
                named.insert(super::pins::fold(&ids[ids.len() - 1]));
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    let mut carried: Vec<String> = columns
        .iter()
        .filter(|c| named.contains(c.as_str()))
        .cloned()
        .collect();
    if carried.is_empty() {
        carried.push(key.to_string());
    }
    Some(carried)
}

/// Whether a select list anywhere in `q` (subqueries too) has a `*` or an `alias.*`.
fn has_star(q: &Query) -> bool {
    use sqlparser::ast::{Select, SelectItem, Visit, Visitor};
    struct Stars;
    impl Visitor for Stars {
        type Break = ();
        fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<()> {
            let star = select.projection.iter().any(|i| {
                matches!(
                    i,
                    SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
                )
            });
            if star {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
    q.visit(&mut Stars).is_break()
}

fn collates(q: &Query) -> bool {
    visit_expressions(q, |e| match e {
        Expr::Collate { .. } => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

fn names_whole_row(q: &Query, called: &str) -> bool {
    use sqlparser::ast::{FunctionArg, FunctionArgExpr, FunctionArguments};
    let row_arg = |arg: &FunctionArg| {
        let (FunctionArg::Unnamed(a) | FunctionArg::Named { arg: a, .. }) = arg else {
            return false;
        };
        matches!(a, FunctionArgExpr::QualifiedWildcard(_))
    };
    visit_expressions(q, |e| match e {
        Expr::Identifier(id) if super::pins::fold(id) == called => ControlFlow::Break(()),
        // `(o.*)::text`, `ARRAY[o.*]`: a row of the table as a value.
        Expr::QualifiedWildcard(..) => ControlFlow::Break(()),
        Expr::Function(f)
            if matches!(&f.args, FunctionArguments::List(l) if l.args.iter().any(row_arg)) =>
        {
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// The texts of both stages of `sql` (the client's text of a statement planned as `part`).
pub fn texts(sql: &str, part: &Part) -> Result<StagedTexts, &'static str> {
    super::shard_text::displays_as_written(sql)?;
    let dialect = PostgreSqlDialect {};
    let mut stmts = Parser::parse_sql(&dialect, sql).map_err(|_| "the statement does not parse")?;
    let [Statement::Query(q)] = stmts.as_mut_slice() else {
        return Err("one SELECT expected");
    };
    let SetExpr::Select(select) = q.body.as_mut() else {
        return Err("a plain SELECT expected");
    };
    let place = Parser::parse_sql(&dialect, &format!("SELECT * FROM {PLACE}"))
        .ok()
        .and_then(|mut s| match s.pop() {
            Some(Statement::Query(q)) => match *q.body {
                SetExpr::Select(s) => s.from.into_iter().next().map(|t| t.relation),
                _ => None,
            },
            _ => None,
        })
        .ok_or("internal: the stand-in does not parse")?;
    let (first, alias, columns) = match part.clone() {
        Part::Derived { from, join } => {
            let twj = select
                .from
                .get_mut(from)
                .ok_or("internal: no such FROM item")?;
            let factor = match join {
                None => &mut twj.relation,
                Some(j) => {
                    &mut twj
                        .joins
                        .get_mut(j)
                        .ok_or("internal: no such join")?
                        .relation
                }
            };
            let TableFactor::Derived {
                subquery,
                alias: Some(alias),
                ..
            } = factor
            else {
                return Err("internal: the first stage is not a subquery with an alias");
            };
            let texts = (
                subquery.to_string(),
                alias.name.to_string(),
                alias.columns.iter().map(|c| c.name.to_string()).collect(),
            );
            *factor = place;
            texts
        }
        Part::Table { columns } => {
            let [twj] = select.from.as_mut_slice() else {
                return Err("internal: the first stage is not one table");
            };
            let TableFactor::Table { name, alias, .. } = &twj.relation else {
                return Err("internal: the first stage is not a table");
            };
            let called = match alias {
                Some(a) => a.name.to_string(),
                None => name.0.last().map(|p| p.to_string()).unwrap_or_default(),
            };
            let carried = match columns {
                // Always quoted: a column may be named `user`, which unquoted is a function.
                Some(columns) => columns
                    .iter()
                    .map(|c| shardmap::sql::quote_ident_always(c))
                    .collect::<Vec<_>>()
                    .join(", "),
                None => "*".to_string(),
            };
            let mut first = format!("SELECT {carried} FROM {}", twj.relation);
            if let Some(w) = select.selection.take() {
                first.push_str(&format!(" WHERE {w}"));
            }
            twj.relation = place;
            // The first stage's names are the alias's own, column list included.
            (first, called, Vec::new())
        }
    };
    let second = q.to_string();
    let mut at = second.match_indices(PLACE);
    let (Some((i, _)), None) = (at.next(), at.next()) else {
        return Err("the statement names the router's stand-in for the first stage's rows");
    };
    Ok(StagedTexts {
        first,
        before: second[..i].to_string(),
        after: second[i + PLACE.len()..].to_string(),
        alias,
        columns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subquery_is_the_first_stage_and_its_alias_names_the_rows() {
        let t = texts(
            "SELECT s.v, max(s.n) FROM (SELECT v, count(*) AS n FROM kv WHERE id > 3 GROUP BY v) AS s(v, n) GROUP BY s.v HAVING max(s.n) > 1",
            &Part::Derived {
                from: 0,
                join: None,
            },
        )
        .unwrap();
        assert_eq!(
            t.first,
            "SELECT v, count(*) AS n FROM kv WHERE id > 3 GROUP BY v"
        );
        assert_eq!(t.before, "SELECT s.v, max(s.n) FROM ");
        assert_eq!(t.after, " GROUP BY s.v HAVING max(s.n) > 1");
        assert_eq!(
            (t.alias.as_str(), t.columns.as_slice()),
            ("s", &["v".to_string(), "n".to_string()][..])
        );
    }

    #[test]
    fn a_table_with_its_where_is_the_first_stage() {
        let t = texts(
            "SELECT DISTINCT \"Status\", count(*) OVER () FROM orders AS o WHERE o.qty > 2 ORDER BY 1",
            &Part::Table { columns: None },
        )
        .unwrap();
        assert_eq!(t.first, "SELECT * FROM orders AS o WHERE o.qty > 2");
        assert_eq!(
            t.before,
            "SELECT DISTINCT \"Status\", count(*) OVER () FROM "
        );
        assert_eq!(t.after, " ORDER BY 1");
        assert_eq!(t.alias, "o");
        assert!(t.columns.is_empty());
        let t = texts(
            "SELECT coalesce(sum(qty), 0) FROM orders",
            &Part::Table { columns: None },
        )
        .unwrap();
        assert_eq!(
            (t.first.as_str(), t.alias.as_str()),
            ("SELECT * FROM orders", "orders")
        );
        // The columns the statement names, always quoted (`user` unquoted is a function).
        let carried = Part::Table {
            columns: Some(vec!["qty".into(), "user".into()]),
        };
        let t = texts("SELECT coalesce(sum(qty), 0) FROM orders", &carried).unwrap();
        assert_eq!(t.first, "SELECT \"qty\", \"user\" FROM orders");
    }

    #[test]
    fn what_the_parser_would_print_otherwise_is_refused() {
        for sql in [
            "SELECT v ISNULL, row_number() OVER () FROM kv",
            "SELECT v, lag(v) OVER () FROM kv WHERE d > interval(0) '1.7 sec'",
        ] {
            assert!(texts(sql, &Part::Table { columns: None }).is_err(), "{sql}");
        }
        assert!(texts(
            "SELECT \"isnull\", v IS NULL FROM kv",
            &Part::Table { columns: None }
        )
        .is_ok());
        // The type in a cast prints as written.
        for sql in [
            "SELECT v, lag(v) OVER () FROM kv WHERE d > '1.7 sec'::interval(0)",
            "SELECT v, lag(v) OVER () FROM kv WHERE d > CAST('1.7 sec' AS interval(0))",
        ] {
            assert!(texts(sql, &Part::Table { columns: None }).is_ok(), "{sql}");
        }
        assert!(
            super::super::shard_sql("SELECT v ISNULL, count(*) FROM kv GROUP BY 1", None).is_err()
        );
    }

    #[test]
    fn the_stand_in_cannot_be_confused_with_the_statement() {
        assert!(texts(
            "SELECT 'shardgate_first_stage_rows', row_number() OVER () FROM orders",
            &Part::Table { columns: None }
        )
        .is_err());
    }
}
