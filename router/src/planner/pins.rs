//! Key pins: which conditions fix a sharded table's key to known values.
//!
//! A table reference is pinned when a top-level `AND` conjunct of the `WHERE` of the query that
//! reads it (or an inner join's `ON`) says `key = value` or `key IN (values)`, where each value
//! is a parameter or a literal, possibly cast to a type of the key's own family. Anything
//! else (an `OR`, a function of the key, a cast that could change the value) pins nothing, so
//! the statement is refused rather than sent to a shard that may lack some rows.

use shardmap::{KeyType, Table};
use sqlparser::ast::{
    ArrayElemTypeDef, AssignmentTarget, BinaryOperator, CastKind, DataType, Expr, Ident, InTarget,
    ObjectName, ObjectNamePart, UnaryOperator, Value,
};

use super::KeySource;

/// An identifier as Postgres sees it: unquoted ones are folded to lower case.
pub(crate) fn fold(ident: &Ident) -> String {
    match ident.quote_style {
        None => ident.value.to_ascii_lowercase(),
        Some(_) => ident.value.clone(),
    }
}

/// The folded parts of a name; `None` when a part is not a plain identifier.
pub(crate) fn name_parts(name: &ObjectName) -> Option<Vec<String>> {
    name.0
        .iter()
        .map(|part| match part {
            ObjectNamePart::Identifier(ident) => Some(fold(ident)),
            ObjectNamePart::Function(_) => None,
        })
        .collect()
}

/// A sharded table as one query's `FROM` names it.
#[derive(Clone)]
pub(crate) struct ScopeRel<'m> {
    pub table: &'m Table,
    pub schema: Option<String>,
    pub name: String,
    pub alias: Option<String>,
    /// Its key column is joined `USING` it with other tables' of the same name: an unqualified
    /// name then means the joined column, equal in all of them.
    pub merged: bool,
}

/// The keys that pin `scope[index]`, from the conjuncts that hold for the query; the pin
/// with the fewest keys wins (`id = 1 AND id IN (1, 2)` needs only `1`).
pub(crate) fn pin(
    scope: &[ScopeRel<'_>],
    index: usize,
    conjuncts: &[&Expr],
) -> Option<Vec<KeySource>> {
    let table = scope[index].table;
    pin_by(scope, index, conjuncts, &table.key, table.key_type)
}

/// The values the conjuncts fix `column` (of type `key_type`) of `scope[index]` to, as
/// [`pin`] finds the key's; also for a lookup column ([`shardmap::Lookup`]).
pub(crate) fn pin_by(
    scope: &[ScopeRel<'_>],
    index: usize,
    conjuncts: &[&Expr],
    column: &str,
    key_type: KeyType,
) -> Option<Vec<KeySource>> {
    let mut best: Option<Vec<KeySource>> = None;
    let on = Column {
        scope,
        index,
        name: column,
        key_type,
    };
    for c in conjuncts {
        if let Some(keys) = pin_of(c, &on) {
            if best.as_ref().is_none_or(|b| keys.len() < b.len()) {
                best = Some(keys);
            }
        }
    }
    best
}

/// Appends the top-level `AND` conjuncts of `expr` (parentheses looked through).
pub(crate) fn conjuncts<'e>(expr: &'e Expr, out: &mut Vec<&'e Expr>) {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        Expr::Nested(inner) => conjuncts(inner, out),
        _ => out.push(expr),
    }
}

/// One column of one table of a query's scope.
struct Column<'a, 'm> {
    scope: &'a [ScopeRel<'m>],
    index: usize,
    name: &'a str,
    key_type: KeyType,
}

impl Column<'_, '_> {
    fn is(&self, expr: &Expr) -> bool {
        is_column(expr, self.scope, self.index, self.name)
    }
}

fn pin_of(expr: &Expr, on: &Column<'_, '_>) -> Option<Vec<KeySource>> {
    let key_type = on.key_type;
    match expr {
        Expr::Nested(inner) => pin_of(inner, on),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => {
            if on.is(left) {
                key_source(right, key_type).map(|k| vec![k])
            } else if on.is(right) {
                key_source(left, key_type).map(|k| vec![k])
            } else {
                None
            }
        }
        Expr::In {
            expr,
            target: InTarget::List(list),
            negated: false,
            ..
        } if on.is(expr) && !list.is_empty() => {
            list.iter().map(|e| key_source(e, key_type)).collect()
        }
        Expr::AnyOp {
            left,
            compare_op: BinaryOperator::Eq,
            right,
            ..
        } if on.is(left) => array_keys(right, key_type),
        _ => None,
    }
}

/// Whether `expr` is the key column of `scope[index]`: `key` (when no other sharded table in
/// the scope has a column of that name), `qualifier.key`, or `schema.table.key`.
pub(crate) fn is_key_column(expr: &Expr, scope: &[ScopeRel<'_>], index: usize) -> bool {
    is_column(expr, scope, index, &scope[index].table.key)
}

/// Whether `expr` is column `column` (its key or a lookup column) of `scope[index]`, named as
/// [`is_key_column`] says.
fn is_column(expr: &Expr, scope: &[ScopeRel<'_>], index: usize, column: &str) -> bool {
    let rel = &scope[index];
    let known = |t: &shardmap::Table, col: &str| t.key == col || t.lookup(col).is_some();
    match expr {
        Expr::Nested(inner) => is_column(inner, scope, index, column),
        Expr::Identifier(ident) => {
            let col = fold(ident);
            col == column
                && (rel.merged || scope.iter().filter(|r| known(r.table, &col)).count() == 1)
        }
        Expr::CompoundIdentifier(parts) => {
            let parts: Vec<String> = parts.iter().map(fold).collect();
            match parts.as_slice() {
                [q, col] => *col == column && rel.alias.as_ref().unwrap_or(&rel.name) == q,
                [schema, table, col] => {
                    *col == column
                        && rel.alias.is_none()
                        && rel.name == *table
                        && rel.schema.as_deref().is_none_or(|s| s == schema)
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// Where the value of a key comes from, if `expr` is a parameter or a constant.
pub(crate) fn key_source(expr: &Expr, key_type: KeyType) -> Option<KeySource> {
    match expr {
        Expr::Nested(inner) => key_source(inner, key_type),
        Expr::Value(v) => match &v.value {
            Value::Placeholder(p) => placeholder(p),
            Value::Number(n, _) => Some(KeySource::Literal(n.clone())),
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => {
                Some(KeySource::Literal(s.clone()))
            }
            Value::DollarQuotedString(d) => Some(KeySource::Literal(d.value.clone())),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match &**expr {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => Some(KeySource::Literal(format!("-{n}"))),
                _ => None,
            },
            _ => None,
        },
        Expr::Cast {
            kind: CastKind::Cast | CastKind::DoubleColon,
            expr,
            data_type,
            format: None,
            ..
        } if cast_keeps_value(data_type, key_type) => key_source(expr, key_type),
        _ => None,
    }
}

/// The keys of the array in `key = ANY(array)`: an `ARRAY[...]` of key values, or one array
/// value (a parameter, or a literal such as `'{1,2}'`) whose elements are read at Bind.
pub(crate) fn array_keys(expr: &Expr, key_type: KeyType) -> Option<Vec<KeySource>> {
    match expr {
        Expr::Nested(inner) => array_keys(inner, key_type),
        Expr::Array(a) if !a.elem.is_empty() => {
            a.elem.iter().map(|e| key_source(e, key_type)).collect()
        }
        Expr::Cast {
            kind: CastKind::Cast | CastKind::DoubleColon,
            expr,
            data_type: DataType::Array(elem),
            format: None,
            ..
        } => {
            let elem_type = match elem {
                ArrayElemTypeDef::SquareBracket(t, _) | ArrayElemTypeDef::Qualified(t, _) => t,
                _ => return None,
            };
            cast_keeps_value(elem_type, key_type).then_some(())?;
            array_keys(expr, key_type)
        }
        Expr::Value(_) => match key_source(expr, key_type)? {
            KeySource::Array(_) => None,
            one => Some(vec![KeySource::Array(Box::new(one))]),
        },
        _ => None,
    }
}

/// `$n` as a 0-based parameter index.
fn placeholder(p: &str) -> Option<KeySource> {
    let n: usize = p.strip_prefix('$')?.parse().ok()?;
    n.checked_sub(1).map(KeySource::Param)
}

/// Where an array value comes from when it is one parameter or one literal, however it is
/// cast or parenthesized (`($1)::text[]`, `'{a,b}'::varchar[]`): the rows of a split UNNEST
/// cut it by element, and casts apply to each part alike.
pub(crate) fn array_value(expr: &Expr) -> Option<KeySource> {
    match expr {
        Expr::Nested(inner) => array_value(inner),
        Expr::Cast {
            kind: CastKind::Cast | CastKind::DoubleColon,
            expr,
            format: None,
            ..
        } => array_value(expr),
        Expr::Value(v) => match &v.value {
            Value::Placeholder(p) => placeholder(p),
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => {
                Some(KeySource::Literal(s.clone()))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Whether casting a key value to `data_type` leaves it equal to itself: an int of any width
/// for an int key, unbounded text for a text key, uuid for uuid. `varchar(3)` truncates and
/// `numeric` compares differently, so those do not pin.
pub(crate) fn cast_keeps_value(data_type: &DataType, key_type: KeyType) -> bool {
    let named = |names: &[&str]| match data_type {
        DataType::Custom(name, modifiers) if modifiers.is_empty() => name_parts(name)
            .and_then(|p| p.last().cloned())
            .is_some_and(|n| names.contains(&n.as_str())),
        _ => false,
    };
    match key_type {
        KeyType::SmallInt | KeyType::Integer | KeyType::BigInt => {
            matches!(
                data_type,
                DataType::Int2(None)
                    | DataType::SmallInt(None)
                    | DataType::Int(None)
                    | DataType::Int4(None)
                    | DataType::Integer(None)
                    | DataType::Int8(None)
                    | DataType::BigInt(None)
            ) || named(&[
                "int2", "int4", "int8", "smallint", "integer", "bigint", "int",
            ])
        }
        KeyType::Text => {
            matches!(
                data_type,
                DataType::Text | DataType::Varchar(None) | DataType::CharacterVarying(None)
            ) || named(&["text", "varchar"])
        }
        KeyType::Uuid => matches!(data_type, DataType::Uuid) || named(&["uuid"]),
    }
}

/// Folded names of the columns an assignment list sets.
pub(crate) fn assigned_columns(assignments: &[sqlparser::ast::Assignment]) -> Vec<String> {
    let mut out = Vec::new();
    for a in assignments {
        let names: Vec<&ObjectName> = match &a.target {
            AssignmentTarget::ColumnName(n) => vec![n],
            AssignmentTarget::Tuple(ns) => ns.iter().collect(),
        };
        out.extend(
            names
                .into_iter()
                .filter_map(|n| name_parts(n).and_then(|p| p.last().cloned())),
        );
    }
    out
}
