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

/// One SELECT being visited: its sharded tables and how each is placed, and every name its
/// FROM gives (a qualified column with one of these names means that SELECT's item, whether
/// or not it is a sharded table).
#[derive(Default)]
pub(super) struct Enclosing<'m> {
    pub rels: Vec<(ScopeRel<'m>, Placed)>,
    pub names: Vec<String>,
}

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
                // An unqualified name, or one qualified by a name of this query's own FROM,
                // means a column of this query.
                let Some(qualifier) = qualifier(theirs) else {
                    continue;
                };
                if defines(&self.local_names, &qualifier) {
                    continue;
                }
                // The innermost enclosing query that gives the name is the one it means.
                let Some(outer) = self
                    .enclosing
                    .iter()
                    .rev()
                    .find(|e| defines(&e.names, &qualifier))
                else {
                    continue;
                };
                let rels: Vec<ScopeRel<'m>> = outer.rels.iter().map(|(r, _)| r.clone()).collect();
                let hit = (0..rels.len()).find(|&j| {
                    rels[j].table.key_type == scope[i].table.key_type
                        && super::pins::is_key_column(theirs, &rels, j)
                });
                if let Some(j) = hit {
                    return match &outer.rels[j].1 {
                        Placed::Free => Placed::Correlated,
                        placed => placed.clone(),
                    };
                }
            }
        }
        Placed::Free
    }
}

/// The name that qualifies a column reference (`o` of `o.customer_id`), if it has one.
fn qualifier(column: &Expr) -> Option<String> {
    match column {
        Expr::CompoundIdentifier(parts) if parts.len() >= 2 => Some(fold(&parts[parts.len() - 2])),
        _ => None,
    }
}

/// Whether a FROM that gives `names` gives `name` (`*`: an item this router does not name).
fn defines(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name || n == "*")
}

/// Whether `select` groups (GROUP BY, or DISTINCT ON) by the key of a table of `scope`: an
/// expression that is the key column, or the position of one in the select list.
pub(super) fn groups_by_key(select: &Select, scope: &[ScopeRel<'_>]) -> bool {
    use sqlparser::ast::{Distinct, GroupByExpr, SelectItem, Value};
    // DISTINCT ON reads a bare name as an output column first (as ORDER BY does); GROUP BY as
    // an input column first.
    let (by, output_first): (&[Expr], bool) = match (&select.group_by, &select.distinct) {
        (_, Some(Distinct::On(on))) => (on, true),
        (GroupByExpr::Expressions(g, m), _) if m.is_empty() => (g, false),
        _ => return false,
    };
    fn item_expr(item: &SelectItem) -> Option<&Expr> {
        match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
            _ => None,
        }
    }
    let meaning = |e: &Expr| -> Option<Expr> {
        match e {
            Expr::Value(v) => {
                let Value::Number(n, _) = &v.value else {
                    return None;
                };
                let i = n.parse::<usize>().ok()?.checked_sub(1)?;
                // A `*` before it shifts the positions by columns only the shards know.
                let before = select.projection.get(..i)?;
                if before.iter().any(|item| item_expr(item).is_none()) {
                    return None;
                }
                select.projection.get(i).and_then(item_expr).cloned()
            }
            Expr::Identifier(name) if output_first => {
                let aliased = select.projection.iter().find_map(|item| match item {
                    SelectItem::ExprWithAlias { alias, expr } if fold(alias) == fold(name) => {
                        Some(expr.clone())
                    }
                    _ => None,
                });
                Some(aliased.unwrap_or_else(|| e.clone()))
            }
            other => Some(other.clone()),
        }
    };
    by.iter().any(|e| {
        meaning(e)
            .is_some_and(|e| (0..scope.len()).any(|i| super::pins::is_key_column(&e, scope, i)))
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
