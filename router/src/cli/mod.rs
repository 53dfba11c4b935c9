//! Command line of the `shardgate` binary.
//!
//! Subcommands that only read or write shard maps live in [`maps`]; they do no network I/O
//! and are safe to run anywhere, e.g. in deploy scripts.

mod log;
mod maps;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// shardgate: a sharded query router for PostgreSQL.
///
/// Run a router with `shardgate --config router.toml`: it listens for Postgres clients (psql,
/// pgbench, any driver) and sends each statement to the shard that owns its key. The config
/// format is described in docs/configuration.md. The subcommands below work on shard maps and
/// need no running router.
#[derive(Parser, Debug)]
#[command(name = "shardgate", version, about, long_about)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// Run a router with this config file (router.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// With --config: check the config and its shard map, print a summary and exit.
    #[arg(long, requires = "config")]
    pub check: bool,
    /// Log filter, e.g. `info`, `debug`, `shardgate=debug` (the RUST_LOG syntax). Default: info,
    /// or RUST_LOG when set.
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Worker threads of the router (default: one per CPU core). Each runs its own event loop
    /// with its own listening socket and its own backend pools, so [pool] max_size applies per
    /// worker.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the keyspace ID (16 hex digits) and the owning shard range of each KEY.
    ///
    /// One line per key: `KEYSPACE_ID RANGE`. The key is read as the table's key type
    /// (bigint, integer, smallint, text or uuid).
    Locate {
        /// The shard map file (shardmap.toml).
        #[arg(long, value_name = "FILE")]
        shardmap: PathBuf,
        /// The sharded table, as named in the map (e.g. `kv` or `app.kv`).
        #[arg(long)]
        table: String,
        /// Key values; negative numbers are fine (`-- -5` is not needed).
        #[arg(
            required = true,
            allow_negative_numbers = true,
            allow_hyphen_values = true
        )]
        keys: Vec<String>,
    },
    /// Generate, split, check and audit shard maps.
    #[command(subcommand)]
    Shardmap(maps::ShardmapCommand),
    /// Split a shard online into its two halves: plan, start, status, verify, cutover,
    /// cleanup (or run: start, wait, cutover). See docs/resharding.md.
    #[command(subcommand)]
    Reshard(reshard::ReshardCommand),
    /// Print where a statement would run and why, without a network: one row per shard, as
    /// `EXPLAIN (ROUTE) statement` answers through a running router.
    ///
    /// Key values are read from the statement's literals. The router's knowledge of the shards'
    /// catalog is not at hand here, so an INSERT without a column list is shown as refused.
    Explain {
        /// The router's config (router.toml); its shard map is read too.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The statement, e.g. "SELECT * FROM kv WHERE id = 42".
        sql: String,
    },
}

/// Runs a parsed command line; the error is the message to print.
pub fn run(args: Args) -> Result<std::process::ExitCode, String> {
    if let Some(Command::Reshard(cmd)) = args.command {
        return reshard::run(cmd);
    }
    run_other(args).map(|()| std::process::ExitCode::SUCCESS)
}

fn run_other(args: Args) -> Result<(), String> {
    match (args.command, args.config) {
        (
            Some(Command::Locate {
                shardmap,
                table,
                keys,
            }),
            _,
        ) => maps::locate(&shardmap, &table, &keys),
        (Some(Command::Shardmap(cmd)), _) => maps::run(cmd),
        (Some(Command::Explain { config, sql }), _) => explain(&config, &sql),
        (Some(Command::Reshard(_)), _) => Err("internal error: reshard is run apart".into()),
        (None, Some(config)) => serve(&config, args.check, args.log.as_deref(), args.threads),
        (None, None) => Err("nothing to do: run a router with --config FILE, or see --help".into()),
    }
}

/// `shardgate explain`.
fn explain(config: &std::path::Path, sql: &str) -> Result<(), String> {
    use crate::resolver::{self, explain, Context, Transaction};
    let config = crate::config::load(config).map_err(|e| e.to_string())?;
    let map = std::sync::Arc::new(shardmap::load(&config.shardmap).map_err(|e| e.to_string())?);
    let planner = crate::planner::Planner::new(map.clone(), 16);
    let mut buf = crate::planner::NormalizeBuf::new();
    let (inner, planned) = match crate::planner::explain_route_inner(sql) {
        Some(inner) => (inner, planner.plan(inner, &mut buf)),
        None => (sql, planner.plan(sql, &mut buf)),
    };
    let stmt = resolver::Statement::from_text(inner, &planned);
    let cx = Context {
        map: &map,
        transaction: Transaction::None,
        pins: Default::default(),
        allow_scatter_writes: config.transactions.scatter_writes,
        cross_shard: false,
        keeps: Default::default(),
    };
    let target = resolver::resolve(&stmt, &cx);
    let rows: Vec<Vec<String>> = explain::rows(&target, inner)
        .iter()
        .map(|r| {
            r.values("miss")
                .iter()
                .take(explain::COLUMNS.len() - 1)
                .map(|v| v.unwrap_or("").to_string())
                .collect()
        })
        .collect();
    println!("{target}");
    print!(
        "{}",
        table(&explain::COLUMNS[..explain::COLUMNS.len() - 1], &rows)
    );
    Ok(())
}

/// Rows as an aligned text table, as psql prints them.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, v) in width.iter_mut().zip(row) {
            *w = (*w).max(v.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!(" {}\n", padded.join(" | ").trim_end())
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push_str(&format!(
        "{}\n",
        width
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("+")
    ));
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

fn serve(
    config: &std::path::Path,
    check: bool,
    log: Option<&str>,
    threads: Option<usize>,
) -> Result<(), String> {
    let workers = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let shared = crate::server::load(config, workers)?;
    if check {
        println!(
            "{}: ok: listen {}, database {:?}, {} shards (shard map version {}), {} users",
            config.display(),
            shared.routing().config.listen,
            shared.routing().config.database,
            shared.routing().map.shards().len(),
            shared.routing().map.version(),
            shared.routing().config.users.len()
        );
        return Ok(());
    }
    let filter = match log {
        Some(f) => {
            tracing_subscriber::EnvFilter::try_new(f).map_err(|e| format!("--log {f:?}: {e}"))?
        }
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let config = &shared.routing().config;
    log::init(filter, config.log_format, config.router_id);
    crate::server::run(shared)
}
