//! Connections the reshard steps open: to the source and target primaries (tokio-postgres,
//! plain TCP) and to the routers' admin consoles. Every error names the server it came from,
//! with its password left out.

use std::time::Duration;

use shardmap::sql::quote_literal;
use shardmap::Primary;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to one server, and what to call it in messages.
pub struct Db {
    pub client: Client,
    pub name: String,
}

/// The user a primary URL without one logs in as: `$PGUSER`, else `postgres` (as the router's
/// `[backend] user` default).
fn default_user() -> String {
    std::env::var("PGUSER").unwrap_or_else(|_| "postgres".into())
}

/// The login for `primary`: the URL's user and password, else `$PGUSER` (default `postgres`)
/// and `$PGPASSWORD`.
fn login_of(primary: &Primary) -> (String, Option<String>) {
    (
        primary.user.clone().unwrap_or_else(default_user),
        primary
            .password
            .clone()
            .or_else(|| std::env::var("PGPASSWORD").ok()),
    )
}

/// How to connect to `primary`, with [`login_of`]'s login.
fn config_of(primary: &Primary) -> tokio_postgres::Config {
    let (user, password) = login_of(primary);
    let mut config = tokio_postgres::Config::new();
    config
        .host(&primary.host)
        .port(primary.port)
        .dbname(&primary.database)
        .user(user)
        .application_name("shardgate reshard")
        // verify's checksum hashes rows as text: the same text on every server.
        .options("-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres -c extra_float_digits=3 -c bytea_output=hex")
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(p) = password {
        config.password(p);
    }
    config
}

/// A libpq connection string for `primary` (what a subscription on a target uses to reach
/// the source), with the same login as [`connect`].
pub fn conninfo(primary: &Primary) -> String {
    let value = |v: &str| {
        if !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/:".contains(c))
        {
            v.to_string()
        } else {
            format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
        }
    };
    let (user, password) = login_of(primary);
    let mut out = format!(
        "host={} port={} dbname={} user={}",
        value(&primary.host),
        primary.port,
        value(&primary.database),
        value(&user)
    );
    if let Some(p) = password {
        out.push_str(&format!(" password={}", value(&p)));
    }
    out
}

/// Connects to a primary; `role` says which one in errors ("the source", "target 60-80").
pub async fn connect(primary: &Primary, role: impl std::fmt::Display) -> Result<Db, String> {
    open(
        &config_of(primary),
        format!("{role} ({})", primary.endpoint()),
    )
    .await
}

/// Connects to a router's admin console (`postgres://USER:PASSWORD@HOST:PORT/shardgate`).
pub async fn connect_admin(url: &str) -> Result<Db, String> {
    let name = format!("router {}", shardmap::primary::redact(url));
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| format!("{name}: not a postgres:// URL: {e}"))?;
    open(&config, name).await
}

/// Connects with `config` within [`CONNECT_TIMEOUT`]; the connection runs on its own task.
async fn open(config: &tokio_postgres::Config, name: String) -> Result<Db, String> {
    let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(NoTls))
        .await
        .map_err(|_| format!("{name}: no answer in {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("{name}: cannot connect: {}", describe(&e)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Db { client, name })
}

/// A tokio-postgres error as one line: the server's message and SQLSTATE when it sent one.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            text
        }
    }
}

impl Db {
    /// Runs statements (simple protocol), failing with the statement that failed.
    pub async fn exec(&self, sql: &str) -> Result<(), String> {
        self.client
            .batch_execute(sql)
            .await
            .map_err(|e| format!("{}: {}\n  in: {}", self.name, describe(&e), first_line(sql)))
    }

    /// The rows of a query (simple protocol), every value as text (`None` for NULL).
    pub async fn rows(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
        let messages =
            self.client.simple_query(sql).await.map_err(|e| {
                format!("{}: {}\n  in: {}", self.name, describe(&e), first_line(sql))
            })?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect())
    }

    /// Whether the table (or other relation) `name` exists.
    pub async fn has_table(&self, name: &str) -> Result<bool, String> {
        let sql = format!("SELECT to_regclass({})", quote_literal(name));
        Ok(self.value(&sql).await?.is_some())
    }

    /// The oid of subscription `name` here, if there is one.
    pub async fn subscription_oid(&self, name: &str) -> Result<Option<String>, String> {
        let sql = format!(
            "SELECT oid FROM pg_subscription WHERE subname = {}",
            quote_literal(name)
        );
        self.value(&sql).await
    }

    /// The first value of the first row (`None` for no row or NULL).
    pub async fn value(&self, sql: &str) -> Result<Option<String>, String> {
        Ok(self
            .rows(sql)
            .await?
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next().flatten()))
    }
}

fn first_line(sql: &str) -> &str {
    let line = sql.lines().next().unwrap_or("");
    match line.char_indices().nth(160) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}
