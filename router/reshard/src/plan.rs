//! A split of one shard as a plan: which shard, into which two ranges on which primaries, the
//! sharded tables, and the name of every object the split creates on the servers. `reshard
//! plan` writes it to a file an operator can read; every later step reads it back, so all
//! steps agree on the names. Also the SQL each step runs. Pure: the I/O is in the sibling
//! modules.
//!
//! Postgres selects the rows of a range itself: the publication of each new range filters rows
//! with the shard's placement predicate (`shardmap::predicate`, Postgres's own hash), so the
//! initial copy and the streamed changes both carry exactly that range's rows.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use shardmap::predicate::predicate;
use shardmap::sql::{quote_ident, quote_literal};
use shardmap::{KeyRange, KeyType, Primary, Reference, ShardMap, Table};

/// The schema the split keeps its own objects in, on the source and the targets: the marker
/// table that proves how far a target has applied, the record of subscriptions, the fence.
pub const SCHEMA: &str = "shardgate";
/// The marker table (in every publication, unfiltered).
pub const MARKER: &str = "shardgate.split_marker";
/// The record, on the source, of each target's subscription oid (for its table-sync slots).
pub const SUBSCRIPTIONS: &str = "shardgate.split_subscription";
/// The setting (`SET LOCAL`) that lets `cleanup --delete-moved` through the fence.
pub const FENCE_BYPASS: &str = "shardgate.split_cleanup";

const FORMAT: u32 = 1;

/// One of the two new shards.
#[derive(Clone, Debug)]
pub struct Part {
    pub range: KeyRange,
    pub primary: Primary,
    /// The part stays on the source's database: nothing is copied for it.
    pub stays: bool,
    /// The part is the default shard of the new map while the source was the default shard
    /// of the old: the tables the map does not shard are copied to it whole.
    pub gets_unsharded: bool,
}

/// The split of one shard.
#[derive(Clone, Debug)]
pub struct Plan {
    pub range: KeyRange,
    pub source: Primary,
    /// The version of the map the plan was made from; the cut-over refuses another.
    pub map_version: u64,
    pub parts: [Part; 2],
    /// The map's sharded tables (each filtered by key range).
    pub tables: Vec<Table>,
    /// The map's reference tables (copied whole to every new shard).
    pub references: Vec<Reference>,
}

#[derive(Serialize, Deserialize)]
struct PlanFile {
    format: u32,
    range: String,
    source: String,
    map_version: u64,
    part: Vec<PartFile>,
    table: Vec<TableFile>,
    /// Reference tables, by name (plans written before they existed have none).
    #[serde(default)]
    reference: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct PartFile {
    range: String,
    primary: String,
    stays: bool,
    gets_unsharded: bool,
}

#[derive(Serialize, Deserialize)]
struct TableFile {
    name: String,
    key: String,
    #[serde(rename = "type")]
    key_type: String,
}

/// Whether two primaries are the same database.
pub fn same_database(a: &Primary, b: &Primary) -> bool {
    a.endpoint() == b.endpoint()
}

impl Plan {
    /// Splits the shard of `range` in `map` into its two halves, the lower on `into[0]` and
    /// the upper on `into[1]`. One of them may be the source itself (that half stays).
    pub fn new(map: &ShardMap, range: &KeyRange, into: &[String]) -> Result<Plan, String> {
        let [low, high] = into else {
            return Err(format!(
                "--into is given {} times; give it twice: the primary of the lower half, then of the upper",
                into.len()
            ));
        };
        let index = map.shard_by_range(range).ok_or_else(|| {
            let ranges: Vec<String> = map.shards().iter().map(|s| s.range.to_string()).collect();
            format!(
                "no shard has the range {range}; the map's shards are {}",
                ranges.join(", ")
            )
        })?;
        let source = &map.shards()[index].primary;
        let stays = |url: &str| Primary::parse(url).is_ok_and(|p| same_database(&p, source));
        if stays(low) && stays(high) {
            return Err(
                "both halves are on the source's database: nothing would move; give at least one new primary"
                    .into(),
            );
        }
        if let (Ok(l), Ok(h)) = (Primary::parse(low), Primary::parse(high)) {
            if same_database(&l, &h) {
                return Err(format!(
                    "both halves are on {}: give two different databases",
                    l.endpoint()
                ));
            }
        }
        // The new map must be valid; this also checks both URLs.
        let new = map
            .split_shard(range, low, high)
            .map_err(|e| e.to_string())?;
        let source = source.clone();
        let was_default = map.default_shard() == index;
        let new_default = new.shards()[new.default_shard()].range;
        let part = |k: usize| {
            let shard = &new.shards()[index + k];
            Part {
                range: shard.range,
                primary: shard.primary.clone(),
                stays: same_database(&shard.primary, &source),
                gets_unsharded: was_default && shard.range == new_default,
            }
        };
        let parts = [part(0), part(1)];
        Ok(Plan {
            range: *range,
            source,
            map_version: map.version(),
            parts,
            // Lookup tables are sharded by their values, and move as any sharded table does.
            tables: map
                .tables()
                .iter()
                .map(|t| Table::new(&t.qualified_name(), &t.key, t.key_type))
                .chain(map.lookup_tables().map(|(_, _, lookup)| lookup))
                .collect(),
            references: map.references().to_vec(),
        })
    }

    /// The plan as the file `reshard plan` writes.
    pub fn to_toml(&self) -> String {
        let file = PlanFile {
            format: FORMAT,
            range: self.range.to_string(),
            source: self.source.url().to_string(),
            map_version: self.map_version,
            part: self
                .parts
                .iter()
                .map(|p| PartFile {
                    range: p.range.to_string(),
                    primary: p.primary.url().to_string(),
                    stays: p.stays,
                    gets_unsharded: p.gets_unsharded,
                })
                .collect(),
            table: self
                .tables
                .iter()
                .map(|t| TableFile {
                    name: t.qualified_name(),
                    key: t.key.clone(),
                    key_type: t.key_type.name().to_string(),
                })
                .collect(),
            reference: self
                .references
                .iter()
                .map(Reference::qualified_name)
                .collect(),
        };
        let body = toml::to_string(&file).unwrap_or_default();
        format!(
            "# A shard split, written by `shardgate reshard plan`; read by the reshard steps that follow\n# (start, status, verify, cutover, cleanup). Make a new plan rather than editing this one.\n{body}"
        )
    }

    /// Reads a plan file's text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Plan, String> {
        let file: PlanFile =
            toml::from_str(text).map_err(|e| format!("{origin}: not a reshard plan: {e}"))?;
        if file.format != FORMAT {
            return Err(format!(
                "{origin}: plan format {} (this shardgate reads format {FORMAT})",
                file.format
            ));
        }
        let bad = |what: &str, e: String| format!("{origin}: {what}: {e}");
        let range = KeyRange::parse(&file.range).map_err(|e| bad("range", e.to_string()))?;
        let source = Primary::parse(&file.source).map_err(|e| bad("source", e))?;
        let parts: Vec<Part> = file
            .part
            .iter()
            .map(|p| {
                Ok(Part {
                    range: KeyRange::parse(&p.range)
                        .map_err(|e| bad("part range", e.to_string()))?,
                    primary: Primary::parse(&p.primary).map_err(|e| bad("part primary", e))?,
                    stays: p.stays,
                    gets_unsharded: p.gets_unsharded,
                })
            })
            .collect::<Result<_, String>>()?;
        let parts: [Part; 2] = parts
            .try_into()
            .map_err(|_| format!("{origin}: a plan has exactly two [[part]]s"))?;
        if range.halves() != Some((parts[0].range, parts[1].range)) {
            return Err(format!(
                "{origin}: the parts' ranges are not the two halves of {range}"
            ));
        }
        let tables = file
            .table
            .iter()
            .map(|t| {
                let key_type = KeyType::parse(&t.key_type).ok_or_else(|| {
                    bad("table type", format!("unknown key type {:?}", t.key_type))
                })?;
                Ok(Table::new(&t.name, &t.key, key_type))
            })
            .collect::<Result<_, String>>()?;
        Ok(Plan {
            range,
            source,
            map_version: file.map_version,
            parts,
            tables,
            references: file.reference.iter().map(|r| Reference::new(r)).collect(),
        })
    }

    /// The parts whose rows move to another database.
    pub fn moving(&self) -> impl Iterator<Item = (usize, &Part)> {
        self.parts.iter().enumerate().filter(|(_, p)| !p.stays)
    }

    /// The new shard map: `current` (the map the routers run, which must still be the one the
    /// plan was made from) with the shard split.
    pub fn new_map(&self, current: &ShardMap) -> Result<ShardMap, String> {
        if current.version() != self.map_version {
            return Err(format!(
                "the shard map is at version {}, the plan was made from version {}: make a new plan",
                current.version(),
                self.map_version
            ));
        }
        let index = current
            .shard_by_range(&self.range)
            .ok_or_else(|| format!("the shard map has no shard {} (already split?)", self.range))?;
        if !same_database(&current.shards()[index].primary, &self.source) {
            return Err(format!(
                "shard {} is on {} in the shard map, the plan says {}",
                self.range,
                current.shards()[index].primary.endpoint(),
                self.source.endpoint()
            ));
        }
        current
            .split_shard(
                &self.range,
                self.parts[0].primary.url(),
                self.parts[1].primary.url(),
            )
            .map_err(|e| e.to_string())
    }

    /// A short name for this split, usable in identifiers: the range's bounds joined by `_`,
    /// `min` and `max` for open ends (`80_c0`, `min_80`).
    pub fn tag(&self) -> String {
        let text = self.range.to_string();
        let (start, end) = text.split_once('-').unwrap_or((&text, ""));
        let bound = |b: &str, open: &str| {
            if b.is_empty() {
                open.to_string()
            } else {
                b.to_string()
            }
        };
        format!("{}_{}", bound(start, "min"), bound(end, "max"))
    }

    /// The publication on the source, the subscription on the target and its slot on the
    /// source: one name for all three.
    pub fn part_name(&self, part: usize) -> String {
        format!("sg_split_{}_{part}", self.tag())
    }

    /// The sharded table of the map a catalog table is, if any.
    pub fn sharded(&self, schema: &str, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.matches(Some(schema), name))
    }

    /// Whether a catalog table is one of the map's reference tables.
    pub fn reference(&self, t: &CatalogTable) -> bool {
        self.references
            .iter()
            .any(|r| r.matches(Some(&t.schema), &t.name))
    }

    /// Whether part `p` gets all rows of a table the map does not shard: a reference table
    /// (every shard has it whole), or any such table when the part becomes the default shard.
    pub fn copied_whole(&self, p: &Part, t: &CatalogTable) -> bool {
        p.gets_unsharded || self.reference(t)
    }

    /// `CREATE PUBLICATION` of part `part`: each sharded table filtered to the part's range,
    /// reference tables whole, the other tables the map does not shard whole if the part gets
    /// them, and the marker.
    pub fn publication_sql(&self, part: usize, tables: &[CatalogTable]) -> String {
        let p = &self.parts[part];
        let mut list = Vec::new();
        for t in tables {
            match self.sharded(&t.schema, &t.name) {
                Some(sharded) => list.push(format!(
                    "{} WHERE ({})",
                    t.sql_name(),
                    predicate(sharded, &p.range)
                )),
                None if self.copied_whole(p, t) => list.push(t.sql_name()),
                None => {}
            }
        }
        list.push(MARKER.to_string());
        format!(
            "CREATE PUBLICATION {} FOR TABLE {}",
            quote_ident(&self.part_name(part)),
            list.join(", ")
        )
    }

    /// `CREATE SUBSCRIPTION` on part `part`'s primary, connecting to the source with
    /// `conninfo` (a libpq URL or key=value string), copying the existing rows first.
    pub fn subscription_sql(&self, part: usize, conninfo: &str) -> String {
        let name = self.part_name(part);
        format!(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (copy_data = true, create_slot = true, slot_name = {})",
            quote_ident(&name),
            quote_literal(conninfo),
            quote_ident(&name),
            quote_literal(&name)
        )
    }

    /// The predicate of the rows of `table` that move (the parts that do not stay).
    pub fn moved_predicate(&self, table: &Table) -> String {
        let parts: Vec<String> = self
            .moving()
            .map(|(_, p)| format!("({})", predicate(table, &p.range)))
            .collect();
        parts.join(" OR ")
    }

    fn fence_trigger(&self) -> String {
        format!("sg_fence_{}", self.tag())
    }

    fn fence_function(&self, n: usize) -> String {
        format!(
            "{SCHEMA}.{}",
            quote_ident(&format!("fence_{}_{n}", self.tag()))
        )
    }

    /// The fence on the source: from the cut-over on, a write of a moved row there (from a
    /// router that missed the new map, or anyone else) fails with 25006 instead of being
    /// lost. Row triggers, so they hold for connections already open; TRUNCATE is refused.
    pub fn fence_sql(&self, tables: &[CatalogTable]) -> Vec<String> {
        let mut sql = self.unfence_sql(tables);
        sql.extend(self.reference_streams(tables, "DROP"));
        let trigger = quote_ident(&self.fence_trigger());
        let message = format!(
            "shardgate: rows of {} moved to {} and {} when shard {} was split; this client's shard map is out of date",
            self.moving().map(|(_, p)| p.range.to_string()).collect::<Vec<_>>().join(" and "),
            self.parts[0].primary.endpoint(),
            self.parts[1].primary.endpoint(),
            self.range
        );
        for (n, t, moved) in self.fenced(tables) {
            let function = self.fence_function(n);
            let raise = format!(
                "RAISE EXCEPTION USING ERRCODE = 'read_only_sql_transaction', MESSAGE = {}",
                quote_literal(&message)
            );
            // `cleanup --delete-moved` sets the bypass for its own delete only (SET LOCAL).
            sql.push(format!(
                "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $fence$\n\
                 BEGIN\n\
                 IF current_setting({bypass}, true) = 'on' THEN\n  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;\n  RETURN NEW;\nEND IF;\n\
                 IF TG_OP = 'TRUNCATE' THEN {raise}; END IF;\n\
                 IF TG_OP IN ('UPDATE', 'DELETE') THEN\n  PERFORM 1 FROM (SELECT OLD.*) AS r WHERE {moved};\n  IF FOUND THEN {raise}; END IF;\nEND IF;\n\
                 IF TG_OP IN ('INSERT', 'UPDATE') THEN\n  PERFORM 1 FROM (SELECT NEW.*) AS r WHERE {moved};\n  IF FOUND THEN {raise}; END IF;\n  RETURN NEW;\nEND IF;\n\
                 RETURN OLD;\n\
                 END\n$fence$",
                bypass = quote_literal(FENCE_BYPASS)
            ));
            sql.push(format!(
                "CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW EXECUTE FUNCTION {function}()",
                t.sql_name()
            ));
            sql.push(format!(
                "CREATE TRIGGER {} BEFORE TRUNCATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
                quote_ident(&format!("{}_truncate", self.fence_trigger())),
                t.sql_name()
            ));
        }
        sql
    }

    /// The tables the fence covers, each with its number and the predicate of its moved rows:
    /// the sharded tables, the unsharded ones when they move with the default shard, and the
    /// reference tables when the source leaves the map (while it stays, it is a shard that
    /// every write of them reaches).
    fn fenced<'t>(&self, tables: &'t [CatalogTable]) -> Vec<(usize, &'t CatalogTable, String)> {
        let unsharded_move = self.moving().any(|(_, p)| p.gets_unsharded);
        let source_leaves = !self.parts.iter().any(|p| p.stays);
        tables
            .iter()
            .enumerate()
            .filter_map(|(n, t)| match self.sharded(&t.schema, &t.name) {
                Some(sharded) => Some((n, t, self.moved_predicate(sharded))),
                None if self.reference(t) => source_leaves.then(|| (n, t, "true".to_string())),
                None if unsharded_move => Some((n, t, "true".to_string())),
                None => None,
            })
            .collect()
    }

    /// The reference tables taken out of (`DROP`) or put back into (`ADD`) every moving part's
    /// publication. From the cut-over on, every router writes a reference table on the new
    /// shards itself; a change the source streamed on top would be applied twice. Each shard
    /// decodes the change stream with the catalog as of each change, so changes before the
    /// `DROP` still arrive (the marker waits for them) and none after it. Done already (a
    /// cut-over tried again) or without a publication (a cleanup) is no error.
    fn reference_streams(&self, tables: &[CatalogTable], verb: &str) -> Vec<String> {
        let mut sql = Vec::new();
        for t in tables.iter().filter(|t| self.reference(t)) {
            for (part, _) in self.moving() {
                sql.push(format!(
                    "DO $sg$ BEGIN ALTER PUBLICATION {} {verb} TABLE {}; EXCEPTION WHEN duplicate_object OR undefined_object THEN NULL; END $sg$",
                    quote_ident(&self.part_name(part)),
                    t.sql_name()
                ));
            }
        }
        sql
    }

    /// Takes the fence down (a rolled-back cut-over; also run before putting it up, so a
    /// cut-over tried again finds nothing in its way).
    pub fn unfence_sql(&self, tables: &[CatalogTable]) -> Vec<String> {
        let mut sql = Vec::new();
        sql.extend(self.reference_streams(tables, "ADD"));
        for (n, t, _) in self.fenced(tables) {
            for trigger in [
                self.fence_trigger(),
                format!("{}_truncate", self.fence_trigger()),
            ] {
                sql.push(format!(
                    "DROP TRIGGER IF EXISTS {} ON {}",
                    quote_ident(&trigger),
                    t.sql_name()
                ));
            }
            sql.push(format!(
                "DROP FUNCTION IF EXISTS {}()",
                self.fence_function(n)
            ));
        }
        sql
    }

    /// The marker row the cut-over writes once every router runs the new map: from then on the
    /// split counts as cut over (for `cleanup`).
    pub fn done_token(&self) -> String {
        format!("cut over {}", self.range)
    }

    /// Whether the fence is up: the SQL answers one row with `t` or `f`.
    pub fn fenced_sql(&self) -> String {
        format!(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = {})",
            quote_literal(&self.fence_trigger())
        )
    }

    /// A count and an order-independent checksum of the rows of `table` in `range`: on the
    /// source (where the shard's other rows are too) and on the part's primary, whose rows
    /// outside the range are counted apart (there must be none).
    pub fn verify_sql(&self, t: &CatalogTable, range: &KeyRange) -> String {
        let filter = match self.sharded(&t.schema, &t.name) {
            Some(sharded) => predicate(sharded, range),
            None => "true".into(),
        };
        format!(
            "SELECT count(*) FILTER (WHERE {filter}), \
             coalesce(sum(hashtextextended(r::text, 0)) FILTER (WHERE {filter}), 0)::text, \
             count(*) FILTER (WHERE ({filter}) IS NOT TRUE) FROM {} AS r",
            t.sql_name()
        )
    }

    /// What the plan does, for an operator.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "split shard {} (map version {}) on {}",
            self.range,
            self.map_version,
            self.source.endpoint()
        );
        for (i, p) in self.parts.iter().enumerate() {
            let what = if p.stays {
                "stays on the source".to_string()
            } else {
                format!(
                    "copied and streamed to {} (publication, subscription and slot {})",
                    p.primary.endpoint(),
                    self.part_name(i)
                )
            };
            let unsharded = if p.gets_unsharded {
                "; becomes the default shard: unsharded tables are copied whole"
            } else {
                ""
            };
            let _ = writeln!(out, "  {:<37} {what}{unsharded}", p.range.to_string());
        }
        out
    }
}

/// A table in the source's catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogTable {
    pub schema: String,
    pub name: String,
}

impl CatalogTable {
    /// The table's name as SQL (schema-qualified, quoted where needed).
    pub fn sql_name(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ShardMap {
        ShardMap::even_split(
            &[
                "postgres://u:p@127.0.0.1:5432/s0".into(),
                "postgres://u:p@127.0.0.1:5432/s1".into(),
            ],
            vec![Table::new("kv", "id", KeyType::BigInt)],
        )
        .unwrap()
    }

    fn into(a: &str, b: &str) -> Vec<String> {
        vec![a.into(), b.into()]
    }

    /// The map, and shard 1 of it split onto two new databases.
    fn split_of_shard_1() -> (ShardMap, Plan) {
        let map = map();
        let range = map.shards()[1].range;
        let into = into(
            "postgres://u:p@127.0.0.1:6000/a",
            "postgres://u:p@127.0.0.1:6001/b",
        );
        let plan = Plan::new(&map, &range, &into).unwrap();
        (map, plan)
    }

    #[test]
    fn plans_a_split_and_reads_its_file_back() {
        let (map, plan) = split_of_shard_1();
        assert!(!plan.parts[0].stays && !plan.parts[1].stays);
        // Shard 0 is the default: neither half of shard 1 gets the unsharded tables.
        assert!(!plan.parts[0].gets_unsharded && !plan.parts[1].gets_unsharded);
        let back = Plan::parse(&plan.to_toml(), "split.toml").unwrap();
        assert_eq!(back.range, plan.range);
        assert_eq!(back.parts[1].primary, plan.parts[1].primary);
        assert_eq!(back.tables, plan.tables);
        let new = back.new_map(&map).unwrap();
        assert_eq!(new.shards().len(), 3);
        assert_eq!(new.version(), map.version() + 1);
        // The map moved on: the plan is refused.
        assert!(back.new_map(&new).unwrap_err().contains("version"));
    }

    #[test]
    fn a_half_may_stay_and_the_default_shard_keeps_unsharded_tables() {
        let map = map();
        let range = map.shards()[0].range;
        let plan = Plan::new(
            &map,
            &range,
            &into(
                "postgres://u:p@127.0.0.1:5432/s0",
                "postgres://u:p@127.0.0.1:6001/b",
            ),
        )
        .unwrap();
        assert!(plan.parts[0].stays && !plan.parts[1].stays);
        assert!(plan.parts[0].gets_unsharded);
        assert_eq!(plan.moving().count(), 1);
        let both = Plan::new(
            &map,
            &range,
            &into(
                "postgres://u:p@127.0.0.1:5432/s0",
                "postgres://x@127.0.0.1:5432/s0",
            ),
        );
        assert!(both.unwrap_err().contains("nothing would move"));
        let same = Plan::new(
            &map,
            &range,
            &into(
                "postgres://u:p@127.0.0.1:6000/a",
                "postgres://u:p@127.0.0.1:6000/a",
            ),
        );
        assert!(same.unwrap_err().contains("two different databases"));
        assert!(Plan::new(&map, &range, &["postgres://h/a".into()])
            .unwrap_err()
            .contains("twice"));
    }

    #[test]
    fn sql_filters_by_range_and_quotes() {
        let (_, plan) = split_of_shard_1();
        let tables = vec![
            CatalogTable {
                schema: "public".into(),
                name: "kv".into(),
            },
            CatalogTable {
                schema: "public".into(),
                name: "Other".into(),
            },
        ];
        let publication = plan.publication_sql(0, &tables);
        assert!(publication.starts_with("CREATE PUBLICATION sg_split_80_max_0 FOR TABLE public.kv WHERE (hashint8extended(id, "), "{publication}");
        assert!(!publication.contains("Other"), "{publication}");
        assert!(
            publication.ends_with(", shardgate.split_marker"),
            "{publication}"
        );
        let sub = plan.subscription_sql(1, "host=a password='it''s'");
        assert!(
            sub.contains("CONNECTION 'host=a password=''it''''s'''"),
            "{sub}"
        );
        let fence = plan.fence_sql(&tables);
        assert_eq!(
            fence.len(),
            6,
            "what a fence tried before left is dropped, then one function and two triggers for the one sharded table"
        );
        assert!(fence[0].starts_with("DROP TRIGGER IF EXISTS"));
        assert!(fence[4].contains("ON public.kv FOR EACH ROW"));
        assert!(fence[3].contains("current_setting('shardgate.split_cleanup', true)"));
        assert_eq!(plan.unfence_sql(&tables).len(), 3);
        assert!(plan
            .verify_sql(&tables[1], &plan.parts[0].range)
            .contains("FROM public.\"Other\" AS r"));
    }

    #[test]
    fn reference_tables_are_copied_whole_and_stop_streaming_at_the_fence() {
        let map = map()
            .with_references(vec![Reference::new("regions")])
            .unwrap();
        let range = map.shards()[0].range;
        let into = into(
            "postgres://u:p@127.0.0.1:5432/s0",
            "postgres://u:p@127.0.0.1:6001/b",
        );
        let plan = Plan::new(&map, &range, &into).unwrap();
        let plan = Plan::parse(&plan.to_toml(), "split.toml").unwrap();
        assert_eq!(
            plan.references,
            map.references(),
            "read back from the plan file"
        );
        let tables = vec![CatalogTable {
            schema: "public".into(),
            name: "regions".into(),
        }];
        let publication = plan.publication_sql(1, &tables);
        assert!(
            publication.contains("FOR TABLE public.regions, "),
            "{publication}"
        );
        // The source stays (part 0): no trigger fences the table; its stream stops.
        let fence = plan.fence_sql(&tables);
        assert!(
            fence.iter().all(|s| !s.contains("TRIGGER sg_fence")),
            "{fence:?}"
        );
        assert!(
            fence.last().is_some_and(
                |s| s.contains("ALTER PUBLICATION sg_split_min_80_1 DROP TABLE public.regions")
            ),
            "{fence:?}"
        );
        assert!(plan
            .unfence_sql(&tables)
            .iter()
            .any(|s| s.contains("ADD TABLE public.regions")));
    }

    #[test]
    fn refuses_bad_plan_files() {
        let err = |text: &str| Plan::parse(text, "p.toml").unwrap_err();
        assert!(err(
            "format = 2\nrange = \"-\"\nsource = \"x\"\nmap_version = 1\npart = []\ntable = []\n"
        )
        .contains("format 2"));
        assert!(err("nonsense").starts_with("p.toml: not a reshard plan"));
        let (_, plan) = split_of_shard_1();
        let swapped = plan
            .to_toml()
            .replacen("range = \"80-c0\"", "range = \"80-90\"", 1);
        assert!(Plan::parse(&swapped, "p.toml")
            .unwrap_err()
            .contains("halves"));
    }
}
