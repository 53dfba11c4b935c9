//! Where rows and groups of a SELECT live beyond its own key pins, found while `super::refs`
//! visits a statement: subqueries whose key equals a key of an enclosing query (their rows
//! live with the enclosing row), SELECTs grouped by the sharding key (each group whole on one
//! shard), aggregates of DISTINCT key values (each value on one shard). Pure.

use sqlparser::ast::{Expr, Select, TableFactor, TableWithJoins};

use super::pins::{fold, name_parts, ScopeRel};
use super::refs::Refs;
use super::KeySource;

/// How a sharded table of an enclosing query is placed, for the subqueries inside it.
#[derive(Clone)]
pub(super) enum Placed {
    /// Pinned by these keys.
    Pinned(Vec<KeySource>),
    /// Not pinned, but each of its rows is read with a row of a table of an enclosing query
    /// whose key it equals (a correlated subquery): on that row's shard.
    Correlated,
    /// Neither.
    Free,
}

/// The sharded tables of one SELECT being visited, and how each is placed.
pub(super) type Enclosing<'m> = Vec<(ScopeRel<'m>, Placed)>;

impl<'m> Refs<'m> {
    /// How `scope[i]` is placed by a conjunct that makes its key equal to the key of a table
    /// of an enclosing query, of the same key type: as that table is.
    pub(super) fn enclosing_key(
        &self,
        scope: &[ScopeRel<'m>],
        i: usize,
        conds: &[&Expr],
    ) -> Placed {
        for c in conds {
            let Expr::BinaryOp {
                left,
                op: sqlparser::ast::BinaryOperator::Eq,
                right,
            } = c
            else {
                continue;
            };
            for (mine, theirs) in [(left, right), (right, left)] {
                if !super::pins::is_key_column(mine, scope, i) {
                    continue;
                }
                for outer in self.enclosing.iter().rev() {
                    let rels: Vec<ScopeRel<'m>> = outer.iter().map(|(r, _)| r.clone()).collect();
                    let hit = (0..rels.len()).find(|&j| {
                        rels[j].table.key_type == scope[i].table.key_type
                            && super::pins::is_key_column(theirs, &rels, j)
                            // An unqualified name, or one qualified by a name of this
                            // query's own FROM, means a column of this query.
                            && !self.means_local(theirs)
                    });
                    if let Some(j) = hit {
                        return match &outer[j].1 {
                            Placed::Free => Placed::Correlated,
                            placed => placed.clone(),
                        };
                    }
                }
            }
        }
        Placed::Free
    }

    /// Whether a column reference means a column of the SELECT being placed.
    fn means_local(&self, column: &Expr) -> bool {
        match column {
            Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
                let qualifier = fold(&parts[parts.len() - 2]);
                self.local_names.iter().any(|n| *n == qualifier || n == "*")
            }
            _ => true,
        }
    }
}

/// Whether `select` groups (GROUP BY, or DISTINCT ON) by the key of a table of `scope`: an
/// expression that is the key column, or the position of one in the select list.
pub(super) fn groups_by_key(select: &Select, scope: &[ScopeRel<'_>]) -> bool {
    let by: &[Expr] = match (&select.group_by, &select.distinct) {
        (_, Some(sqlparser::ast::Distinct::On(on))) => on,
        (sqlparser::ast::GroupByExpr::Expressions(g, m), _) if m.is_empty() => g,
        _ => return false,
    };
    by.iter().any(|e| {
        let e = match e {
            Expr::Value(v) => match &v.value {
                sqlparser::ast::Value::Number(n, _) => match n.parse::<usize>() {
                    Ok(i) if i >= 1 => match select.projection.get(i - 1) {
                        Some(sqlparser::ast::SelectItem::UnnamedExpr(e))
                        | Some(sqlparser::ast::SelectItem::ExprWithAlias { expr: e, .. }) => e,
                        _ => return false,
                    },
                    _ => return false,
                },
                _ => return false,
            },
            other => other,
        };
        (0..scope.len()).any(|i| super::pins::is_key_column(e, scope, i))
    })
}

/// The names a FROM list gives its items: each alias, else the table's own name.
pub(super) fn names_in_from(from: &[TableWithJoins]) -> Vec<String> {
    fn factor(f: &TableFactor, out: &mut Vec<String>) {
        match f {
            TableFactor::NestedJoin {
                table_with_joins,
                alias,
            } => {
                factor(&table_with_joins.relation, out);
                for j in &table_with_joins.joins {
                    factor(&j.relation, out);
                }
                out.extend(alias.as_ref().map(|a| fold(&a.name)));
            }
            TableFactor::Table { name, alias, .. } => match alias {
                Some(a) => out.push(fold(&a.name)),
                None => out.extend(name_parts(name).and_then(|p| p.last().cloned())),
            },
            TableFactor::Derived { alias, .. }
            | TableFactor::TableFunction { alias, .. }
            | TableFactor::Function { alias, .. }
            | TableFactor::UNNEST { alias, .. } => {
                out.extend(alias.as_ref().map(|a| fold(&a.name)))
            }
            // A FROM item this router does not name: every qualified column may be its.
            _ => out.push("*".to_string()),
        }
    }
    let mut out = Vec::new();
    for twj in from {
        factor(&twj.relation, &mut out);
        for j in &twj.joins {
            factor(&j.relation, &mut out);
        }
    }
    out
}

/// The select-list items of `select` that are `count(DISTINCT key)` or `sum(DISTINCT key)` of
/// the key of a table of `scope` (no FILTER, ORDER BY or other clause inside).
pub(super) fn distinct_key_aggregates(select: &Select, scope: &[ScopeRel<'_>]) -> Vec<*const Expr> {
    use sqlparser::ast::{DuplicateTreatment, FunctionArg, FunctionArgExpr, FunctionArguments};
    let mut out = Vec::new();
    for item in &select.projection {
        let (sqlparser::ast::SelectItem::UnnamedExpr(e)
        | sqlparser::ast::SelectItem::ExprWithAlias { expr: e, .. }) = item
        else {
            continue;
        };
        let Expr::Function(f) = e else { continue };
        let name = f.name.to_string().to_ascii_lowercase();
        let FunctionArguments::List(list) = &f.args else {
            continue;
        };
        let plain = f.filter.is_none()
            && f.over.is_none()
            && f.within_group.is_empty()
            && list.clauses.is_empty()
            && list.duplicate_treatment == Some(DuplicateTreatment::Distinct);
        let on_key = match list.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] => {
                (0..scope.len()).any(|i| super::pins::is_key_column(arg, scope, i))
            }
            _ => false,
        };
        if plain && on_key && matches!(name.as_str(), "count" | "sum") {
            out.push(e as *const Expr);
        }
    }
    out
}
