//! `shardgate locate` and `shardgate shardmap ...`: shard map tools for people and scripts.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Subcommand};
use shardmap::{predicate, KeyRange, KeyType, ShardMap, Table};

#[derive(Subcommand, Debug)]
pub enum ShardmapCommand {
    /// Print a new shard map: an even split into N shards, or one shard of a map split in two.
    ///
    /// Even split: `--shards N --primary URL_TEMPLATE [--primary ...]`. In a template,
    /// `{index}` is the shard's number from 0 and `{index:3}` the same padded with zeros to
    /// 3 digits; with several templates, shards take them in turn (shard i uses template
    /// i mod count), which spreads shards over servers.
    ///
    /// Shard split: `--shardmap FILE --range RANGE --high-primary URL`. The lower half stays
    /// on the shard's primary (or `--low-primary`), the upper half goes to `--high-primary`,
    /// and the version is bumped.
    #[command(group(ArgGroup::new("mode").required(true).args(["shards", "shardmap"])))]
    Split {
        /// Even split: the number of shards, 1 to 4096.
        #[arg(long, requires = "primary", conflicts_with_all = ["shardmap", "range"])]
        shards: Option<usize>,
        /// Even split: primary URL template(s), e.g. postgres://app@10.0.0.{index}:5432/app.
        #[arg(long, value_name = "URL_TEMPLATE")]
        primary: Vec<String>,
        /// Even split: a sharded table as NAME:KEY:TYPE (repeatable); default kv:id:bigint.
        #[arg(long, value_name = "NAME:KEY:TYPE")]
        table: Vec<String>,
        /// Even split: the version of the new map.
        #[arg(long, default_value_t = 1)]
        version: u64,
        /// Shard split: the map that holds the shard.
        #[arg(long, value_name = "FILE", requires_all = ["range", "high_primary"])]
        shardmap: Option<PathBuf>,
        /// Shard split: the exact range of the shard to split, e.g. 40-80 or -80.
        #[arg(long, allow_hyphen_values = true)]
        range: Option<String>,
        /// Shard split: primary URL of the lower half (default: the shard's current primary).
        #[arg(long, value_name = "URL")]
        low_primary: Option<String>,
        /// Shard split: primary URL of the upper half (a different database).
        #[arg(long, value_name = "URL")]
        high_primary: Option<String>,
    },
    /// Print the SQL predicate that selects exactly one shard's rows of a table.
    ///
    /// With a RANGE, prints that shard's predicate; without, prints `RANGE<TAB>PREDICATE` for
    /// every shard. Audit a shard with
    /// `SELECT count(*) FROM TABLE WHERE NOT (PREDICATE)`: it counts misplaced rows.
    Predicate {
        /// The shard map file.
        #[arg(long, value_name = "FILE")]
        shardmap: PathBuf,
        /// The sharded table, as named in the map.
        #[arg(long)]
        table: String,
        /// The shard's range, e.g. 40-80 or -80; all shards when left out.
        #[arg(allow_hyphen_values = true)]
        range: Option<String>,
    },
    /// Validate a shard map; prints a summary, or every problem with its line.
    Check {
        /// The shard map file.
        file: PathBuf,
    },
}

pub fn run(cmd: ShardmapCommand) -> Result<(), String> {
    let out = match cmd {
        ShardmapCommand::Split {
            shards: Some(n),
            primary,
            table,
            version,
            ..
        } => even_split(n, &primary, &table, version)?,
        ShardmapCommand::Split {
            shardmap: Some(file),
            range: Some(range),
            low_primary,
            high_primary: Some(high),
            ..
        } => {
            let map = load(&file)?;
            let range = parse_range(&range)?;
            let index = map
                .shard_by_range(&range)
                .ok_or_else(|| format!("{}: no shard has the range {range}", file.display()))?;
            let low = low_primary.unwrap_or_else(|| map.shards()[index].primary.url().to_string());
            map.split_shard(&range, &low, &high)
                .map_err(|e| e.to_string())?
                .to_toml()
        }
        ShardmapCommand::Split { .. } => {
            return Err("split needs either --shards N --primary URL_TEMPLATE, or --shardmap FILE --range RANGE --high-primary URL".into())
        }
        ShardmapCommand::Predicate {
            shardmap,
            table,
            range,
        } => {
            let map = load(&shardmap)?;
            let table = find_table(&map, &shardmap, &table)?;
            match range {
                Some(r) => {
                    let r = parse_range(&r)?;
                    map.shard_by_range(&r).ok_or_else(|| {
                        format!("{}: no shard has the range {r}", shardmap.display())
                    })?;
                    predicate::predicate(table, &r) + "\n"
                }
                None => map.shards().iter().fold(String::new(), |mut out, s| {
                    let _ = writeln!(out, "{}\t{}", s.range, predicate::predicate(table, &s.range));
                    out
                }),
            }
        }
        ShardmapCommand::Check { file } => {
            let map = load(&file)?;
            format!(
                "{}: ok: version {}, {} shards, {} sharded tables, {} reference tables, default shard {}\n",
                file.display(),
                map.version(),
                map.shards().len(),
                map.tables().len(),
                map.references().len(),
                map.shards()[map.default_shard()].range
            )
        }
    };
    print!("{out}");
    Ok(())
}

pub fn locate(file: &Path, table: &str, keys: &[String]) -> Result<(), String> {
    let map = load(file)?;
    let table = find_table(&map, file, table)?;
    let mut out = String::new();
    for text in keys {
        let key = table.key_type.parse_key(text).map_err(|e| e.to_string())?;
        let id = key.keyspace_id();
        let _ = writeln!(out, "{id} {}", map.shards()[map.shard_for(id)].range);
    }
    print!("{out}");
    Ok(())
}

fn load(file: &Path) -> Result<ShardMap, String> {
    shardmap::load(file).map_err(|e| e.to_string())
}

fn parse_range(text: &str) -> Result<KeyRange, String> {
    KeyRange::parse(text).map_err(|e| e.to_string())
}

fn find_table<'m>(map: &'m ShardMap, file: &Path, name: &str) -> Result<&'m Table, String> {
    map.table_by_name(name).ok_or_else(|| {
        let names: Vec<String> = map.tables().iter().map(Table::qualified_name).collect();
        format!(
            "{}: no sharded table {name:?}; the map shards: {}",
            file.display(),
            if names.is_empty() {
                "no tables".to_string()
            } else {
                names.join(", ")
            }
        )
    })
}

fn even_split(
    n: usize,
    templates: &[String],
    tables: &[String],
    version: u64,
) -> Result<String, String> {
    let tables = if tables.is_empty() {
        vec![Table::new("kv", "id", KeyType::BigInt)]
    } else {
        tables
            .iter()
            .map(|t| parse_table(t))
            .collect::<Result<_, _>>()?
    };
    if templates.is_empty() {
        return Err("--primary URL_TEMPLATE is required".into());
    }
    let urls = (0..n)
        .map(|i| expand_template(&templates[i % templates.len()], i))
        .collect::<Result<Vec<_>, _>>()?;
    let map = ShardMap::even_split(&urls, tables).map_err(|e| e.to_string())?;
    Ok(map.with_version(version).to_toml())
}

fn parse_table(spec: &str) -> Result<Table, String> {
    let bad = || format!("--table {spec:?}: write it as NAME:KEY:TYPE, e.g. kv:id:bigint");
    let mut parts = spec.split(':');
    let (Some(name), Some(key), Some(ty), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    if name.is_empty() || key.is_empty() {
        return Err(bad());
    }
    let ty = KeyType::parse(ty).ok_or_else(|| {
        format!(
            "--table {spec:?}: {ty:?} cannot be a sharding key; use one of: {}",
            KeyType::ACCEPTED
        )
    })?;
    Ok(Table::new(name, key, ty))
}

/// Replaces `{index}` and `{index:W}` in a URL template.
fn expand_template(template: &str, index: usize) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 4);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("template {template:?} has an unclosed '{{'"))?
            + open;
        match rest[open + 1..close].split_once(':') {
            None if &rest[open + 1..close] == "index" => {
                let _ = write!(out, "{index}");
            }
            Some(("index", width)) => {
                let width: usize = width
                    .parse()
                    .map_err(|_| format!("template {template:?}: {{index:W}} needs a number W"))?;
                let _ = write!(out, "{index:0width$}");
            }
            _ => {
                return Err(format!(
                    "template {template:?} has {:?}; only {{index}} and {{index:W}} are known",
                    &rest[open..=close]
                ))
            }
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_templates() {
        assert_eq!(
            expand_template("postgres://h/s{index:3}", 7).unwrap(),
            "postgres://h/s007"
        );
        assert_eq!(
            expand_template("postgres://h{index}/a", 12).unwrap(),
            "postgres://h12/a"
        );
        assert!(expand_template("postgres://h/{shard}", 1).is_err());
        assert!(expand_template("postgres://h/{index", 1).is_err());
    }

    #[test]
    fn parses_table_specs() {
        let t = parse_table("app.users:user_id:uuid").unwrap();
        assert_eq!(
            (t.schema.as_deref(), t.name.as_str(), t.key_type),
            (Some("app"), "users", KeyType::Uuid)
        );
        assert!(parse_table("kv:id").is_err());
        assert!(parse_table("kv:id:float")
            .unwrap_err()
            .contains("cannot be a sharding key"));
    }
}
