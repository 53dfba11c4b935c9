//! Temporary objects that outlive their transaction: the one kind of session state the router
//! cannot carry from connection to connection (settings it follows, prepared statements it
//! prepares again, cursors it serves). A session that makes one keeps the connection it was
//! made on until it leaves (`session::attach`), as a session pooler would; everything else
//! stays transaction-pooled.

use sqlparser::ast::{ObjectName, OnCommit, SetExpr, Statement};

/// Whether `stmt` creates a temporary object that lives past the end of its transaction: a
/// temporary table (unless `ON COMMIT DROP`), view or sequence, or `SELECT ... INTO TEMP`.
/// A view over a temporary table is made temporary by Postgres without saying so; it is made
/// on the connection the session keeps by then, so it needs no keeping of its own.
pub(crate) fn outlives_transaction(stmt: &Statement) -> bool {
    match stmt {
        // (`pg_temp.t` is a temporary table without the word.)
        Statement::CreateTable(ct) => {
            (ct.temporary || in_pg_temp(&ct.name)) && ct.on_commit != Some(OnCommit::Drop)
        }
        Statement::CreateView(cv) => cv.temporary || in_pg_temp(&cv.name),
        Statement::CreateSequence {
            temporary, name, ..
        } => *temporary || in_pg_temp(name),
        Statement::CreateFunction(f) => in_pg_temp(&f.name),
        Statement::Query(q) => match q.body.as_ref() {
            SetExpr::Select(s) => s
                .into
                .as_ref()
                .is_some_and(|into| into.temporary || into.targets.iter().any(names_pg_temp)),
            _ => false,
        },
        Statement::Explain {
            statement, analyze, ..
        } => *analyze && outlives_transaction(statement),
        _ => false,
    }
}

/// Whether `name` is schema-qualified by `pg_temp`, the session's own schema.
fn in_pg_temp(name: &ObjectName) -> bool {
    name.0.len() > 1
        && name.0[0]
            .as_ident()
            .is_some_and(|i| i.value.eq_ignore_ascii_case("pg_temp"))
}

/// Whether an `INTO` target is a name in `pg_temp`.
fn names_pg_temp(target: &sqlparser::ast::Expr) -> bool {
    use sqlparser::ast::Expr;
    match target {
        Expr::CompoundIdentifier(parts) => {
            parts.len() > 1 && parts[0].value.eq_ignore_ascii_case("pg_temp")
        }
        _ => false,
    }
}

/// Whether a word of `text` is `temp` or `temporary` (any case): for texts the planner cannot
/// parse, and those it will not share a connection for.
pub(crate) fn mentioned(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .any(|w| w.eq_ignore_ascii_case("temp") || w.eq_ignore_ascii_case("temporary"))
}

#[cfg(test)]
mod tests {
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn outlives(sql: &str) -> bool {
        let parsed = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect(sql);
        parsed.iter().any(super::outlives_transaction)
    }

    #[test]
    fn temporary_objects_that_outlive_their_transaction() {
        for sql in [
            "CREATE TEMP TABLE t (x int)",
            "CREATE TEMPORARY TABLE t (x int) ON COMMIT DELETE ROWS",
            "create temp table t as select 1",
            "CREATE TEMP VIEW v AS SELECT 1",
            "CREATE TEMP SEQUENCE s",
            "SELECT 1 AS x INTO TEMP t",
            "SELECT 1; CREATE TEMP TABLE t (x int)",
            "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "CREATE TABLE pg_temp.t (x int)",
            "SELECT 1 AS x INTO pg_temp.t",
            "CREATE VIEW PG_TEMP.v AS SELECT 1",
            "CREATE SEQUENCE pg_temp.s",
        ] {
            assert!(outlives(sql), "{sql}");
        }
        for sql in [
            "CREATE TEMP TABLE t (x int) ON COMMIT DROP",
            "CREATE TABLE t (x int)",
            "CREATE VIEW v AS SELECT 1",
            "SELECT 1 AS x INTO t",
            "SELECT * FROM temp",
            "EXPLAIN SELECT 1 AS x INTO TEMP t",
        ] {
            assert!(!outlives(sql), "{sql}");
        }
    }
}
