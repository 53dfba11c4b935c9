//! A client's prepared statements: its named ones and its unnamed one, each with its plan and
//! the literal values its text had (a plan is shared by texts that differ only in literals).
//!
//! A named statement is also a router-wide statement ([`Registry`]), prepared on a backend
//! connection as `sg_<id>` the first time that connection needs it. The unnamed statement is
//! the client's alone and changes with every unnamed Parse; each version gets a number, so a
//! connection knows whether it holds the current one.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::registry::{Registry, Statement};
use crate::planner::{NormalizeBuf, Plan, PlanRef, Planner};
use crate::protocol::frontend::Bind;
use crate::resolver::Params;

/// One statement of the client.
#[derive(Debug)]
pub struct ClientStatement {
    pub text: Text,
    pub plan: Arc<Plan>,
    /// How many `$n` the client's text had (the rest of the plan's parameters are literals).
    pub params_before: usize,
    pub literals: Vec<Box<str>>,
}

/// What is sent to a backend to prepare it.
#[derive(Debug)]
pub enum Text {
    /// A named statement: the router-wide statement.
    Named(Arc<Statement>),
    /// The unnamed statement, version `version` (counted from 1 per client).
    Unnamed {
        sql: String,
        param_types: Vec<u8>,
        version: u64,
    },
}

impl ClientStatement {
    pub fn sql(&self) -> &str {
        match &self.text {
            Text::Named(s) => &s.sql,
            Text::Unnamed { sql, .. } => sql,
        }
    }

    pub fn param_types(&self) -> &[u8] {
        match &self.text {
            Text::Named(s) => &s.param_types,
            Text::Unnamed { param_types, .. } => param_types,
        }
    }

    /// Where its values are for one execution with `bind`'s parameters.
    pub fn params<'a>(&'a self, bind: Option<&'a Bind<'a>>) -> Params<'a> {
        Params {
            bind,
            params_before: self.params_before,
            literals: &self.literals,
        }
    }
}

/// The client's statements.
#[derive(Debug, Default)]
pub struct Statements {
    named: HashMap<String, Arc<ClientStatement>>,
    unnamed: Option<Arc<ClientStatement>>,
    versions: u64,
}

/// A Parse named a statement that already exists.
#[derive(Debug)]
pub struct Duplicate;

impl Statements {
    /// The statement `name` names (`""`: the unnamed one).
    pub fn get(&self, name: &str) -> Option<&Arc<ClientStatement>> {
        if name.is_empty() {
            self.unnamed.as_ref()
        } else {
            self.named.get(name)
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Records a Parse of `sql` as `name`, planned as `planned`.
    pub fn parse(
        &mut self,
        name: &str,
        sql: &str,
        param_types: &[u8],
        planned: &PlanRef<'_>,
        registry: &Registry,
    ) -> Result<Arc<ClientStatement>, Duplicate> {
        let literals = (0..).map_while(|i| planned.literal(i)).map(Box::from);
        if name.is_empty() {
            self.versions += 1;
            // Drivers replace the unnamed statement with every execution: reuse its buffers
            // when nothing else holds it.
            if let Some(Some(s)) = self.unnamed.as_mut().map(Arc::get_mut) {
                if let Text::Unnamed {
                    sql: old_sql,
                    param_types: old_types,
                    version,
                } = &mut s.text
                {
                    old_sql.clear();
                    old_sql.push_str(sql);
                    old_types.clear();
                    old_types.extend_from_slice(param_types);
                    *version = self.versions;
                    s.plan = planned.plan().clone();
                    s.params_before = planned.params_before();
                    s.literals.clear();
                    s.literals.extend(literals);
                }
            } else {
                self.unnamed = Some(Arc::new(ClientStatement {
                    text: Text::Unnamed {
                        sql: sql.to_string(),
                        param_types: param_types.to_vec(),
                        version: self.versions,
                    },
                    plan: planned.plan().clone(),
                    params_before: planned.params_before(),
                    literals: literals.collect(),
                }));
            }
            return self.unnamed.clone().ok_or(Duplicate);
        }
        if self.named.contains_key(name) {
            return Err(Duplicate);
        }
        let stmt = Arc::new(ClientStatement {
            text: Text::Named(registry.intern(sql, param_types)),
            plan: planned.plan().clone(),
            params_before: planned.params_before(),
            literals: literals.collect(),
        });
        self.named.insert(name.to_string(), stmt.clone());
        Ok(stmt)
    }

    /// Forgets `name` (`""`: the unnamed statement); `false` when there was none.
    pub fn close(&mut self, name: &str) -> bool {
        if name.is_empty() {
            self.unnamed.take().is_some()
        } else {
            self.named.remove(name).is_some()
        }
    }

    /// Forgets every named statement (`DEALLOCATE ALL`, `DISCARD ALL`).
    pub fn clear(&mut self) {
        self.named.clear();
    }

    /// Plans every statement again with `planner` (after a reload: the shard map's tables may
    /// have changed). The texts, and so the router-wide statements, stay the same.
    pub fn replan(&mut self, planner: &Planner, buf: &mut NormalizeBuf) {
        let again = |s: &Arc<ClientStatement>, buf: &mut NormalizeBuf| {
            let planned = planner.plan(s.sql(), buf);
            Arc::new(ClientStatement {
                text: match &s.text {
                    Text::Named(r) => Text::Named(r.clone()),
                    Text::Unnamed {
                        sql,
                        param_types,
                        version,
                    } => Text::Unnamed {
                        sql: sql.clone(),
                        param_types: param_types.clone(),
                        version: *version,
                    },
                },
                plan: planned.plan().clone(),
                params_before: planned.params_before(),
                literals: (0..)
                    .map_while(|i| planned.literal(i))
                    .map(Box::from)
                    .collect(),
            })
        };
        for s in self.named.values_mut() {
            *s = again(s, buf);
        }
        if let Some(s) = self.unnamed.as_mut() {
            *s = again(s, buf);
        }
    }

    /// The router statement `id`, when one of the client's names is for it.
    pub fn router_statement(&self, id: u64) -> Option<&Arc<Statement>> {
        self.named.values().find_map(|s| match &s.text {
            Text::Named(r) if r.id == id => Some(r),
            _ => None,
        })
    }

    /// Forgets the names of router statement `id` (its Parse failed on the backend).
    pub fn forget(&mut self, id: u64) {
        self.named
            .retain(|_, s| !matches!(&s.text, Text::Named(r) if r.id == id));
    }
}
