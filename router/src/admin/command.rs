//! The admin console's commands, parsed from the text of a simple Query (sans-IO). Like
//! PgBouncer's console: one command per query, any case, an optional trailing `;`.

/// What `SHOW` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    Shards,
    Pools,
    Clients,
    Servers,
    Stats,
    Config,
    Version,
    Help,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Show(Show),
    Reload,
    /// A shard (its range or its number in the map), or every shard.
    Pause(Option<String>),
    Resume(Option<String>),
    Shutdown,
    /// `SET ...`: drivers send some at connect; accepted and ignored, as PgBouncer does.
    Set,
    /// An empty query.
    Empty,
}

/// The commands, for `SHOW HELP` and for the error on an unknown one.
pub const HELP: &[(&str, &str)] = &[
    (
        "SHOW SHARDS",
        "each shard: range, primary, up/down/paused, last error, pool",
    ),
    ("SHOW POOLS", "each backend pool: clients and connections"),
    ("SHOW CLIENTS", "each client connection"),
    ("SHOW SERVERS", "each backend connection"),
    (
        "SHOW STATS",
        "per shard: statements, errors, times, p50/p99 of the last minute",
    ),
    ("SHOW CONFIG", "the settings in use"),
    ("SHOW VERSION", "the router's version"),
    ("RELOAD", "re-read the config file and the shard map"),
    (
        "PAUSE [shard]",
        "new statements for the shard (or all; or a range a reload will bring) wait; transactions finish",
    ),
    ("RESUME [shard]", "undo PAUSE"),
    ("SHUTDOWN", "drain and stop the router, as SIGTERM does"),
];

/// Parses one command; the error says what is known.
pub fn parse(sql: &str) -> Result<Command, String> {
    let text = sql.trim().trim_end_matches(';').trim();
    if text.is_empty() {
        return Ok(Command::Empty);
    }
    let (word, rest) = text
        .split_once(char::is_whitespace)
        .map_or((text, ""), |(w, r)| (w, r.trim()));
    let argument = || {
        if rest.is_empty() {
            return Ok(None);
        }
        let a = rest.trim_matches(|c| c == '\'' || c == '"').trim();
        if a.is_empty() {
            return Err(format!(
                "{} of an empty shard name; leave it out for every shard",
                word.to_ascii_uppercase()
            ));
        }
        Ok(Some(a.to_string()))
    };
    let no_argument = |command: Command| {
        if rest.is_empty() {
            Ok(command)
        } else {
            Err(format!("{} takes no argument", word.to_ascii_uppercase()))
        }
    };
    match word.to_ascii_uppercase().as_str() {
        "SHOW" => {
            let what = match rest.to_ascii_uppercase().as_str() {
                "SHARDS" => Show::Shards,
                "POOLS" => Show::Pools,
                "CLIENTS" => Show::Clients,
                "SERVERS" => Show::Servers,
                "STATS" => Show::Stats,
                "CONFIG" => Show::Config,
                "VERSION" => Show::Version,
                "HELP" => Show::Help,
                other => return Err(format!("unknown SHOW {other:?}")),
            };
            Ok(Command::Show(what))
        }
        "HELP" => no_argument(Command::Show(Show::Help)),
        "RELOAD" => no_argument(Command::Reload),
        "PAUSE" => Ok(Command::Pause(argument()?)),
        "RESUME" => Ok(Command::Resume(argument()?)),
        "SHUTDOWN" => no_argument(Command::Shutdown),
        "SET" => Ok(Command::Set),
        other => Err(format!("unknown command {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_in_any_case() {
        assert_eq!(parse("show shards;"), Ok(Command::Show(Show::Shards)));
        assert_eq!(parse("  SHOW   Stats "), Ok(Command::Show(Show::Stats)));
        assert_eq!(parse("reload"), Ok(Command::Reload));
        assert_eq!(parse("PAUSE"), Ok(Command::Pause(None)));
        assert_eq!(
            parse("pause '-80';"),
            Ok(Command::Pause(Some("-80".into())))
        );
        assert_eq!(parse("RESUME 1"), Ok(Command::Resume(Some("1".into()))));
        assert_eq!(parse("SET application_name = 'x'"), Ok(Command::Set));
        assert_eq!(parse(" ; "), Ok(Command::Empty));
        assert_eq!(parse("SHUTDOWN"), Ok(Command::Shutdown));
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        assert_eq!(parse("SHOW TABLES"), Err("unknown SHOW \"TABLES\"".into()));
        assert_eq!(parse("SELECT 1"), Err("unknown command \"SELECT\"".into()));
        assert_eq!(parse("RELOAD now"), Err("RELOAD takes no argument".into()));
        assert!(parse("PAUSE ''").is_err_and(|e| e.contains("empty shard name")));
    }
}
