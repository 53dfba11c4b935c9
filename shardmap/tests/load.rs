//! Loading `shardmap.toml`: valid maps load, and every kind of mistake is reported with its
//! line and a sentence that says what to fix.

use shardmap::{parse, Key, KeyRange, KeyType, KeyspaceId, ShardMap};

const GOOD: &str = r#"
version = 7
default_shard = "80-"

[[tables]]
name = "kv"
key = "id"
type = "bigint"

[[tables]]
name = "app.users"
key = "user_id"
type = "uuid"

[[shards]]
range = "-80"
primary = "postgres://127.0.0.1:5433/app"

[[shards]]
range = "80-"
primary = "postgres://app:secret@127.0.0.1:5434/app"
"#;

fn problems(text: &str) -> Vec<(usize, String)> {
    let err = parse(text, "test.toml").expect_err("the map should be rejected");
    err.problems
        .into_iter()
        .map(|p| (p.line, p.message))
        .collect()
}

fn one_problem(text: &str) -> (usize, String) {
    let mut all = problems(text);
    assert_eq!(all.len(), 1, "expected one problem, got {all:?}");
    all.remove(0)
}

#[test]
fn loads_the_design_example() {
    let map = parse(GOOD, "good.toml").unwrap();
    assert_eq!(map.version(), 7);
    assert_eq!(map.shards().len(), 2);
    assert_eq!(map.shards()[map.default_shard()].range.to_string(), "80-");
    let users = map.table(Some("app"), "users").unwrap();
    assert_eq!(users.key_type, KeyType::Uuid);
    assert!(
        map.table(None, "users").is_some(),
        "unqualified reference matches"
    );
    assert!(map.table(Some("other"), "users").is_none());
    assert_eq!(map.table(Some("public"), "kv").unwrap().key, "id");
    assert_eq!(map.shards()[1].primary.password.as_deref(), Some("secret"));
}

#[test]
fn round_trips_through_toml() {
    let map = parse(GOOD, "good.toml").unwrap();
    let again = parse(&map.to_toml(), "again.toml").unwrap();
    assert_eq!(map, again);
}

#[test]
fn lookup_agrees_with_ranges() {
    let urls: Vec<String> = (0..512)
        .map(|i| format!("postgres://h{}:5432/s{i}", i % 4))
        .collect();
    let map = ShardMap::even_split(&urls, vec![]).unwrap();
    let probes = [
        0u64,
        1,
        0x0080_0000_0000_0000 - 1,
        0x0080_0000_0000_0000,
        1 << 63,
        u64::MAX,
    ];
    for id in probes
        .into_iter()
        .chain((0..10_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    {
        let i = map.shard_for(KeyspaceId(id));
        assert!(
            map.shards()[i].range.contains(KeyspaceId(id)),
            "{id:016x} -> {i}"
        );
    }
    let k = Key::Int(42);
    assert!(map.shards()[map.shard_for_key(&k)]
        .range
        .contains(k.keyspace_id()));
}

#[test]
fn reports_toml_syntax_errors_with_the_line() {
    let (line, msg) = one_problem("version = 1\n\n[[shards]\nrange = \"-\"\n");
    assert_eq!(line, 3, "{msg}");
}

#[test]
fn reports_unknown_and_missing_fields() {
    let (line, msg) = one_problem(
        "version = 1\n[[shards]]\nrange = \"-\"\nprimary = \"postgres://h/a\"\nreplica = \"x\"\n",
    );
    assert_eq!(line, 5, "{msg}");
    assert!(msg.contains("replica"), "{msg}");
    let (_, msg) = one_problem("[[shards]]\nrange = \"-\"\nprimary = \"postgres://h/a\"\n");
    assert!(msg.contains("version"), "{msg}");
}

#[test]
fn reports_overlaps_gaps_and_coverage() {
    let shard = |r: &str, db: &str| {
        format!("[[shards]]\nrange = \"{r}\"\nprimary = \"postgres://h/{db}\"\n")
    };
    let map = |shards: &[(&str, &str)]| {
        let mut t = String::from("version = 1\n");
        for (r, db) in shards {
            t += &shard(r, db);
        }
        t
    };
    // Shards start at lines 2, 5, 8.
    let (line, msg) = one_problem(&map(&[("-80", "a"), ("40-", "b")]));
    assert_eq!(line, 5);
    assert!(msg.contains("overlaps") && msg.contains("-80"), "{msg}");

    let (line, msg) = one_problem(&map(&[("-40", "a"), ("80-", "b")]));
    assert_eq!(line, 5);
    assert!(msg.contains("gap") && msg.contains("40-80"), "{msg}");

    let (line, msg) = one_problem(&map(&[("10-80", "a"), ("80-", "b")]));
    assert_eq!(line, 2);
    assert!(msg.contains("start of the keyspace"), "{msg}");

    let (line, msg) = one_problem(&map(&[("-80", "a"), ("80-f0", "b")]));
    assert_eq!(line, 5);
    assert!(msg.contains("end of the keyspace"), "{msg}");

    let (line, msg) = one_problem("version = 1\n");
    assert_eq!(line, 1);
    assert!(msg.contains("no [[shards]]"), "{msg}");

    let (line, msg) = one_problem(&map(&[("-80", "a"), ("80-", "a")]));
    assert_eq!(line, 5);
    assert!(msg.contains("same database"), "{msg}");
}

#[test]
fn reports_malformed_hex_and_urls_and_types_all_at_once() {
    let text = r#"version = 1
[[tables]]
name = "kv"
key = "id"
type = "numeric"
[[tables]]
name = "kv"
key = "id"
type = "bigint"
[[shards]]
range = "-8"
primary = "postgres://h/a"
[[shards]]
range = "8g-"
primary = "http://h/b"
"#;
    let all = problems(text);
    let lines: Vec<usize> = all.iter().map(|p| p.0).collect();
    assert_eq!(lines, [5, 11, 14, 15], "{all:?}");
    assert!(
        all[0].1.contains("numeric") && all[0].1.contains("bigint"),
        "{all:?}"
    );
    assert!(all[1].1.contains("odd number of hex digits"), "{all:?}");
    assert!(all[2].1.contains("not hex"), "{all:?}");
    assert!(all[3].1.contains("postgres://"), "{all:?}");
}

#[test]
fn reports_duplicate_tables_and_bad_default_shard() {
    let text = r#"version = 1
default_shard = "-40"
[[tables]]
name = "kv"
key = "id"
type = "bigint"
[[tables]]
name = "public.kv"
key = "k"
type = "text"
[[shards]]
range = "-"
primary = "postgres://h/a"
"#;
    let all = problems(text);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].0, 2);
    assert!(all[0].1.contains("default_shard"), "{all:?}");
    assert_eq!(all[1].0, 7);
    assert!(all[1].1.contains("listed twice"), "{all:?}");
}

#[test]
fn error_display_names_file_and_line() {
    let err = parse(
        "version = 1\n[[shards]]\nrange = \"-\"\nprimary = \"nope\"\n",
        "maps/x.toml",
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("maps/x.toml:4: "), "{text}");
}

#[test]
fn generated_maps_validate() {
    let urls: Vec<String> = (0..3).map(|i| format!("postgres://h/s{i}")).collect();
    let map = ShardMap::even_split(&urls, vec![]).unwrap();
    assert_eq!(map.shards()[2].range, KeyRange::parse("aaaaaa-").unwrap());
    assert!(ShardMap::even_split(&[], vec![]).is_err());
}

#[test]
fn reference_tables_load_round_trip_and_survive_a_split() {
    let text = format!("{GOOD}\n[[tables]]\nname = \"app.regions\"\nreference = true\n");
    let map = parse(&text, "refs.toml").unwrap();
    assert!(map.reference(Some("app"), "regions").is_some());
    assert!(map.reference(None, "regions").is_some());
    assert!(map.reference(Some("other"), "regions").is_none());
    assert!(map.table(None, "regions").is_none(), "not a sharded table");
    assert_eq!(parse(&map.to_toml(), "again.toml").unwrap(), map);
    let split = map
        .split_shard(&map.shards()[0].range, "postgres://h/a", "postgres://h/b")
        .unwrap();
    assert_eq!(split.references(), map.references());
}

#[test]
fn reports_reference_tables_with_keys_tables_without_and_twice_listed() {
    let (line, msg) = one_problem(&format!(
        "{GOOD}\n[[tables]]\nname = \"regions\"\nreference = true\nkey = \"code\"\n"
    ));
    assert!(
        msg.contains("reference table") && msg.contains("remove `key`"),
        "{msg}"
    );
    assert_eq!(line, GOOD.lines().count() + 5, "{msg}");
    let (_, msg) = one_problem(&format!("{GOOD}\n[[tables]]\nname = \"regions\"\n"));
    assert!(
        msg.contains("needs its key column") && msg.contains("reference = true"),
        "{msg}"
    );
    let (_, msg) = one_problem(&format!(
        "{GOOD}\n[[tables]]\nname = \"kv\"\nreference = true\n"
    ));
    assert!(msg.contains("listed twice"), "{msg}");
}

#[test]
fn lookups_load_round_trip_and_name_their_tables() {
    let text = format!(
        "{GOOD}\n[[tables]]\nname = \"app.members\"\nkey = \"id\"\ntype = \"bigint\"\nlookup = {{ email = \"text\", badge = \"int\" }}\n"
    );
    let map = parse(&text, "lookups.toml").unwrap();
    let members = map.table(Some("app"), "members").unwrap();
    let email = members.lookup("email").unwrap();
    assert_eq!(email.key_type, KeyType::Text);
    assert_eq!(members.lookup("badge").unwrap().key_type, KeyType::Integer);
    assert!(members.lookup("id").is_none());
    let table = members.lookup_table(email);
    assert_eq!(table.qualified_name(), "shardgate.lookup_app_members_email");
    assert_eq!(
        (table.key.as_str(), table.key_type),
        ("email", KeyType::Text)
    );
    assert_eq!(map.lookup_tables().count(), 2);
    assert_eq!(parse(&map.to_toml(), "again.toml").unwrap(), map);
}

#[test]
fn reports_bad_lookups_with_their_line() {
    let table = "\n[[tables]]\nname = \"members\"\nkey = \"id\"\ntype = \"bigint\"\n";
    let (line, msg) = one_problem(&format!("{GOOD}{table}lookup = {{ id = \"bigint\" }}\n"));
    assert!(msg.contains("other than the key"), "{msg}");
    assert_eq!(line, GOOD.lines().count() + 6, "{msg}");
    let (_, msg) = one_problem(&format!("{GOOD}{table}lookup = {{ email = \"jsonb\" }}\n"));
    assert!(
        msg.contains("cannot route") && msg.contains("bigint"),
        "{msg}"
    );
    let long = "c".repeat(60);
    let (_, msg) = one_problem(&format!("{GOOD}{table}lookup = {{ {long} = \"text\" }}\n"));
    assert!(msg.contains("63 bytes"), "{msg}");
    let (_, msg) = one_problem(&format!(
        "{GOOD}\n[[tables]]\nname = \"regions\"\nreference = true\nlookup = {{ code = \"text\" }}\n"
    ));
    assert!(msg.contains("needs no `lookup`"), "{msg}");
    let (_, msg) = one_problem(&format!(
        "{GOOD}{table}lookup = {{ b_c = \"text\" }}\n[[tables]]\nname = \"members_b\"\nkey = \"id\"\ntype = \"bigint\"\nlookup = {{ c = \"text\" }}\n"
    ));
    assert!(msg.contains("would both be"), "{msg}");
}
