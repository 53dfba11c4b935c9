//! A client's prepared statements: its named ones and its unnamed one, each with its plan and
//! the literal values its text had (a plan is shared by texts that differ only in literals).
//!
//! A named statement is also a router-wide statement ([`Registry`]), prepared on a backend
//! connection as `sg_<id>` the first time that connection needs it. The unnamed statement is
//! the client's alone and changes with every unnamed Parse; each version gets a number, so a
//! connection knows whether it holds the current one.
//!
//! What a session's statements hold is counted in bytes and bounded by `[limits]
//! max_prepared_bytes`, so a client preparing without end gets `54000` rather than taking the
//! router's memory.

use hashbrown::HashMap;
use std::sync::Arc;

use crate::backend::registry::{Registry, Statement};
use crate::errors;
use crate::planner::{NormalizeBuf, Plan, PlanRef, Planner};
use crate::protocol::frontend::Bind;
use crate::protocol::reply::SqlError;
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

impl Text {
    /// Makes this the unnamed statement `version` of `sql`, in its own buffers.
    fn refill(&mut self, sql: &str, types: &[u8], version: u64) {
        match self {
            Text::Unnamed {
                sql: old_sql,
                param_types,
                version: v,
            } => {
                old_sql.clear();
                old_sql.push_str(sql);
                param_types.clear();
                param_types.extend_from_slice(types);
                *v = version;
            }
            Text::Named(_) => {
                *self = Text::Unnamed {
                    sql: sql.to_string(),
                    param_types: types.to_vec(),
                    version,
                }
            }
        }
    }
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

    /// The bytes it is counted for under `name`: its text, name, types and literals, plus
    /// [`PER_STATEMENT`] for the rest (its plan is shared and not counted).
    fn bytes(&self, name: &str) -> usize {
        let literals = self.literals.iter().map(|l| l.len());
        cost(name, self.sql(), self.param_types(), literals)
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

/// The literal values a plan took out of its text, to keep with the statement.
fn literals_of(planned: &PlanRef<'_>) -> Vec<Box<str>> {
    (0..)
        .map_while(|i| planned.literal(i))
        .map(Box::from)
        .collect()
}

/// What a statement costs besides its bytes of text: the map entry, the `Arc`s, the
/// router-wide entry's share, rounded up.
const PER_STATEMENT: usize = 256;

/// What a statement named `name` with this text, these types and literals of these lengths is
/// counted for (see [`ClientStatement::bytes`]).
fn cost(name: &str, sql: &str, types: &[u8], literals: impl Iterator<Item = usize>) -> usize {
    PER_STATEMENT + name.len() + sql.len() + types.len() + literals.sum::<usize>()
}

/// The client's statements.
#[derive(Debug, Default)]
pub struct Statements {
    named: HashMap<String, Arc<ClientStatement>>,
    unnamed: Option<Arc<ClientStatement>>,
    /// The planner epoch ([`Planner::epoch`]) the unnamed statement was planned in.
    unnamed_epoch: Option<(u64, u64)>,
    versions: u64,
    /// What they hold, in [`ClientStatement::bytes`].
    held: usize,
}

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

    /// The unnamed statement parsed again with the very text and types it has, when it was
    /// planned in planner epoch `epoch`: the same plan and literals under a new version (a
    /// backend parses it again, as Postgres would). `body` is the Parse message's body, which
    /// is compared as it is, so drivers that send a Parse with every execution have it neither
    /// decoded nor normalized and planned again. `None` otherwise.
    pub fn parse_again(&mut self, body: &[u8], epoch: (u64, u64)) -> Option<Arc<ClientStatement>> {
        let old = self.unnamed.as_ref()?;
        // An empty name, the text, its NUL, the parameter types.
        let (sql, types) = (old.sql().as_bytes(), old.param_types());
        let same = body.len() == sql.len() + types.len() + 2
            && body[0] == 0
            && &body[1..=sql.len()] == sql
            && body[sql.len() + 1] == 0
            && &body[sql.len() + 2..] == types;
        if !same || self.unnamed_epoch != Some(epoch) {
            return None;
        }
        self.versions += 1;
        let version = self.versions;
        let mut stmt = self.unnamed.take()?;
        match Arc::get_mut(&mut stmt) {
            Some(ClientStatement {
                text: Text::Unnamed { version: v, .. },
                ..
            }) => *v = version,
            _ => {
                stmt = Arc::new(ClientStatement {
                    text: Text::Unnamed {
                        sql: stmt.sql().to_string(),
                        param_types: stmt.param_types().to_vec(),
                        version,
                    },
                    plan: stmt.plan.clone(),
                    params_before: stmt.params_before,
                    literals: stmt.literals.clone(),
                })
            }
        }
        self.unnamed = Some(stmt.clone());
        Some(stmt)
    }

    /// Records a Parse of `sql` as `name`, planned as `planned` in planner epoch `epoch`;
    /// refused (`42P05`) when `name` exists, and (`54000`) when the session's statements would
    /// hold more than `limit` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn parse(
        &mut self,
        name: &str,
        sql: &str,
        param_types: &[u8],
        planned: &PlanRef<'_>,
        epoch: (u64, u64),
        registry: &Registry,
        limit: usize,
    ) -> Result<Arc<ClientStatement>, SqlError> {
        if !name.is_empty() && self.named.contains_key(name) {
            return Err(errors::duplicate_statement(name));
        }
        let literals = (0..).map_while(|i| planned.literal(i));
        let cost = cost(name, sql, param_types, literals.clone().map(str::len));
        let replaced = match (name.is_empty(), &self.unnamed) {
            (true, Some(old)) => old.bytes(""),
            _ => 0,
        };
        if self.held - replaced + cost > limit {
            return Err(errors::too_many_prepared_bytes(limit, self.held));
        }
        self.held = self.held - replaced + cost;
        let literals = literals.map(Box::from);
        if name.is_empty() {
            self.unnamed_epoch = Some(epoch);
            return Ok(self.parse_unnamed(sql, param_types, planned, literals));
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

    /// The unnamed statement, replaced.
    fn parse_unnamed(
        &mut self,
        sql: &str,
        param_types: &[u8],
        planned: &PlanRef<'_>,
        literals: impl Iterator<Item = Box<str>>,
    ) -> Arc<ClientStatement> {
        self.versions += 1;
        let version = self.versions;
        // Drivers replace the unnamed statement with every execution: reuse its buffers
        // when nothing else holds it.
        let stmt = match self.unnamed.take() {
            Some(mut old) if Arc::strong_count(&old) == 1 && Arc::weak_count(&old) == 0 => {
                if let Some(s) = Arc::get_mut(&mut old) {
                    s.plan = planned.plan().clone();
                    s.params_before = planned.params_before();
                    s.literals.clear();
                    s.literals.extend(literals);
                    s.text.refill(sql, param_types, version);
                }
                old
            }
            _ => Arc::new(ClientStatement {
                text: Text::Unnamed {
                    sql: sql.to_string(),
                    param_types: param_types.to_vec(),
                    version,
                },
                plan: planned.plan().clone(),
                params_before: planned.params_before(),
                literals: literals.collect(),
            }),
        };
        self.unnamed = Some(stmt.clone());
        stmt
    }

    /// A statement of the router's own text for one execution (an INSERT with the keys the
    /// router gave written in: `super::new_keys`), sent as the unnamed statement: its version
    /// is newer than the client's unnamed statement, which is parsed again where it is needed
    /// next. Not kept, and not counted against the client's bound.
    pub fn routers_own(
        &mut self,
        sql: String,
        param_types: &[u8],
        planned: &PlanRef<'_>,
    ) -> Arc<ClientStatement> {
        self.versions += 1;
        Arc::new(ClientStatement {
            text: Text::Unnamed {
                sql,
                param_types: param_types.to_vec(),
                version: self.versions,
            },
            plan: planned.plan().clone(),
            params_before: planned.params_before(),
            literals: literals_of(planned),
        })
    }

    /// Forgets `name` (`""`: the unnamed statement); `false` when there was none.
    pub fn close(&mut self, name: &str) -> bool {
        let gone = if name.is_empty() {
            self.unnamed_epoch = None;
            self.unnamed.take()
        } else {
            self.named.remove(name)
        };
        if let Some(s) = &gone {
            self.held -= s.bytes(name);
        }
        gone.is_some()
    }

    /// Forgets every named statement (`DEALLOCATE ALL`, `DISCARD ALL`).
    pub fn clear(&mut self) {
        self.named.clear();
        self.recount();
    }

    /// Counts [`Self::held`] again from the statements.
    fn recount(&mut self) {
        let named: usize = self.named.iter().map(|(n, s)| s.bytes(n)).sum();
        self.held = named + self.unnamed.as_ref().map_or(0, |s| s.bytes(""));
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
                literals: literals_of(&planned),
            })
        };
        for s in self.named.values_mut() {
            *s = again(s, buf);
        }
        if let Some(s) = self.unnamed.as_mut() {
            *s = again(s, buf);
            self.unnamed_epoch = Some(planner.epoch());
        }
        // A new plan may take out other literals.
        self.recount();
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
        self.recount();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planner() -> Planner {
        let urls: Vec<String> = (0..2).map(|i| format!("postgres://h/s{i}")).collect();
        let tables = vec![shardmap::Table::new("kv", "id", shardmap::KeyType::BigInt)];
        let map = shardmap::ShardMap::even_split(&urls, tables).expect("valid map");
        Planner::new(Arc::new(map), 100)
    }

    /// Parses `sql` as `name` under `limit`; the SQLSTATE of a refusal.
    fn parse(
        s: &mut Statements,
        p: &Planner,
        r: &Registry,
        name: &str,
        sql: &str,
        limit: usize,
    ) -> Result<(), String> {
        let mut buf = NormalizeBuf::new();
        let planned = p.plan(sql, &mut buf);
        s.parse(name, sql, &[0, 0], &planned, p.epoch(), r, limit)
            .map(|_| ())
            .map_err(|e| e.code.to_string())
    }

    #[test]
    fn prepared_statements_are_bounded_in_bytes_and_closing_gives_them_back() {
        let (p, r) = (planner(), Registry::default());
        let mut s = Statements::default();
        let text = |i: usize| format!("SELECT v FROM kv WHERE id = $1 AND tag = 'tag-{i:04}'");
        let one = PER_STATEMENT + "s0000".len() + text(0).len() + 2 + "tag-0000".len();
        let limit = one * 10;
        for i in 0..10 {
            parse(&mut s, &p, &r, &format!("s{i:04}"), &text(i), limit).expect("within");
        }
        assert_eq!(s.held, limit);
        let past = parse(&mut s, &p, &r, "s0010", &text(10), limit);
        assert_eq!(
            past,
            Err("54000".to_string()),
            "one statement past the bound"
        );
        assert_eq!(s.held, limit, "a refused Parse holds nothing");
        // A duplicate name is still a duplicate, whatever the bytes.
        assert_eq!(
            parse(&mut s, &p, &r, "s0003", &text(3), limit),
            Err("42P05".to_string())
        );
        assert!(s.close("s0003"));
        parse(&mut s, &p, &r, "s0010", &text(10), limit).expect("room again after a Close");
        s.clear();
        assert_eq!(s.held, 0);
    }

    #[test]
    fn the_unnamed_statement_is_counted_once_however_often_it_is_replaced() {
        let (p, r) = (planner(), Registry::default());
        let mut s = Statements::default();
        for i in 0..1000 {
            let sql = format!("SELECT v FROM kv WHERE id = {i}");
            parse(&mut s, &p, &r, "", &sql, 4096).expect("replaced, not added");
        }
        let last = s.get("").expect("unnamed").clone();
        assert_eq!(last.sql(), "SELECT v FROM kv WHERE id = 999");
        assert_eq!(last.literals.len(), 1);
        assert_eq!(s.held, last.bytes(""));
        drop(last);
        let big = format!("SELECT v FROM kv WHERE id = $1 /* {} */", "x".repeat(5000));
        assert_eq!(
            parse(&mut s, &p, &r, "", &big, 4096),
            Err("54000".to_string())
        );
        assert!(s.close(""));
        assert_eq!(s.held, 0);
    }

    #[test]
    fn the_same_unnamed_text_again_keeps_its_plan_under_a_new_version() {
        let (p, r) = (planner(), Registry::default());
        let mut s = Statements::default();
        let sql = "SELECT v FROM kv WHERE id = $1 AND tag = 'a'";
        let body = |name: &str, sql: &str, types: &[u8]| {
            let mut b = format!("{name}\0{sql}\0").into_bytes();
            b.extend_from_slice(types);
            b
        };
        assert!(
            s.parse_again(&body("", sql, &[0, 0]), p.epoch()).is_none(),
            "nothing yet"
        );
        parse(&mut s, &p, &r, "", sql, 4096).expect("parsed");
        let first = s.get("").expect("unnamed").clone();
        let version = |st: &ClientStatement| match st.text {
            Text::Unnamed { version, .. } => version,
            Text::Named(_) => 0,
        };
        let again = s
            .parse_again(&body("", sql, &[0, 0]), p.epoch())
            .expect("the same text");
        assert!(Arc::ptr_eq(&again.plan, &first.plan));
        assert_eq!(again.literals, first.literals);
        assert_eq!(
            version(&again),
            version(&first) + 1,
            "a backend parses it again"
        );
        assert_eq!(s.held, again.bytes(""), "counted once");
        // Another text, other types, a name, or plans gone stale: planned afresh.
        let again = |s: &mut Statements, b: Vec<u8>| s.parse_again(&b, p.epoch()).is_some();
        assert!(!again(&mut s, body("", "SELECT 1", &[0, 0])));
        assert!(!again(&mut s, body("", sql, &[0, 1, 0, 0, 0, 20])));
        assert!(!again(&mut s, body("n", sql, &[0, 0])));
        assert!(!again(&mut s, body("", &sql[..sql.len() - 1], &[0, 0])));
        assert!(!again(&mut s, body("", sql, &[0, 0, 0])), "a longer body");
        assert!(again(&mut s, body("", sql, &[0, 0])));
        // Held by a request in flight: a copy gets the new version.
        let held = s.get("").expect("unnamed").clone();
        let copy = s
            .parse_again(&body("", sql, &[0, 0]), p.epoch())
            .expect("again");
        assert!(!Arc::ptr_eq(&held, &copy) && copy.sql() == sql);
        assert_eq!(version(&copy), version(&held) + 1);
        drop(held);
        p.learn_tables(Default::default());
        assert!(!again(&mut s, body("", sql, &[0, 0])), "plans gone stale");
        assert!(s.close(""));
        assert!(!again(&mut s, body("", sql, &[0, 0])));
    }
}
