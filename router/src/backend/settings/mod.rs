//! A client's session settings under transaction pooling, sans-IO.
//!
//! Postgres keeps `SET` values per backend connection, but a client here gets whichever
//! connection is free. So the router keeps each client's settings (from its startup packet and
//! its `SET`/`RESET` statements), and each backend connection remembers a fingerprint of the
//! settings it holds. When a client's statement lands on a connection whose fingerprint differs,
//! the router first sends `RESET ALL` and the client's `SET`s, in the same write as the
//! statement, or, when one of them may fail where it once succeeded ([`Settings::is_fragile`]),
//! on their own and answered first, so the statement never runs without them. Clients with the
//! same settings (all pgbench clients, say) share connections without any resets.

use std::hash::{Hash, Hasher};

use shardmap::sql::quote_literal;

use characteristics::characteristics;

mod characteristics;
mod datestyle;
mod parse;

use parse::several_changes;
pub use parse::{parse_change, parse_options};

/// Fingerprint of a connection whose settings are not known (an untracked `SET` ran on it):
/// it is reset before anyone uses it.
pub const UNKNOWN: u64 = u64::MAX;

/// What a statement does to the session's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `SET [SESSION] name = value`: `value` is the SQL text of the value, as written.
    Set { name: String, value: String },
    /// `RESET name`
    Reset { name: String },
    /// `RESET ALL`: every setting back to the session's default, except the role and the
    /// session user, which Postgres keeps (`GUC_NO_RESET_ALL`).
    ResetAll,
    /// `DISCARD ALL`: every setting, the role and session user too.
    DiscardAll,
    /// `SET LOCAL`: lasts until the end of the transaction, nothing to remember past it (the
    /// change, when the router could read it, for what the transaction's statements see:
    /// [`Changes::get`]).
    Local(Option<(String, Option<String>)>),
    /// A statement that changed settings in a way the router does not follow.
    Unknown,
}

/// What every connection gets before another client's settings. `RESET ALL` leaves the role
/// and the session user as they were (`GUC_NO_RESET_ALL`), so they are reset first: another
/// client's must never carry over. None of it can fail outside a transaction block.
pub const RESET_SQL: &str = "SET SESSION AUTHORIZATION DEFAULT; RESET ROLE; RESET ALL";

/// Settings that `RESET ALL` leaves alone.
const NO_RESET_ALL: &[&str] = &["role", "session_authorization"];

/// Settings whose `SET`, once it succeeded for a client, succeeds again on any connection of
/// the same server: their values are checked against nothing a later statement can change
/// (a role's membership, a tablespace or text search configuration that can be dropped, a
/// `GRANT SET` that can be revoked). The client's settings are written ahead of its statement
/// in the same write only when every one of them is here ([`Settings::is_fragile`]).
/// Placeholders (`app.tenant`) and the planner's `enable_*` switches count as safe too: only an
/// extension loaded later that reserves a placeholder's prefix would refuse it.
const SAFE_AGAIN: &[&str] = &[
    "application_name",
    "client_encoding",
    "datestyle",
    "intervalstyle",
    "timezone",
    "extra_float_digits",
    "search_path",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "bytea_output",
    "standard_conforming_strings",
    "client_min_messages",
    "default_transaction_isolation",
    "default_transaction_read_only",
    "default_transaction_deferrable",
    "work_mem",
    "synchronous_commit",
    "row_security",
    "jit",
    "array_nulls",
    "xmloption",
    "xmlbinary",
    "backslash_quote",
    "escape_string_warning",
    "maintenance_work_mem",
    "geqo",
    "plan_cache_mode",
    "random_page_cost",
    "seq_page_cost",
    "effective_cache_size",
    "default_statistics_target",
    "from_collapse_limit",
    "join_collapse_limit",
    "max_parallel_workers_per_gather",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "timezone_abbreviations",
];

/// Startup parameters that are not settings.
const NOT_SETTINGS: &[&str] = &["user", "database", "replication", "options"];

/// The settings of one client, in the order they were made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    list: Vec<(String, String)>,
    /// What the startup packet set: `RESET` goes back to these, as on Postgres, where they
    /// are the session's defaults.
    startup: Vec<(String, String)>,
    /// `fingerprint()`, kept current: it is compared on every checkout.
    fp: u64,
    /// `is_fragile()`, kept current with `fp`.
    fragile: bool,
    /// `has_custom()`, kept current with `fp`.
    custom: bool,
}

impl Settings {
    /// Settings from a startup packet: every parameter except the connection's identity, and
    /// the `-c name=value` switches of `options`. `client_encoding` UTF8 is what backend
    /// connections use anyway, so it is left out.
    pub fn from_startup(params: &[(String, String)]) -> Settings {
        let mut s = Settings::default();
        for (name, value) in params {
            let lower = name.to_ascii_lowercase();
            if NOT_SETTINGS.contains(&lower.as_str()) {
                if lower == "options" {
                    for (n, v) in parse_options(value) {
                        s.set(&n, startup_value(&n, &v));
                    }
                }
                continue;
            }
            if lower == "client_encoding" && is_utf8(value) {
                continue;
            }
            s.set(&lower, startup_value(&lower, value));
        }
        s.startup = s.list.clone();
        s.refresh();
        s
    }

    fn set(&mut self, name: &str, value: String) {
        let name = name.to_ascii_lowercase();
        let value = match (name.as_str(), self.get("datestyle")) {
            ("datestyle", Some(old)) => datestyle::merge(old, &value),
            _ => value,
        };
        if name == "session_authorization" {
            // A new session user drops the role set before it, as on Postgres.
            self.list.retain(|(n, _)| n != "role");
        }
        match self.list.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = value,
            None => self.list.push((name, value)),
        }
    }

    /// Applies a change; `false` when the change cannot be followed (the caller must treat the
    /// connection's settings as unknown).
    pub fn apply(&mut self, change: &Change) -> bool {
        match change {
            Change::Set { name, value } => self.set(name, value.clone()),
            Change::Reset { name } => {
                let name = name.to_ascii_lowercase();
                if name == "session_authorization" {
                    // As on Postgres, a change of session user drops the role.
                    self.list.retain(|(n, _)| n != "role");
                }
                // Back to the startup value as it was (a DateStyle is not merged into it).
                let startup = self.startup.iter().find(|(n, _)| *n == name).cloned();
                self.list.retain(|(n, _)| *n != name);
                if let Some((_, v)) = startup {
                    self.set(&name, v);
                }
            }
            Change::ResetAll => {
                let kept: Vec<_> = self
                    .list
                    .iter()
                    .filter(|(n, _)| NO_RESET_ALL.contains(&n.as_str()))
                    .cloned()
                    .collect();
                self.list = self.startup.clone();
                for (name, value) in kept {
                    self.set(&name, value);
                }
            }
            Change::DiscardAll => self.list = self.startup.clone(),
            Change::Local(_) => {}
            Change::Unknown => return false,
        }
        self.refresh();
        true
    }

    /// Whether `change` resets a setting the startup packet made (`RESET ALL` every one).
    fn resets_startup(&self, change: &Change) -> bool {
        match change {
            Change::ResetAll | Change::DiscardAll => !self.startup.is_empty(),
            Change::Reset { name } => self
                .startup
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name)),
            _ => false,
        }
    }

    /// 0 for no settings (a fresh connection), otherwise a hash of the settings in order.
    pub fn fingerprint(&self) -> u64 {
        self.fp
    }

    /// Whether giving these settings to another connection may fail although the client's own
    /// `SET`s succeeded (one is not in [`SAFE_AGAIN`]: `SET ROLE`, say, after the membership
    /// was revoked). Then the router waits for their answer before it writes the statement,
    /// which must never run without them: it could answer differently, or run as another
    /// user. Safe settings go out in the same write as the statement.
    pub fn is_fragile(&self) -> bool {
        self.fragile
    }

    /// Whether a custom setting is set: one whose name has a dot, an extension's or the
    /// router's own (`shardgate.*`). Few sessions set one, and a session that sets none need
    /// not look its names up on every statement.
    pub fn has_custom(&self) -> bool {
        self.custom
    }

    fn refresh(&mut self) {
        self.fp = self.compute_fingerprint();
        self.custom = self.list.iter().any(|(name, _)| name.contains('.'));
        self.fragile = self.list.iter().any(|(name, value)| {
            let safe = name.contains('.')
                || name.starts_with("enable_")
                || SAFE_AGAIN.contains(&name.as_str());
            !safe || !is_plain(value)
        });
    }

    fn compute_fingerprint(&self) -> u64 {
        if self.list.is_empty() {
            return 0;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.list.hash(&mut h);
        match h.finish() {
            0 | UNKNOWN => 1,
            f => f,
        }
    }

    /// Writes the Queries that give a connection holding settings `conn_fp` these settings,
    /// when they differ ([`Settings::write_all`]); how many it wrote (their replies, each up to
    /// its ReadyForQuery, come first).
    pub fn write_apply(
        &self,
        conn_fp: u64,
        out: &mut bytes::BytesMut,
    ) -> Result<usize, crate::protocol::request::Unwritable> {
        if conn_fp == self.fp {
            return Ok(0);
        }
        self.write_all(out)
    }

    /// Writes the Queries that give a connection exactly these settings, and says how many:
    /// first [`RESET_SQL`] alone, then the `SET`s. Two Queries, because one is one implicit
    /// transaction: a `SET` that fails there (a role whose membership was revoked since) would
    /// undo the reset with it, and leave the last client's role and settings in place.
    pub fn write_all(
        &self,
        out: &mut bytes::BytesMut,
    ) -> Result<usize, crate::protocol::request::Unwritable> {
        crate::protocol::request::query(out, RESET_SQL)?;
        if self.list.is_empty() {
            return Ok(1);
        }
        crate::protocol::request::query(out, &self.set_sql())?;
        Ok(2)
    }

    /// The client's `SET`s, in order (empty for none).
    pub fn set_sql(&self) -> String {
        let mut sql = String::new();
        for (name, value) in &self.list {
            if !sql.is_empty() {
                sql.push_str("; ");
            }
            sql.push_str("SET ");
            sql.push_str(&quote_name(name));
            sql.push_str(" = ");
            sql.push_str(value);
        }
        sql
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The settings changes of the statement or transaction under way: kept when it ends well (at
/// ReadyForQuery idle), dropped at ROLLBACK.
#[derive(Debug, Default)]
pub struct Changes(Vec<Change>, Vec<String>, Option<Several>, Savepoints);

/// The transaction's savepoints, each with how many changes came before it: `ROLLBACK TO`
/// undoes the changes made since, `RELEASE` keeps them. `lost` when a savepoint command could
/// not be read (its name): the changes are then kept, and the connection reset after the
/// transaction ([`UNKNOWN`]), so whatever Postgres undid reaches no other client.
#[derive(Debug, Default)]
struct Savepoints {
    marks: Vec<(String, usize, usize)>,
    lost: bool,
}

/// The savepoint a `SAVEPOINT`, `ROLLBACK TO` or `RELEASE` statement names (`sql`, the text
/// of one statement), folded as Postgres folds names; `None` for anything else.
fn savepoint_name(sql: &str) -> Option<String> {
    let text = sql.trim().trim_end_matches(';').trim();
    if text.contains(';') {
        return None;
    }
    let name = text.split_whitespace().last()?;
    if name.len() >= 2 && name.starts_with('"') && name.ends_with('"') {
        return Some(name[1..name.len() - 1].replace("\"\"", "\""));
    }
    (!name.contains('"')).then(|| name.to_ascii_lowercase())
}

/// A Query of several statements, all `SET`/`RESET`, whose changes were taken whole at its
/// first completion: the text (its other completions add nothing), and where its changes
/// start (an error in it undoes them all, as Postgres undoes its implicit transaction).
#[derive(Debug)]
struct Several {
    sql: String,
    from: usize,
}

impl Changes {
    /// A SET, RESET or DISCARD completed; `sql` is the text of the statement, or of the Query
    /// it is one statement of.
    pub fn push(&mut self, sql: &str) {
        if self.2.as_ref().is_some_and(|s| s.sql == sql) {
            return;
        }
        self.2 = None;
        if let Some(all) = several_changes(sql).or_else(|| characteristics(sql)) {
            self.2 = Some(Several {
                sql: sql.to_string(),
                from: self.0.len(),
            });
            self.0.extend(all);
            self.1.push(sql.to_string());
            return;
        }
        self.0.push(parse_change(sql));
        self.1.push(sql.to_string());
    }

    /// The Query under way got its ReadyForQuery: a later error is not its.
    pub fn query_over(&mut self) {
        self.2 = None;
    }

    /// A statement failed: the changes of a Query of several statements that it belongs to
    /// are undone with the Query's implicit transaction (inside a transaction block, the
    /// client's ROLLBACK undoes them anyway).
    pub fn failed(&mut self) {
        if let Some(s) = self.2.take() {
            self.0.truncate(s.from);
            self.1.pop();
        }
    }

    /// The value of setting `name` as the statements still under way left it: `None` when
    /// they did not touch it, `Some(None)` when they reset it (a `SET LOCAL` counts here, it
    /// lasts until the transaction ends).
    pub fn get(&self, name: &str) -> Option<Option<&str>> {
        for change in self.0.iter().rev() {
            let (n, v) = match change {
                Change::Set { name, value } => (name, Some(value)),
                Change::Reset { name } => (name, None),
                Change::Local(Some((name, value))) => (name, value.as_ref()),
                // (A startup value is not looked for: it is the rare case, and none is safe.)
                Change::ResetAll | Change::DiscardAll => return Some(None),
                _ => continue,
            };
            if n.eq_ignore_ascii_case(name) {
                return Some(v.map(String::as_str));
            }
        }
        None
    }

    /// Setting `name` as the session's statements see it now: `settings`, changed by what is
    /// still under way.
    pub fn current<'s>(&'s self, settings: &'s Settings, name: &str) -> Option<&'s str> {
        match self.get(name) {
            Some(pending) => pending,
            None => settings.get(name),
        }
    }

    /// Nothing changed so far.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The texts of the statements that made the changes, in order (for another shard of the
    /// same transaction).
    pub fn texts(&self) -> &[String] {
        &self.1
    }

    /// The transaction rolled back: its changes are undone.
    pub fn rollback(&mut self) {
        self.0.clear();
        self.1.clear();
        self.2 = None;
        self.3 = Savepoints::default();
    }

    /// `SAVEPOINT` (`sql`) completed.
    pub fn savepoint(&mut self, sql: &str) {
        match savepoint_name(sql) {
            Some(name) => self.3.marks.push((name, self.0.len(), self.1.len())),
            None => self.3.lost = true,
        }
    }

    /// `ROLLBACK` completed (`sql`): of the whole transaction, or to a savepoint, which undoes
    /// the changes made since it.
    pub fn rolled_back(&mut self, sql: &str) {
        let to = sql
            .split_whitespace()
            .take(3)
            .any(|w| w.eq_ignore_ascii_case("to"));
        if !to {
            return self.rollback();
        }
        let mark = savepoint_name(sql)
            .and_then(|name| self.3.marks.iter().rposition(|(n, _, _)| *n == name));
        match mark {
            Some(i) => {
                let (_, changes, texts) = self.3.marks[i];
                self.3.marks.truncate(i + 1);
                self.0.truncate(changes);
                self.1.truncate(texts);
                self.2 = None;
            }
            None => self.3.lost = true,
        }
    }

    /// `RELEASE` (`sql`) completed: the changes since the savepoint stay.
    pub fn released(&mut self, sql: &str) {
        let mark = savepoint_name(sql)
            .and_then(|name| self.3.marks.iter().rposition(|(n, _, _)| *n == name));
        match mark {
            Some(i) => self.3.marks.truncate(i),
            None => self.3.lost = true,
        }
    }

    /// The statement or transaction is over: applies its changes to `settings` and returns the
    /// fingerprint of what the connection now holds ([`UNKNOWN`] after a change the router
    /// cannot follow), or `None` when nothing changed.
    pub fn settle(&mut self, settings: &mut Settings) -> Option<u64> {
        let lost = std::mem::take(&mut self.3).lost;
        if self.0.is_empty() {
            return lost.then_some(UNKNOWN);
        }
        let mut known = !lost;
        for change in self.0.drain(..) {
            // On the connection, RESET goes back to the server's default, where the client's
            // is its startup value: the connection holds what the router does not expect.
            known &= !settings.resets_startup(&change);
            known &= settings.apply(&change);
        }
        self.1.clear();
        self.2 = None;
        Some(if known {
            settings.fingerprint()
        } else {
            UNKNOWN
        })
    }
}

/// A startup parameter's value as the SQL that sets it again: a string literal, except for the
/// lists of names (`search_path`, `temp_tablespaces`), which `SET` would read as one name:
/// `search_path=app,public` is `SET search_path = "app", "public"`, each name folded to lower
/// case unless it was quoted, as Postgres reads the parameter. `name` is in lower case.
fn startup_value(name: &str, value: &str) -> String {
    if !matches!(name, "search_path" | "temp_tablespaces") || value.trim().is_empty() {
        return quote_literal(value);
    }
    let mut names = Vec::new();
    let (mut item, mut quoted, mut in_quote) = (String::new(), false, false);
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if in_quote && chars.peek() == Some(&'"') => {
                chars.next();
                item.push('"');
            }
            '"' => {
                in_quote = !in_quote;
                quoted = true;
            }
            ',' if !in_quote => {
                names.push(std::mem::take(&mut item));
                quoted = false;
            }
            c if in_quote || !c.is_whitespace() => {
                if quoted {
                    item.push(c);
                } else {
                    item.extend(c.to_lowercase());
                }
            }
            _ => {}
        }
    }
    names.push(item);
    let names: Vec<String> = names
        .iter()
        .map(|n| shardmap::sql::quote_ident_always(n))
        .collect();
    names.join(", ")
}

/// Whether a setting's value, as the client wrote it, reads the same in the replay as it did
/// in the client's `SET`, whatever the settings before it: a list of numbers, words, quoted
/// identifiers and quoted strings without a backslash (`standard_conforming_strings` reads
/// those two ways). `INTERVAL '+02:00' HOUR TO MINUTE` is not one: replayed as
/// `SET timezone = INTERVAL ...` it is a syntax error.
fn is_plain(value: &str) -> bool {
    let b = value.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'+' | b'-');
    let skip_spaces = |mut i: usize| {
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
        i
    };
    let mut i = skip_spaces(0);
    loop {
        match b.get(i) {
            Some(&q @ (b'\'' | b'"')) => {
                i += 1;
                loop {
                    match b.get(i) {
                        None | Some(b'\\') => return false,
                        Some(&c) if c == q && b.get(i + 1) == Some(&q) => i += 2,
                        Some(&c) if c == q => break,
                        Some(_) => i += 1,
                    }
                }
                i += 1;
            }
            Some(&c) if word(c) => {
                while b.get(i).is_some_and(|&c| word(c)) {
                    i += 1;
                }
            }
            _ => return false,
        }
        i = skip_spaces(i);
        match b.get(i) {
            None => return true,
            Some(b',') => i = skip_spaces(i + 1),
            Some(_) => return false,
        }
    }
}

fn is_utf8(v: &str) -> bool {
    matches!(
        v.to_ascii_lowercase().replace(['-', '_'], "").as_str(),
        "utf8" | "unicode"
    )
}

/// Setting names are identifiers, possibly dotted (`app.user`). Every part is quoted: a part
/// may be a reserved word, and Postgres looks setting names up without regard to case.
fn quote_name(name: &str) -> String {
    name.split('.')
        .map(shardmap::sql::quote_ident_always)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests;
