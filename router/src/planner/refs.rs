//! What a statement touches: every table reference, classified against the shard map, and the
//! key pins of the sharded ones.
//!
//! One pass of sqlparser's `Visitor` over the whole statement does two independent jobs.
//! `pre_visit_relation` counts every table name wherever it appears (subqueries, CTEs, DML
//! targets, DDL), so nothing is missed; the `pre_visit_select` / `pre_visit_statement` hooks
//! look for pins of the tables that query names directly. A statement is routed by key only
//! when every sharded reference counted has a pin: a pin found in the wrong place is never
//! needed, and a place where pins are not looked for means the statement is refused.

use std::ops::ControlFlow;

use shardmap::{ShardMap, Table};
use sqlparser::ast::{
    AssignmentTarget, Expr, FromTable, JoinConstraint, JoinOperator, ObjectName, OnConflictAction,
    OnInsert, Query, Select, SetExpr, Statement, TableFactor, TableObject, TableWithJoins, Visit,
    Visitor,
};

use super::pins::{conjuncts, fold, name_parts, pin, ScopeRel};
use super::KeySource;

/// How a table name in a statement is to be read.
pub(crate) enum Rel<'m> {
    Sharded(&'m Table),
    /// A table (or view, sequence...) not in the map: it lives on the default shard.
    Unsharded,
    /// `pg_catalog`, `information_schema`: the same on every shard.
    Catalog,
    /// A name defined by an enclosing `WITH`.
    Cte,
}

/// A sharded table reference and the keys that pin it.
pub(crate) struct Pin<'m> {
    pub table: &'m Table,
    pub keys: Vec<KeySource>,
}

/// The CTE names of one `WITH`, and how many of them are visible where the visitor is now.
struct Frame {
    names: Vec<String>,
    queries: Vec<*const Query>,
    recursive: bool,
    visible: usize,
}

/// Where the sharding key sits among each sharded table's columns, learned from a shard's
/// catalog (by the table's name in the map), for INSERTs without a column list.
pub type KeyPositions = std::sync::Arc<std::collections::HashMap<String, usize>>;

pub(crate) struct Refs<'m> {
    map: &'m ShardMap,
    positions: KeyPositions,
    /// Every reference to a sharded table, in the order met.
    pub sharded: Vec<&'m Table>,
    /// Names of referenced tables that are not in the map.
    pub unsharded: Vec<String>,
    pub pins: Vec<Pin<'m>>,
    /// The first reason found why the statement cannot be routed, for the client.
    pub problem: Option<String>,
    /// Calls a function that may read or write tables (user functions, `nextval`).
    pub calls_functions: bool,
    /// `SELECT ... INTO new_table`.
    pub select_into: bool,
    /// `INSERT ... SELECT * FROM UNNEST(...)` into a sharded table: where each UNNEST array
    /// comes from, and which of them holds the keys.
    pub unnest: Option<(Vec<KeySource>, usize)>,
    frames: Vec<Frame>,
    /// Table-function names in `FROM` (`generate_series(...)`): not tables.
    skip: Vec<*const ObjectName>,
}

impl<'m> Refs<'m> {
    /// Everything `stmt` references.
    pub fn collect(stmt: &Statement, map: &'m ShardMap, positions: &KeyPositions) -> Refs<'m> {
        let mut refs = Refs::new(map);
        refs.positions = positions.clone();
        let _ = stmt.visit(&mut refs);
        refs
    }

    /// Nothing collected yet: also what [`Refs::classify`] needs outside any query.
    pub fn new(map: &'m ShardMap) -> Refs<'m> {
        Refs {
            map,
            positions: KeyPositions::default(),
            sharded: Vec::new(),
            unsharded: Vec::new(),
            pins: Vec::new(),
            problem: None,
            calls_functions: false,
            select_into: false,
            unnest: None,
            frames: Vec::new(),
            skip: Vec::new(),
        }
    }

    fn refuse(&mut self, message: String) {
        self.problem.get_or_insert(message);
    }

    pub fn classify(&self, name: &ObjectName) -> Rel<'m> {
        let Some(parts) = name_parts(name) else {
            return Rel::Unsharded;
        };
        let (schema, table) = match parts.as_slice() {
            [.., schema, table] => (Some(schema.as_str()), table.as_str()),
            [table] => (None, table.as_str()),
            [] => return Rel::Unsharded,
        };
        if matches!(schema, Some("pg_catalog" | "information_schema"))
            || (schema.is_none() && table.starts_with("pg_"))
        {
            return Rel::Catalog;
        }
        if schema.is_none() && self.is_cte(table) {
            return Rel::Cte;
        }
        match self.map.table(schema, table) {
            Some(t) => Rel::Sharded(t),
            None => Rel::Unsharded,
        }
    }

    fn is_cte(&self, name: &str) -> bool {
        self.frames
            .iter()
            .any(|f| f.names[..f.visible].iter().any(|n| n == name))
    }

    /// The sharded tables a query names directly in `from`, with their qualifiers.
    fn scope(&self, from: &[&TableWithJoins], out: &mut Vec<ScopeRel<'m>>) {
        for twj in from {
            self.factor(&twj.relation, out);
            for join in &twj.joins {
                self.factor(&join.relation, out);
            }
        }
    }

    fn factor(&self, factor: &TableFactor, out: &mut Vec<ScopeRel<'m>>) {
        match factor {
            TableFactor::Table {
                name,
                alias,
                args: None,
                ..
            } => {
                if let (Rel::Sharded(table), Some(parts)) = (self.classify(name), name_parts(name))
                {
                    let n = parts.len();
                    out.push(ScopeRel {
                        table,
                        schema: (n >= 2).then(|| parts[n - 2].clone()),
                        name: parts[n - 1].clone(),
                        alias: alias.as_ref().map(|a| fold(&a.name)),
                    });
                }
            }
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => {
                self.factor(&table_with_joins.relation, out);
                for join in &table_with_joins.joins {
                    self.factor(&join.relation, out);
                }
            }
            _ => {}
        }
    }

    /// Pins every sharded table of `scope` that `conds` fix.
    fn pin_scope(&mut self, scope: &[ScopeRel<'m>], conds: &[&Expr]) {
        for i in 0..scope.len() {
            if let Some(keys) = pin(scope, i, conds) {
                self.pins.push(Pin {
                    table: scope[i].table,
                    keys,
                });
            }
        }
    }

    fn select(&mut self, select: &Select) {
        if select.into.is_some() {
            self.select_into = true;
        }
        let mut scope = Vec::new();
        let from: Vec<&TableWithJoins> = select.from.iter().collect();
        self.scope(&from, &mut scope);
        if scope.is_empty() {
            return;
        }
        let mut conds = Vec::new();
        if let Some(w) = &select.selection {
            conjuncts(w, &mut conds);
        }
        // An inner join's ON is a filter like WHERE; an outer join's is not.
        for twj in &select.from {
            inner_join_conditions(twj, &mut conds);
        }
        self.pin_scope(&scope, &conds);
    }

    fn update(
        &mut self,
        table: &TableWithJoins,
        from: Vec<&TableWithJoins>,
        selection: Option<&Expr>,
        keys_set: Vec<String>,
    ) {
        let mut scope = Vec::new();
        self.scope(&[table], &mut scope);
        // Moving a row to another key would move it to another shard.
        if let Some(target) = scope.first() {
            if keys_set.contains(&target.table.key) {
                let t = target.table;
                self.refuse(format!(
                    "this UPDATE changes the sharding key {key} of {name}, which would move rows to another shard: delete the row and insert it again instead",
                    key = t.key,
                    name = t.qualified_name()
                ));
            }
        }
        self.scope(&from, &mut scope);
        let mut conds = Vec::new();
        if let Some(w) = selection {
            conjuncts(w, &mut conds);
        }
        self.pin_scope(&scope, &conds);
    }

    fn insert(&mut self, ins: &sqlparser::ast::Insert) {
        let TableObject::TableName(name) = &ins.table else {
            return;
        };
        let Rel::Sharded(table) = self.classify(name) else {
            return;
        };
        let (tname, key) = (table.qualified_name(), table.key.as_str());
        let position = if ins.columns.is_empty() {
            // Without a column list the values are in table order, which a shard's catalog told.
            match self.positions.get(&tname) {
                Some(&p) => Some(p),
                None => {
                    return self.refuse(format!(
                        "INSERT INTO {tname} needs a column list that names its sharding key, as in INSERT INTO {tname} ({key}, ...) VALUES (...) (the router could not read the table's column order from a shard)"
                    ))
                }
            }
        } else {
            ins.columns.iter().position(|c| {
                name_parts(c)
                    .and_then(|p| p.last().cloned())
                    .is_some_and(|n| n == key)
            })
        };
        let Some(position) = position else {
            return self.refuse(format!(
                "INSERT INTO {tname} must give the sharding key {key} in its column list"
            ));
        };
        if let Some(OnInsert::OnConflict(oc)) = &ins.on {
            if let OnConflictAction::DoUpdate(du) = &oc.action {
                if assigned_columns(&du.assignments).iter().any(|c| c == key) {
                    return self.refuse(format!(
                        "ON CONFLICT DO UPDATE must not change the sharding key {key} of {tname}: that would move the row to another shard"
                    ));
                }
            }
        }
        let rows = match ins.source.as_deref().map(|q| &*q.body) {
            Some(SetExpr::Values(values)) => &values.rows,
            _ if ins.source.as_deref().and_then(unnest_arrays).is_some() => {
                return self.insert_unnest(ins, table, position)
            }
            _ => {
                return self.refuse(format!(
                    "INSERT INTO the sharded table {tname} can only take VALUES rows for now, not a query or DEFAULT VALUES"
                ))
            }
        };
        let mut keys = Vec::with_capacity(rows.len());
        for (n, row) in rows.iter().enumerate() {
            match row.content.get(position).and_then(|e| super::pins::key_source(e, table.key_type)) {
                Some(k) => keys.push(k),
                None => {
                    return self.refuse(format!(
                        "row {} of this INSERT INTO {tname} gives {key} as an expression: the sharding key must be a literal or a parameter",
                        n + 1
                    ))
                }
            }
        }
        self.pins.push(Pin { table, keys });
    }
}

impl<'m> Refs<'m> {
    /// `INSERT INTO t (cols) SELECT * FROM UNNEST(a1, a2, ...)`: the rows are the arrays'
    /// elements, so the key array pins the rows (element by element, like `= ANY`) and every
    /// array must be a value the router can cut by element.
    fn insert_unnest(&mut self, ins: &sqlparser::ast::Insert, table: &'m Table, position: usize) {
        let tname = table.qualified_name();
        let Some(arrays) = ins.source.as_deref().and_then(unnest_arrays) else {
            return;
        };
        if ins.columns.len() != arrays.len() {
            // Which array fills which column is certain only when each array is one column.
            return self.refuse(format!(
                "INSERT INTO {tname} ... SELECT * FROM UNNEST(...) needs a column list with one column per array, as in INSERT INTO {tname} ({}, ...) SELECT * FROM UNNEST($1::bigint[], ...)",
                table.key
            ));
        }
        let Some(key_array) = arrays.get(position) else {
            return self.refuse(format!(
                "this INSERT INTO {tname} takes its rows from UNNEST, which has no array for the sharding key {}",
                table.key
            ));
        };
        let key = match super::pins::array_keys(key_array, table.key_type).as_deref() {
            Some([one @ KeySource::Array(_)]) => one.clone(),
            _ => {
                return self.refuse(format!(
                    "the sharding key {} of this INSERT INTO {tname} ... SELECT * FROM UNNEST(...) must come from one array parameter or literal (as in UNNEST($1::bigint[], ...))",
                    table.key
                ))
            }
        };
        let Some(sources) = arrays
            .iter()
            .map(super::pins::array_value)
            .collect::<Option<Vec<_>>>()
        else {
            return self.refuse(format!(
                "every array of this INSERT INTO {tname} ... SELECT * FROM UNNEST(...) must be a parameter or a literal (optionally cast), so that its rows can be split by shard"
            ));
        };
        self.pins.push(Pin {
            table,
            keys: vec![key],
        });
        self.unnest = Some((sources, position));
    }
}

/// The arrays of `SELECT * FROM UNNEST(a1, a2, ...)`, when the query is exactly that (an alias
/// allowed, nothing else: no filter, order, limit or ordinality, which would make the rows
/// something other than the arrays' elements).
fn unnest_arrays(q: &Query) -> Option<&[Expr]> {
    if q.with.is_some() || q.order_by.is_some() || q.limit_clause.is_some() || q.fetch.is_some() {
        return None;
    }
    let SetExpr::Select(select) = &*q.body else {
        return None;
    };
    let plain = select.distinct.is_none()
        && select.selection.is_none()
        && select.having.is_none()
        && select.into.is_none()
        && matches!(&select.group_by, sqlparser::ast::GroupByExpr::Expressions(g, _) if g.is_empty())
        && matches!(
            select.projection.as_slice(),
            [sqlparser::ast::SelectItem::Wildcard(_)]
        );
    match select.from.as_slice() {
        [TableWithJoins {
            relation:
                TableFactor::UNNEST {
                    array_exprs,
                    with_offset: false,
                    with_ordinality: false,
                    ..
                },
            joins,
        }] if plain && joins.is_empty() => Some(array_exprs),
        _ => None,
    }
}

/// The ON conditions of inner joins, as conjuncts.
fn inner_join_conditions<'e>(twj: &'e TableWithJoins, out: &mut Vec<&'e Expr>) {
    for join in &twj.joins {
        if let JoinOperator::Join(JoinConstraint::On(e))
        | JoinOperator::Inner(JoinConstraint::On(e)) = &join.join_operator
        {
            conjuncts(e, out);
        }
    }
}

/// Folded names of the columns an assignment list sets.
fn assigned_columns(assignments: &[sqlparser::ast::Assignment]) -> Vec<String> {
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

/// Functions that read no tables: calling them does not tie a statement to the default shard.
fn is_plain_function(name: &ObjectName) -> bool {
    const PLAIN: &[&str] = &[
        "abs",
        "array_agg",
        "array_length",
        "avg",
        "bool_and",
        "bool_or",
        "btrim",
        "ceil",
        "char_length",
        "clock_timestamp",
        "coalesce",
        "concat",
        "concat_ws",
        "count",
        "current_database",
        "current_date",
        "current_role",
        "current_schema",
        "current_schemas",
        "current_setting",
        "current_time",
        "current_timestamp",
        "current_user",
        "date_part",
        "date_trunc",
        "extract",
        "floor",
        "format",
        "gen_random_uuid",
        "generate_series",
        "greatest",
        "has_table_privilege",
        "json_agg",
        "json_build_object",
        "jsonb_agg",
        "jsonb_build_object",
        "least",
        "left",
        "length",
        "localtime",
        "localtimestamp",
        "lower",
        "lpad",
        "ltrim",
        "max",
        "md5",
        "min",
        "now",
        "nullif",
        "obj_description",
        "octet_length",
        "position",
        "quote_ident",
        "quote_literal",
        "random",
        "regexp_replace",
        "repeat",
        "replace",
        "right",
        "round",
        "row_number",
        "rpad",
        "rtrim",
        "session_user",
        "split_part",
        "sqrt",
        "statement_timestamp",
        "string_agg",
        "strpos",
        "substr",
        "substring",
        "sum",
        "timeofday",
        "to_char",
        "to_date",
        "to_json",
        "to_jsonb",
        "to_number",
        "to_timestamp",
        "trim",
        "trunc",
        "unnest",
        "upper",
        "user",
        "uuid_generate_v4",
        "version",
    ];
    let Some(parts) = name_parts(name) else {
        return false;
    };
    match parts.as_slice() {
        [schema, _] if schema == "pg_catalog" => true,
        [f] => f.starts_with("pg_") || PLAIN.contains(&f.as_str()),
        _ => false,
    }
}

impl Visitor for Refs<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        // A non-recursive CTE's body sees only the CTEs before it; the main body sees all.
        if let Some(top) = self.frames.last_mut() {
            if let Some(i) = top.queries.iter().position(|q| std::ptr::eq(*q, query)) {
                top.visible = if top.recursive { top.names.len() } else { i };
            }
        }
        let mut frame = Frame {
            names: Vec::new(),
            queries: Vec::new(),
            recursive: false,
            visible: 0,
        };
        if let Some(with) = &query.with {
            frame.recursive = with.recursive;
            for cte in &with.cte_tables {
                let name = fold(&cte.alias.name);
                if self.map.table(None, &name).is_some() {
                    self.refuse(format!(
                        "the WITH query {name} has the name of a sharded table, which shardgate cannot tell apart: rename the WITH query"
                    ));
                }
                frame.names.push(name);
                frame.queries.push(&*cte.query as *const Query);
            }
        }
        frame.visible = frame.names.len();
        self.frames.push(frame);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        self.frames.pop();
        if let Some(top) = self.frames.last_mut() {
            if top.queries.iter().any(|q| std::ptr::eq(*q, query)) {
                top.visible = top.names.len();
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table {
            name,
            args: Some(_),
            ..
        } = factor
        {
            self.skip.push(name as *const ObjectName);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<()> {
        if self.skip.iter().any(|p| std::ptr::eq(*p, relation)) {
            return ControlFlow::Continue(());
        }
        match self.classify(relation) {
            Rel::Sharded(t) => self.sharded.push(t),
            Rel::Unsharded => self.unsharded.push(relation.to_string()),
            Rel::Catalog | Rel::Cte => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<()> {
        self.select(select);
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = expr {
            if !is_plain_function(&f.name) {
                self.calls_functions = true;
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, stmt: &Statement) -> ControlFlow<()> {
        match stmt {
            Statement::Insert(ins) => self.insert(ins),
            Statement::Update(u) => {
                let from: Vec<&TableWithJoins> = match &u.from {
                    Some(
                        sqlparser::ast::UpdateTableFromKind::AfterSet(f)
                        | sqlparser::ast::UpdateTableFromKind::BeforeSet(f),
                    ) => f.iter().collect(),
                    None => Vec::new(),
                };
                let keys_set = assigned_columns(&u.assignments);
                self.update(&u.table, from, u.selection.as_ref(), keys_set);
            }
            Statement::Delete(d) => {
                let mut scope = Vec::new();
                let tables = match &d.from {
                    FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => t,
                };
                let mut from: Vec<&TableWithJoins> = tables.iter().collect();
                if let Some(using) = &d.using {
                    from.extend(using.iter());
                }
                self.scope(&from, &mut scope);
                let mut conds = Vec::new();
                if let Some(w) = &d.selection {
                    conjuncts(w, &mut conds);
                }
                self.pin_scope(&scope, &conds);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}
