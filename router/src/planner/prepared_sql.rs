//! SQL-level `PREPARE`, `EXECUTE` and `DEALLOCATE`, read from a client's text.
//!
//! Under transaction pooling these cannot simply be forwarded: a statement prepared with SQL on
//! one backend connection is gone when the next transaction runs on another. The session turns
//! them into what it already does for protocol-level statements: `PREPARE name AS body` becomes
//! a named statement of the client (the same namespace, as in Postgres), `EXECUTE name(args)`
//! a Bind of the router-wide statement with the arguments as text parameters (which also lets the
//! key among them pick the shard), and `DEALLOCATE` forgets the client's name.
//!
//! Sans-IO: this module only reads text.

use sqlparser::ast::{DataType, Expr, Statement, UnaryOperator, Value};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, Tokenizer};

use super::pins::fold;
use crate::errors;
use crate::protocol::reply::SqlError;

/// One SQL-level prepared-statement command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreparedSql {
    /// `PREPARE name [(types)] AS body`: `param_types` is the Parse message's section (count +
    /// OIDs), `body` the statement's text exactly as the client wrote it.
    Prepare {
        name: String,
        param_types: Vec<u8>,
        body: String,
    },
    /// `EXECUTE name [(args)]`: each argument as a text parameter value (`None` is NULL).
    Execute {
        name: String,
        args: Vec<Option<String>>,
    },
    /// `DEALLOCATE [PREPARE] name`, or every statement (`ALL`) when `name` is `None`.
    Deallocate { name: Option<String> },
}

/// Reads a text the planner classified as one PREPARE, EXECUTE or DEALLOCATE.
pub fn read(sql: &str) -> Result<PreparedSql, SqlError> {
    let syntax = |e: String| SqlError::new(errors::SYNTAX_ERROR, e);
    let stmts = Parser::parse_sql(&PostgreSqlDialect {}, sql).map_err(|e| syntax(e.to_string()))?;
    let [stmt] = stmts.as_slice() else {
        return Err(unsupported(
            "PREPARE, EXECUTE and DEALLOCATE must be the only statement of their query",
        ));
    };
    match stmt {
        Statement::Prepare {
            name, data_types, ..
        } => {
            let mut param_types = Vec::with_capacity(2 + 4 * data_types.len());
            param_types.extend_from_slice(&(data_types.len() as u16).to_be_bytes());
            for t in data_types {
                param_types.extend_from_slice(&type_oid(t)?.to_be_bytes());
            }
            Ok(PreparedSql::Prepare {
                name: fold(name),
                param_types,
                body: body_after_as(sql)?.to_string(),
            })
        }
        Statement::Execute {
            name: Some(name),
            parameters,
            immediate: false,
            into,
            using,
            ..
        } if into.is_empty() && using.is_empty() && name.0.len() == 1 => {
            let ident = name.0[0]
                .as_ident()
                .ok_or_else(|| syntax("bad name".into()))?;
            let args = parameters
                .iter()
                .map(constant)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(PreparedSql::Execute {
                name: fold(ident),
                args,
            })
        }
        Statement::Deallocate { name, .. } => {
            let all = name.quote_style.is_none() && name.value.eq_ignore_ascii_case("all");
            Ok(PreparedSql::Deallocate {
                name: (!all).then(|| fold(name)),
            })
        }
        _ => Err(unsupported("this form of EXECUTE is not supported")),
    }
}

fn unsupported(message: &str) -> SqlError {
    SqlError::new(errors::FEATURE_NOT_SUPPORTED, message.to_string())
}

/// The text after the `AS` that ends the PREPARE header, untouched (sqlparser's rendering of
/// the statement could differ from what the client wrote).
fn body_after_as(sql: &str) -> Result<&str, SqlError> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| SqlError::new(errors::SYNTAX_ERROR, e.to_string()))?;
    let mut depth = 0i32;
    for t in &tokens {
        match &t.token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Word(w) if depth == 0 && w.keyword == Keyword::AS && w.quote_style.is_none() => {
                let end = t.span.end;
                let at =
                    super::values::byte_offset(sql, end.line, end.column).ok_or_else(|| {
                        SqlError::new(errors::SYNTAX_ERROR, "PREPARE without a statement")
                    })?;
                let body = sql[at..].trim();
                return Ok(body.strip_suffix(';').unwrap_or(body).trim_end());
            }
            _ => {}
        }
    }
    Err(SqlError::new(
        errors::SYNTAX_ERROR,
        "PREPARE needs AS and a statement",
    ))
}

/// An EXECUTE argument as a text parameter. Only constants: the router passes values, it does
/// not evaluate expressions.
fn constant(e: &Expr) -> Result<Option<String>, SqlError> {
    let not_constant = || {
        SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            format!("EXECUTE argument {e} is not a constant"),
        )
        .with_hint("through shardgate, EXECUTE takes numbers, strings, true/false and NULL; use a protocol-level prepared statement for computed values")
    };
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => Ok(Some(n.to_string())),
            Value::SingleQuotedString(s)
            | Value::EscapedStringLiteral(s)
            | Value::UnicodeStringLiteral(s) => Ok(Some(s.clone())),
            Value::DollarQuotedString(d) => Ok(Some(d.value.clone())),
            Value::Boolean(b) => Ok(Some(b.to_string())),
            Value::Null => Ok(None),
            _ => Err(not_constant()),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => Ok(Some(format!("-{n}"))),
                _ => Err(not_constant()),
            },
            _ => Err(not_constant()),
        },
        Expr::Nested(inner) => constant(inner),
        _ => Err(not_constant()),
    }
}

/// The OID of a parameter type named in PREPARE. Only built-in types with fixed OIDs: a user
/// type's OID differs per shard.
fn type_oid(t: &DataType) -> Result<u32, SqlError> {
    let name = t.to_string().to_ascii_lowercase();
    let base = name.split('(').next().unwrap_or("").trim();
    let oid = match base {
        "smallint" | "int2" => 21,
        "int" | "integer" | "int4" => 23,
        "bigint" | "int8" => 20,
        "text" => 25,
        "varchar" | "character varying" => 1043,
        "char" | "character" | "bpchar" => 1042,
        "bool" | "boolean" => 16,
        "uuid" => 2950,
        "numeric" | "decimal" => 1700,
        "real" | "float4" => 700,
        "double precision" | "float8" | "float" => 701,
        "date" => 1082,
        "time" | "time without time zone" => 1083,
        "timestamp" | "timestamp without time zone" => 1114,
        "timestamptz" | "timestamp with time zone" => 1184,
        "interval" => 1186,
        "json" => 114,
        "jsonb" => 3802,
        "bytea" => 17,
        "oid" => 26,
        _ => {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                format!("PREPARE with a parameter of type {t} is not supported through shardgate"),
            )
            .with_hint("leave the parameter types out (Postgres infers them), or cast inside the statement, e.g. $1::mytype"))
        }
    };
    Ok(oid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_keeps_the_body_as_written() {
        let p = read(
            "PREPARE Get_KV (bigint, text) AS\n  SELECT v FROM kv WHERE id = $1 AND v <> $2 ;",
        )
        .expect("prepare");
        let PreparedSql::Prepare {
            name,
            param_types,
            body,
        } = p
        else {
            panic!("{p:?}")
        };
        assert_eq!(name, "get_kv");
        assert_eq!(param_types, [0, 2, 0, 0, 0, 20, 0, 0, 0, 25]);
        assert_eq!(body, "SELECT v FROM kv WHERE id = $1 AND v <> $2");
        let p = read("prepare \"Q\" as select 'ü as' AS x").expect("prepare");
        assert_eq!(
            p,
            PreparedSql::Prepare {
                name: "Q".into(),
                param_types: vec![0, 0],
                body: "select 'ü as' AS x".into()
            }
        );
        assert!(read("PREPARE p (mytype) AS SELECT $1").is_err());
    }

    #[test]
    fn execute_takes_constants() {
        assert_eq!(
            read("EXECUTE q(1, -2.5, 'it''s', NULL, true)").expect("execute"),
            PreparedSql::Execute {
                name: "q".into(),
                args: vec![
                    Some("1".into()),
                    Some("-2.5".into()),
                    Some("it's".into()),
                    None,
                    Some("true".into())
                ]
            }
        );
        assert_eq!(
            read("EXECUTE q").expect("execute"),
            PreparedSql::Execute {
                name: "q".into(),
                args: vec![]
            }
        );
        let err = read("EXECUTE q(now())").expect_err("not constant");
        assert_eq!(err.code, "0A000");
    }

    #[test]
    fn deallocate_one_or_all() {
        assert_eq!(
            read("DEALLOCATE PREPARE Q").expect("deallocate"),
            PreparedSql::Deallocate {
                name: Some("q".into())
            }
        );
        assert_eq!(
            read("deallocate all").expect("deallocate"),
            PreparedSql::Deallocate { name: None }
        );
    }
}
