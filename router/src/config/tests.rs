//! Tests of `router.toml` checking: every problem named with its line, defaults, examples.

use super::*;
use crate::auth::ScramVerifier;

const VERIFIER: &str = "SCRAM-SHA-256$4096:AQIDBAUGBwgJCgsMDQ4PEA==$8rrDg00OqaiWXJ7p+sCgHEIaBSHY89ZJl3mfIsf32oY=:05L1f+yZbiN8O0AnO40Og85NNRhvzTS57naKRWCcsIA=";

fn parse_str(text: &str) -> Result<Config, ConfigError> {
    parse(text, Path::new("/etc/shardgate/router.toml"))
}

/// The (line, message) of every problem, for asserting both.
fn problems(text: &str) -> Vec<(usize, String)> {
    match parse_str(text) {
        Ok(c) => panic!("expected problems, got {c:?}"),
        Err(e) => e
            .problems
            .into_iter()
            .map(|p| (p.line, p.message))
            .collect(),
    }
}

/// Asserts exactly one problem, on `line`, whose message contains `words`.
fn one_problem(text: &str, line: usize, words: &str) {
    let found = problems(text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, line, "{found:?}");
    assert!(
        found[0].1.contains(words),
        "{:?} does not contain {words:?}",
        found[0].1
    );
}

const MINIMAL: &str = "shardmap = \"shardmap.toml\"\ndatabase = \"app\"\n[[users]]\nname = \"app\"\npassword = \"app\"\n";

#[test]
fn full_file() {
    let text = format!(
        r#"listen = "0.0.0.0:7432"
shardmap = "maps/shardmap.toml"
database = "app"
auth = "scram-sha-256"

[[users]]
name = "app"
password = "app-password"

[[users]]
name = "admin"
password = "{VERIFIER}"
admin = true

[backend]
user = "router"
password = "backend-secret"
application_name = "sg"

[pool]
max_size = 50
min_idle = 2
connect_timeout_ms = 1500
checkout_timeout_ms = 3000
idle_timeout_ms = 0
pause_timeout_ms = 9000
warm_connections = 2
warm_timeout_ms = 4000
shared_connections = 3

[limits]
max_clients = 500
statement_timeout_ms = 30000
plan_cache_size = 0
slow_statement_ms = 250

[http]
listen = "127.0.0.1:9930"
"#
    );
    let c = parse_str(&text).unwrap();
    assert_eq!(c.source, Path::new("/etc/shardgate/router.toml"));
    assert_eq!(c.listen, "0.0.0.0:7432".parse().unwrap());
    assert_eq!(c.shardmap, Path::new("/etc/shardgate/maps/shardmap.toml"));
    assert_eq!(c.database, "app");
    assert_eq!(c.auth, AuthMethod::ScramSha256);
    assert_eq!(c.users.len(), 2);
    // The plain password became a verifier for that password.
    let Secret::Scram(v) = &c.user("app").unwrap().secret else {
        panic!("plain password kept: {:?}", c.users)
    };
    assert_eq!(
        v,
        &crate::auth::scram_verifier("app-password", v.salt(), v.iterations())
    );
    assert_eq!(
        c.user("admin").unwrap().secret,
        Secret::Scram(ScramVerifier::parse(VERIFIER).unwrap())
    );
    assert!(c.user("nobody").is_none());
    assert!(c.user("admin").unwrap().admin && !c.user("app").unwrap().admin);
    assert_eq!(c.http, Some("127.0.0.1:9930".parse().unwrap()));
    assert_eq!(c.backend.user, "router");
    assert_eq!(c.backend.password.as_deref(), Some("backend-secret"));
    assert_eq!(c.backend.application_name, "sg");
    assert_eq!(
        c.pool,
        Pool {
            max_size: 50,
            min_idle: 2,
            connect_timeout: Duration::from_millis(1500),
            checkout_timeout: Duration::from_secs(3),
            idle_timeout: None,
            pause_timeout: Duration::from_secs(9),
            warm_connections: 2,
            warm_timeout: Duration::from_secs(4),
            shared_connections: 3,
        }
    );
    assert_eq!(
        c.limits,
        Limits {
            max_clients: 500,
            statement_timeout: Some(Duration::from_secs(30)),
            plan_cache_size: 0,
            slow_statement: Some(Duration::from_millis(250)),
            max_merge_groups: 1_000_000,
            max_logins: 10_000,
            max_logins_per_address: 0,
            max_logins_per_address_exempt: Vec::new(),
            startup_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(60),
            max_prepared_bytes: 64 << 20,
            max_merge_bytes: 64 << 20,
            merge_memory_bytes: 256 << 20,
            plan_cache_bytes: 64 << 20,
            max_message_bytes: 64 << 20,
            max_plan_bytes: 1 << 20,
        }
    );
    // No password, plain or backend, is printed by Debug.
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("app-password") && !debug.contains("backend-secret"),
        "{debug}"
    );
}

/// The examples in docs/configuration.md stay valid.
#[test]
fn documented_examples_parse() {
    let doc = include_str!("../../../docs/configuration.md");
    let examples: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .collect();
    assert_eq!(examples.len(), 2);
    let full = parse_str(examples[0]).unwrap();
    assert_eq!(full.users.len(), 2);
    let small = parse_str(examples[1]).unwrap();
    assert_eq!(small.pool, full.pool);
    assert_eq!(small.limits, full.limits);
    // The full example spells out every default except the backend password.
    assert_eq!(small.backend.user, full.backend.user);
    assert_eq!(
        small.backend.application_name,
        full.backend.application_name
    );
}

#[test]
fn defaults() {
    let c = parse_str(MINIMAL).unwrap();
    assert_eq!(c.listen, DEFAULT_LISTEN.parse().unwrap());
    assert_eq!(c.http, None, "the HTTP side port is off unless asked for");
    assert_eq!(c.auth, AuthMethod::ScramSha256);
    assert_eq!(c.backend.user, "postgres");
    assert_eq!(c.backend.password, None);
    assert_eq!(c.backend.application_name, "shardgate");
    assert!(!c.reuse_port, "a taken address is refused unless asked for");
    assert_eq!(
        c.pool,
        Pool {
            max_size: 20,
            min_idle: 0,
            connect_timeout: Duration::from_secs(2),
            checkout_timeout: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(600)),
            pause_timeout: Duration::from_secs(60),
            warm_connections: 0,
            warm_timeout: Duration::from_secs(10),
            shared_connections: 2,
        }
    );
    assert_eq!(
        c.limits,
        Limits {
            max_clients: 10_000,
            statement_timeout: None,
            plan_cache_size: 10_000,
            slow_statement: Some(Duration::from_secs(1)),
            max_merge_groups: 1_000_000,
            max_logins: 10_000,
            max_logins_per_address: 0,
            max_logins_per_address_exempt: Vec::new(),
            startup_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(60),
            max_prepared_bytes: 64 << 20,
            max_merge_bytes: 64 << 20,
            merge_memory_bytes: 256 << 20,
            plan_cache_bytes: 64 << 20,
            max_message_bytes: 64 << 20,
            max_plan_bytes: 1 << 20,
        }
    );
}

#[test]
fn warm_connections_default_to_none_with_sharing_and_one_without() {
    let pool = |extra: &str| {
        parse_str(&format!("{MINIMAL}[pool]\n{extra}"))
            .expect("valid")
            .pool
    };
    let off = pool("shared_connections = 0\n");
    assert_eq!((off.shared_connections, off.warm_connections), (0, 1));
    let on = pool("shared_connections = 3\n");
    assert_eq!((on.shared_connections, on.warm_connections), (3, 0));
    // Said is said, either way.
    let both = pool("shared_connections = 2\nwarm_connections = 2\n");
    assert_eq!(both.warm_connections, 2);
    let none = pool("shared_connections = 0\nwarm_connections = 0\n");
    assert_eq!(none.warm_connections, 0);
}

#[test]
fn trust_needs_no_users() {
    let c = parse_str("shardmap = \"m.toml\"\ndatabase = \"app\"\nauth = \"trust\"\n").unwrap();
    assert_eq!(c.auth, AuthMethod::Trust);
    assert!(c.users.is_empty());
}

#[test]
fn paths_are_relative_to_the_config_file() {
    let at = |origin: &str, map: &str| {
        let text = MINIMAL.replace("shardmap.toml", map);
        parse(&text, Path::new(origin)).unwrap().shardmap
    };
    assert_eq!(at("conf/router.toml", "m.toml"), Path::new("conf/m.toml"));
    assert_eq!(at("router.toml", "m.toml"), Path::new("m.toml"));
    assert_eq!(
        at("/etc/sg/router.toml", "/srv/m.toml"),
        Path::new("/srv/m.toml")
    );
}

#[test]
fn syntax_error_names_its_line() {
    one_problem(&format!("{MINIMAL}[pool]\nmax_size = = 3\n"), 7, "");
}

#[test]
fn unknown_field_names_its_line() {
    one_problem(
        &format!("{MINIMAL}[pool]\nmax_sise = 3\n"),
        7,
        "unknown field `max_sise`",
    );
    one_problem(
        &format!("lissten = \"x\"\n{MINIMAL}"),
        1,
        "unknown field `lissten`",
    );
}

#[test]
fn wrong_type_names_its_line() {
    one_problem(
        &format!("{MINIMAL}[limits]\nmax_clients = \"many\"\n"),
        7,
        "invalid type",
    );
}

#[test]
fn bad_listen() {
    one_problem(
        &format!("listen = \"localhost:6432\"\n{MINIMAL}"),
        1,
        "not an IP address and port",
    );
    one_problem(
        "shardmap = \"m\"\nlisten = \"127.0.0.1\"\ndatabase = \"app\"\nauth = \"trust\"\n",
        2,
        "not an IP address and port",
    );
    // A top-level key written after a table belongs to that table, as TOML has it.
    one_problem(
        &format!("{MINIMAL}listen = \"127.0.0.1:1\"\n"),
        6,
        "unknown field `listen`",
    );
}

#[test]
fn missing_shardmap_and_database() {
    let found = problems("[[users]]\nname = \"app\"\npassword = \"app\"\n");
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.iter().all(|(line, _)| *line == 0), "{found:?}");
    assert!(found[0].1.starts_with("shardmap is missing"), "{found:?}");
    assert!(found[1].1.starts_with("database is missing"), "{found:?}");
    one_problem(
        &MINIMAL.replace("\"shardmap.toml\"", "\" \""),
        1,
        "shardmap is empty",
    );
    one_problem(
        &MINIMAL.replace("\"app\"\n[[", "\"\"\n[["),
        2,
        "database is empty",
    );
}

#[test]
fn bad_auth() {
    one_problem(
        &format!("auth = \"md5\"\n{MINIMAL}"),
        1,
        "not an authentication method",
    );
}

#[test]
fn scram_without_users() {
    one_problem(
        "shardmap = \"m\"\ndatabase = \"app\"\nauth = \"scram-sha-256\"\n",
        3,
        "no [[users]]",
    );
    // Without an explicit `auth` line there is no line to point at.
    one_problem("shardmap = \"m\"\ndatabase = \"app\"\n", 0, "no [[users]]");
}

#[test]
fn duplicate_user() {
    one_problem(
        &format!("{MINIMAL}\n[[users]]\nname = \"app\"\npassword = \"x\"\n"),
        7,
        "defined twice (first on line 3)",
    );
}

#[test]
fn bad_user_entries() {
    one_problem(
        &format!("{MINIMAL}[[users]]\npassword = \"x\"\n"),
        6,
        "has no name",
    );
    one_problem(
        &format!("{MINIMAL}[[users]]\nname = \"b\"\n"),
        6,
        "user \"b\" has no password",
    );
    one_problem(
        &format!("{MINIMAL}[[users]]\nname = \" \"\npassword = \"x\"\n"),
        7,
        "user name is empty",
    );
    one_problem(
        &format!("{MINIMAL}[[users]]\nname = \"b\"\npassword = \"SCRAM-SHA-256$4096:zz\"\n"),
        8,
        "user \"b\": password verifier",
    );
    one_problem(
        &format!("{MINIMAL}[[users]]\nname = \"b\"\npassword = \"md54ab2c5d00339c4b2a4e921d2dc4edec7\"\n"),
        8,
        "md5",
    );
}

#[test]
fn bad_backend() {
    one_problem(
        &format!("{MINIMAL}[backend]\npassword = \"{VERIFIER}\"\n"),
        7,
        "cannot be used to log in",
    );
    one_problem(
        &format!("{MINIMAL}[backend]\nuser = \"\"\n"),
        7,
        "backend.user is empty",
    );
}

#[test]
fn bad_pool() {
    one_problem(
        &format!("{MINIMAL}[pool]\nmax_size = 0\n"),
        7,
        "pool.max_size is 0; it must be 1 or more",
    );
    one_problem(
        &format!("{MINIMAL}[pool]\nmin_idle = -1\n"),
        7,
        "pool.min_idle is -1",
    );
    one_problem(
        &format!("{MINIMAL}[pool]\nmax_size = 2\nmin_idle = 3\n"),
        8,
        "more than pool.max_size (2)",
    );
    one_problem(
        &format!("{MINIMAL}[pool]\nmax_size = 2\nwarm_connections = 3\n"),
        8,
        "pool.warm_connections is 3, more than pool.max_size (2)",
    );
    one_problem(
        &format!("{MINIMAL}[pool]\nconnect_timeout_ms = 0\n"),
        7,
        "pool.connect_timeout_ms is 0; it must be more than 0",
    );
    one_problem(
        &format!("{MINIMAL}[pool]\ncheckout_timeout_ms = -5\n"),
        7,
        "pool.checkout_timeout_ms is -5",
    );
    one_problem(
        &format!("{MINIMAL}[pool]\nidle_timeout_ms = -1\n"),
        7,
        "0 (off)",
    );
}

#[test]
fn bad_limits() {
    one_problem(
        &format!("{MINIMAL}[limits]\nmax_clients = 0\n"),
        7,
        "limits.max_clients is 0",
    );
    one_problem(
        &format!("{MINIMAL}[limits]\nplan_cache_size = -1\n"),
        7,
        "limits.plan_cache_size",
    );
    one_problem(
        &format!("{MINIMAL}[limits]\nstatement_timeout_ms = -1\n"),
        7,
        "limits.statement_timeout_ms",
    );
    one_problem(
        &format!("{MINIMAL}[limits]\nslow_statement_ms = -1\n"),
        7,
        "limits.slow_statement_ms",
    );
    one_problem(
        &format!("{MINIMAL}[http]\nlisten = \"localhost:9930\"\n"),
        7,
        "http.listen \"localhost:9930\" is not an IP address",
    );
    one_problem(
        &format!("{MINIMAL}[pool]\npause_timeout_ms = 0\n"),
        7,
        "pool.pause_timeout_ms",
    );
}

#[test]
fn several_problems_one_per_line_in_file_order() {
    let text = "listen = \"nowhere\"\nauth = \"md5\"\n[pool]\nmax_size = 0\n";
    let err = parse_str(text).unwrap_err();
    let shown = err.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 5, "{shown}");
    assert!(
        lines[0].starts_with("/etc/shardgate/router.toml: shardmap is missing"),
        "{shown}"
    );
    assert!(
        lines[1].starts_with("/etc/shardgate/router.toml: database is missing"),
        "{shown}"
    );
    assert!(
        lines[2].starts_with("/etc/shardgate/router.toml:1: listen \"nowhere\""),
        "{shown}"
    );
    assert!(
        lines[3].starts_with("/etc/shardgate/router.toml:2: auth \"md5\""),
        "{shown}"
    );
    assert!(
        lines[4].starts_with("/etc/shardgate/router.toml:4: pool.max_size is 0"),
        "{shown}"
    );
}

#[test]
fn load_reads_the_file_and_names_it_in_errors() {
    let dir = std::env::temp_dir().join(format!("shardgate-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("router.toml");
    std::fs::write(&path, MINIMAL).unwrap();
    let c = load(&path).unwrap();
    assert_eq!(c.shardmap, dir.join("shardmap.toml"));
    std::fs::write(&path, format!("{MINIMAL}bogus = 1\n")).unwrap();
    let shown = load(&path).unwrap_err().to_string();
    assert!(
        shown.starts_with(&format!("{}:6: unknown field `bogus`", path.display())),
        "{shown}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let shown = load(&dir.join("router.toml")).unwrap_err().to_string();
    assert!(
        shown.contains("router.toml: cannot read the config file"),
        "{shown}"
    );
}

#[test]
fn router_id_and_peers() {
    let c = parse_str(&format!(
        "router_id = 3\n{MINIMAL}[[peers]]\nid = 4\naddress = \"10.0.0.4:6432\"\n"
    ))
    .expect("a fleet config");
    assert_eq!(c.router_id, 3);
    assert_eq!(
        c.peers,
        [Peer {
            id: 4,
            address: "10.0.0.4:6432".parse().expect("addr")
        }]
    );
    let all = problems(&format!(
        "router_id = 200\n{MINIMAL}[[peers]]\nid = 0\naddress = \"x\"\n[[peers]]\nid = 0\naddress = \"10.0.0.1:1\"\n"
    ));
    let text: Vec<&str> = all.iter().map(|(_, m)| m.as_str()).collect();
    assert!(
        text.iter().any(|m| m.contains("router_id is 200")),
        "{text:?}"
    );
    assert!(text.iter().any(|m| m.contains("own router_id")), "{text:?}");
}

#[test]
fn tls_is_off_unless_configured() {
    let c = parse_str(MINIMAL).expect("minimal config");
    assert_eq!(
        c.tls,
        Tls {
            mode: TlsMode::Disable,
            cert: None,
            key: None
        }
    );
    assert_eq!(c.backend.sslmode, SslMode::Disable);
    assert_eq!(c.backend.ca, None);
}

#[test]
fn tls_settings_resolve_their_files_and_keep_their_lines() {
    let c = parse_str(&format!(
        "{MINIMAL}[tls]\nmode = \"require\"\ncert = \"tls/router.pem\"\nkey = \"/keys/router.key\"\n\
         [backend]\nsslmode = \"verify-full\"\nca = \"ca.pem\"\n"
    ))
    .expect("a TLS config");
    assert_eq!(c.tls.mode, TlsMode::Require);
    assert_eq!(
        c.tls.cert,
        Some(FileSetting {
            path: "/etc/shardgate/tls/router.pem".into(),
            line: 8
        })
    );
    assert_eq!(
        c.tls.key,
        Some(FileSetting {
            path: "/keys/router.key".into(),
            line: 9
        })
    );
    assert_eq!(c.backend.sslmode, SslMode::VerifyFull);
    assert_eq!(
        c.backend.ca,
        Some(FileSetting {
            path: "/etc/shardgate/ca.pem".into(),
            line: 12
        })
    );
    let allow = parse_str(&format!(
        "{MINIMAL}[tls]\nmode = \"allow\"\ncert = \"c.pem\"\nkey = \"k.pem\"\n[backend]\nsslmode = \"require\"\n"
    ))
    .expect("allow and require");
    assert_eq!(allow.tls.mode, TlsMode::Allow);
    assert_eq!(allow.backend.sslmode, SslMode::Require);
    // Certificates may be prepared before TLS is turned on.
    let off = parse_str(&format!(
        "{MINIMAL}[tls]\nmode = \"disable\"\ncert = \"c.pem\"\nkey = \"k.pem\"\n"
    ))
    .expect("disabled with files");
    assert_eq!(off.tls.mode, TlsMode::Disable);
}

#[test]
fn bad_tls() {
    one_problem(
        &format!("{MINIMAL}[tls]\nmode = \"prefer\"\n"),
        7,
        "tls.mode \"prefer\" is not a TLS mode; use \"disable\", \"allow\" or \"require\"",
    );
    let found = problems(&format!("{MINIMAL}[tls]\nmode = \"require\"\n"));
    assert_eq!(
        found,
        [
            (7, "tls.mode is \"require\" but tls.cert is not set; give the PEM file of the router's certificate".to_string()),
            (7, "tls.mode is \"require\" but tls.key is not set; give the PEM file of the router's private key".to_string()),
        ]
    );
    one_problem(
        &format!("{MINIMAL}[tls]\nmode = \"allow\"\ncert = \"c.pem\"\n"),
        7,
        "tls.key is not set",
    );
    one_problem(
        &format!("{MINIMAL}[tls]\nmode = \"allow\"\ncert = \" \"\nkey = \"k.pem\"\n"),
        8,
        "tls.cert is empty",
    );
    one_problem(
        &format!("{MINIMAL}[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n"),
        6,
        "names a certificate but no mode",
    );
    one_problem(
        &format!("{MINIMAL}[tls]\nmode = \"require\"\ncert = \"c.pem\"\nkey = \"k.pem\"\nciphers = \"x\"\n"),
        10,
        "unknown field `ciphers`",
    );
}

#[test]
fn bad_backend_tls() {
    one_problem(
        &format!("{MINIMAL}[backend]\nsslmode = \"verify-ca\"\n"),
        7,
        "backend.sslmode \"verify-ca\" is not supported; use \"disable\", \"require\" or \"verify-full\"",
    );
    one_problem(
        &format!("{MINIMAL}[backend]\nsslmode = \"verify-full\"\n"),
        7,
        "backend.ca is not set",
    );
    one_problem(
        &format!("{MINIMAL}[backend]\nsslmode = \"require\"\nca = \"ca.pem\"\n"),
        8,
        "backend.ca is only used with sslmode = \"verify-full\"",
    );
    one_problem(
        &format!("{MINIMAL}[backend]\nca = \"ca.pem\"\n"),
        7,
        "backend.sslmode is not",
    );
}

#[test]
fn front_door_settings() {
    let c = parse_str(&format!(
        "reuse_port = true\n{MINIMAL}\n[limits]\nmax_logins = 5\nlogin_timeout_ms = 250\n\
         startup_timeout_ms = 100\nmax_logins_per_address = 7\n\
         max_logins_per_address_exempt = [\"10.1.0.0/16\", \" 192.168.0.5 \", \"::1\"]\n"
    ))
    .unwrap();
    assert!(c.reuse_port);
    assert_eq!(c.limits.max_logins, 5);
    assert_eq!(c.limits.login_timeout, Duration::from_millis(250));
    assert_eq!(c.limits.startup_timeout, Duration::from_millis(100));
    assert_eq!(c.limits.max_logins_per_address, 7);
    let exempt: Vec<String> = c
        .limits
        .max_logins_per_address_exempt
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(exempt, ["10.1.0.0/16", "192.168.0.5/32", "::1/128"]);
    let err = parse_str(&format!(
        "{MINIMAL}\n[limits]\nmax_logins = 0\nlogin_timeout_ms = 0\nstartup_timeout_ms = -1\n\
         max_logins_per_address_exempt = [\"10.0.0.0/8\", \"lb.example\"]\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("limits.startup_timeout_ms is -1; it must be more than 0"),
        "{err}"
    );
    assert!(
        err.contains(
            "limits.max_logins_per_address_exempt: \"lb.example\" is not an IP address or network"
        ),
        "{err}"
    );
    assert!(
        err.contains("limits.max_logins is 0; it must be 1 or more"),
        "{err}"
    );
    assert!(
        err.contains("limits.login_timeout_ms is 0; it must be more than 0"),
        "{err}"
    );
}

#[test]
fn transactions_across_shards() {
    let c = parse_str(MINIMAL).expect("minimal");
    assert_eq!(c.transactions.cross_shard, CrossShard::Multi);
    assert_eq!(c.transactions.lock_timeout, Some(Duration::from_secs(10)));
    assert!(c.transactions.scatter_writes, "allowed by default");
    let c = parse_str(&format!(
        "{MINIMAL}[transactions]\ncross_shard = \"refuse\"\nlock_timeout_ms = 0\nscatter_writes = \"refuse\"\n"
    ))
    .expect("refuse");
    assert_eq!(c.transactions.cross_shard, CrossShard::Refuse);
    assert_eq!(c.transactions.lock_timeout, None);
    assert!(!c.transactions.scatter_writes);
    // The older spelling is still read.
    let c = parse_str(&format!(
        "{MINIMAL}[limits]\nallow_scatter_writes = false\n"
    ))
    .expect("legacy");
    assert!(!c.transactions.scatter_writes);
    let c = parse_str(&format!(
        "{MINIMAL}[transactions]\ncross_shard = \"two_phase\"\n"
    ))
    .expect("two_phase");
    assert_eq!(c.transactions.cross_shard, CrossShard::TwoPhase);
    assert_eq!(c.transactions.recovery_interval, Duration::from_secs(10));
    assert_eq!(c.transactions.test_fault, None);
    one_problem(
        &format!("{MINIMAL}[transactions]\ncross_shard = \"xa\"\n"),
        7,
        "\"two_phase\"",
    );
    one_problem(
        &format!("{MINIMAL}[transactions]\nscatter_writes = \"sometimes\"\n"),
        7,
        "\"allow\" or \"refuse\"",
    );
    one_problem(
        &format!("{MINIMAL}[transactions]\nlock_timeout_ms = -5\n"),
        7,
        "transactions.lock_timeout_ms",
    );
}

#[test]
fn log_format() {
    let c = parse_str(&format!("{MINIMAL}\n[log]\nformat = \"json\"\n")).unwrap();
    assert_eq!(c.log_format, LogFormat::Json);
    let c = parse_str(MINIMAL).unwrap();
    assert_eq!(c.log_format, LogFormat::Text);
    one_problem(
        &format!("{MINIMAL}[log]\nformat = \"xml\"\n"),
        MINIMAL.lines().count() + 2,
        "log.format \"xml\" is not supported; use \"text\" or \"json\"",
    );
}

#[test]
fn hints_for_everyone_or_admins() {
    assert!(!parse_str(MINIMAL).unwrap().hints_for_admins_only);
    let c = parse_str(&format!("{MINIMAL}\n[hints]\nallow = \"admins\"\n")).unwrap();
    assert!(c.hints_for_admins_only);
    one_problem(
        &format!("{MINIMAL}[hints]\nallow = \"nobody\"\n"),
        MINIMAL.lines().count() + 2,
        "hints.allow \"nobody\" is not supported; use \"everyone\" or \"admins\"",
    );
}
