//! Unit tests of the settings tracker.
use super::*;

fn set(name: &str, value: &str) -> Change {
    Change::Set {
        name: name.into(),
        value: value.into(),
    }
}

#[test]
fn a_query_of_several_settings_is_followed_whole_or_not_at_all() {
    let sql = "SET TimeZone = 'Asia/Tokyo'; SET app.one = 'x;y'; RESET search_path;";
    let mut c = Changes::default();
    c.push(sql);
    // Its other completions add nothing.
    c.push(sql);
    c.push(sql);
    assert_eq!(
        c.0,
        [
            set("timezone", "'Asia/Tokyo'"),
            set("app.one", "'x;y'"),
            Change::Reset {
                name: "search_path".into()
            }
        ]
    );
    assert_eq!(c.texts(), [sql]);
    let mut settings = Settings::default();
    assert_ne!(c.settle(&mut settings), Some(UNKNOWN));
    assert_eq!(settings.get("app.one"), Some("'x;y'"));
    // An error in the Query undoes its changes, not those before it.
    c.push("SET a.b = 1");
    c.push("SET a.c = 2; SET no_such = 3");
    c.failed();
    assert_eq!(c.0, [set("a.b", "1")]);
    assert_eq!(c.texts(), ["SET a.b = 1"]);
    // After its ReadyForQuery an error is another Query's.
    c.push("SET a.c = 2; SET a.d = 3");
    c.query_over();
    c.failed();
    assert_eq!(c.0.len(), 3);
    // Anything but SET and RESET among them, or quoting the split does not read: unknown.
    for sql in [
        "SET a.b = 1; SELECT 1",
        "SET LOCAL a.b = 1; SET a.c = 2",
        "SET a.b = $$x;y$$; SET a.c = 2",
        "SET a.b = E'x\\'; SET a.c = 2'",
        "SET a.b = 1 /* ; */; SET a.c = 2",
    ] {
        assert_eq!(several_changes(sql), None, "{sql}");
    }
}

#[test]
fn parses_set_forms() {
    assert_eq!(
        parse_change("SET search_path = app, public"),
        set("search_path", "app, public")
    );
    assert_eq!(
        parse_change("set search_path to 'app'"),
        set("search_path", "'app'")
    );
    assert_eq!(
        parse_change("SET SESSION statement_timeout=1000;"),
        set("statement_timeout", "1000")
    );
    assert_eq!(
        parse_change("SET TIME ZONE 'UTC'"),
        set("timezone", "'UTC'")
    );
    assert_eq!(
        parse_change("SET SCHEMA 'app'"),
        set("search_path", "'app'")
    );
    assert_eq!(
        parse_change("SET NAMES 'LATIN1'"),
        set("client_encoding", "'LATIN1'")
    );
    assert_eq!(
        parse_change("SET app.user_id = '42'"),
        set("app.user_id", "'42'")
    );
    assert_eq!(parse_change("SET \"App\".x = 1"), set("app.x", "1"));
    assert_eq!(
        parse_change("SET datestyle TO DEFAULT"),
        Change::Reset {
            name: "datestyle".into()
        }
    );
    assert_eq!(
        parse_change("SET LOCAL search_path = x"),
        Change::Local(Some(("search_path".into(), Some("x".into()))))
    );
    assert_eq!(parse_change("RESET ALL"), Change::ResetAll);
    assert_eq!(parse_change("DISCARD ALL"), Change::DiscardAll);
    assert_eq!(
        parse_change("reset TimeZone"),
        Change::Reset {
            name: "timezone".into()
        }
    );
    for unknown in [
        "SET TRANSACTION READ ONLY",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "SET x = 1; SET y = 2",
        "SET",
        "SET x",
    ] {
        assert_eq!(parse_change(unknown), Change::Unknown, "{unknown}");
    }
}

#[test]
fn the_role_and_session_user_follow_their_client_and_never_carry_over() {
    let mut s = Settings::default();
    assert!(s.apply(&parse_change("SET SESSION AUTHORIZATION bob")));
    assert!(s.apply(&parse_change("SET ROLE r1")));
    assert_eq!(s.get("session_authorization"), Some("bob"));
    for form in [
        "SET role = 'r1'",
        "SET role TO 'r1'",
        "SET role='r1'",
        "SET ROLE 'r1'",
    ] {
        assert_eq!(
            parse_change(form),
            Change::Set {
                name: "role".into(),
                value: "'r1'".into()
            },
            "{form}"
        );
    }
    assert_eq!(s.get("role"), Some("r1"));
    // RESET ALL keeps both (GUC_NO_RESET_ALL); DISCARD ALL does not.
    assert!(s.apply(&parse_change("RESET ALL")));
    assert_eq!(s.get("role"), Some("r1"));
    // A new session user drops the role, as on Postgres.
    assert!(s.apply(&parse_change("SET SESSION AUTHORIZATION alice")));
    assert_eq!(s.get("role"), None);
    assert!(s.apply(&parse_change("SET ROLE r2")));
    assert!(s.apply(&parse_change("SET ROLE NONE")));
    assert_eq!(s.get("role"), None);
    assert!(s.apply(&parse_change("SET ROLE r2")));
    assert!(s.apply(&parse_change("RESET SESSION AUTHORIZATION")));
    assert_eq!(s.get("session_authorization"), None);
    assert_eq!(s.get("role"), None);
    assert!(s.apply(&parse_change("SET ROLE r1")));
    assert!(s.apply(&parse_change("DISCARD ALL")));
    assert_eq!(s.get("role"), None);
    // Whatever a connection held, the role and session user go back first, in a Query
    // of their own.
    let mut out = bytes::BytesMut::new();
    assert_eq!(s.write_all(&mut out).ok(), Some(1));
    assert_eq!(&out[5..out.len() - 1], RESET_SQL.as_bytes());
}

#[test]
fn datestyle_merges_with_the_value_before_it_and_time_zone_resets() {
    let params = [("DateStyle".to_string(), "Postgres, MDY".to_string())];
    let mut s = Settings::from_startup(&params);
    assert!(s.apply(&parse_change("SET datestyle TO dmy")));
    assert_eq!(s.get("datestyle"), Some("'Postgres, DMY'"));
    assert!(s.apply(&parse_change("SET DateStyle = 'ISO'")));
    assert_eq!(s.get("datestyle"), Some("'ISO, DMY'"));
    assert!(s.apply(&parse_change("SET DateStyle = 'Postgres, MDY'")));
    assert!(s.apply(&parse_change("SET DateStyle = 'German'")));
    assert_eq!(s.get("datestyle"), Some("'German, DMY'"));
    let mut iso = Settings::from_startup(&[("DateStyle".to_string(), "ISO".to_string())]);
    assert!(iso.apply(&parse_change("SET DateStyle = 'ISO, DMY'")));
    assert!(iso.apply(&parse_change("RESET DateStyle")));
    assert_eq!(iso.get("datestyle"), Some("'ISO'"));
    assert!(s.apply(&parse_change("SET DateStyle = 'nonsense'")));
    assert_eq!(s.get("datestyle"), Some("'nonsense'"));
    assert_eq!(
        parse_change("RESET TIME ZONE"),
        Change::Reset {
            name: "timezone".into()
        }
    );
    assert_eq!(
        parse_change("SET TIME ZONE LOCAL"),
        Change::Reset {
            name: "timezone".into()
        }
    );
}

#[test]
fn a_rollback_to_a_savepoint_undoes_only_the_changes_after_it() {
    let mut changes = Changes::default();
    changes.push("SET ROLE admin");
    changes.savepoint("SAVEPOINT s");
    changes.push("SET search_path = x");
    changes.savepoint("SAVEPOINT \"T\"");
    changes.push("SET TimeZone = 'UTC'");
    changes.rolled_back("ROLLBACK TO SAVEPOINT s");
    changes.push("SET work_mem = '8MB'");
    changes.released("RELEASE s");
    let mut s = Settings::default();
    assert_ne!(changes.settle(&mut s), Some(UNKNOWN));
    assert_eq!(s.get("role"), Some("admin"));
    assert_eq!(s.get("search_path"), None);
    assert_eq!(s.get("timezone"), None);
    assert_eq!(s.get("work_mem"), Some("'8MB'"));
    // A savepoint it cannot name: the changes stay, and the connection is reset after.
    let mut changes = Changes::default();
    changes.push("SET ROLE admin");
    changes.rolled_back("ROLLBACK TO nowhere");
    assert_eq!(changes.settle(&mut Settings::default()), Some(UNKNOWN));
    let mut changes = Changes::default();
    changes.push("SET ROLE admin");
    changes.rolled_back("ROLLBACK");
    assert_eq!(changes.settle(&mut Settings::default()), None);
}

#[test]
fn a_reset_of_a_startup_setting_leaves_the_connection_unknown() {
    let params = [("DateStyle".to_string(), "Postgres, MDY".to_string())];
    for reset in [
        "RESET ALL",
        "RESET datestyle",
        "DISCARD ALL",
        "SET DateStyle = DEFAULT",
    ] {
        let mut s = Settings::from_startup(&params);
        let mut changes = Changes::default();
        changes.push(reset);
        // The connection went back to the server's default, the client to its startup value.
        assert_eq!(changes.settle(&mut s), Some(UNKNOWN), "{reset}");
        assert_eq!(s.get("datestyle"), Some("'Postgres, MDY'"), "{reset}");
    }
    let mut s = Settings::from_startup(&params);
    let mut changes = Changes::default();
    changes.push("RESET TimeZone");
    assert_eq!(changes.settle(&mut s), Some(s.fingerprint()));
}

#[test]
fn session_characteristics_become_the_default_transaction_settings() {
    let mut changes = Changes::default();
    changes.push("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY NOT DEFERRABLE;");
    let mut s = Settings::default();
    assert_ne!(changes.settle(&mut s), Some(UNKNOWN));
    assert_eq!(
        s.get("default_transaction_isolation"),
        Some("'repeatable read'")
    );
    assert_eq!(s.get("default_transaction_read_only"), Some("'on'"));
    assert_eq!(s.get("default_transaction_deferrable"), Some("'off'"));
    for unread in [
        "SET SESSION CHARACTERISTICS AS TRANSACTION",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ SOMETIMES",
    ] {
        let mut changes = Changes::default();
        changes.push(unread);
        assert_eq!(
            changes.settle(&mut Settings::default()),
            Some(UNKNOWN),
            "{unread}"
        );
    }
}

#[test]
fn startup_parameters_and_options_become_settings() {
    let params: Vec<(String, String)> = [
        ("user", "app"),
        ("database", "app"),
        ("application_name", "psql"),
        ("client_encoding", "UTF8"),
        (
            "options",
            "-c search_path=app -c statement_timeout=5s --DateStyle=ISO\\,\\ DMY",
        ),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let s = Settings::from_startup(&params);
    assert_eq!(s.get("application_name"), Some("'psql'"));
    assert_eq!(s.get("client_encoding"), None);
    assert_eq!(s.get("search_path"), Some("\"app\""));
    assert_eq!(s.get("statement_timeout"), Some("'5s'"));
    assert_eq!(s.get("datestyle"), Some("'ISO, DMY'"));
    let mut changed = s.clone();
    assert!(changed.apply(&Change::Set {
        name: "application_name".into(),
        value: "'x'".into()
    }));
    assert!(changed.apply(&Change::Set {
        name: "timezone".into(),
        value: "'UTC'".into()
    }));
    assert!(changed.apply(&Change::Reset {
        name: "application_name".into()
    }));
    assert_eq!(
        changed.get("application_name"),
        Some("'psql'"),
        "RESET returns to the startup value"
    );
    assert!(changed.apply(&Change::ResetAll));
    assert_eq!(changed, s);
    assert_eq!(
        s.set_sql(),
        "SET \"application_name\" = 'psql'; SET \"search_path\" = \"app\"; SET \"statement_timeout\" = '5s'; SET \"datestyle\" = 'ISO, DMY'"
    );
    let mut out = bytes::BytesMut::new();
    assert_eq!(s.write_all(&mut out).ok(), Some(2));
    assert_eq!(Settings::default().write_all(&mut out).ok(), Some(1));
}

#[test]
fn fingerprints_follow_changes() {
    let mut s = Settings::default();
    assert_eq!(s.fingerprint(), 0);
    assert!(s.apply(&set("search_path", "app")));
    let one = s.fingerprint();
    assert_ne!(one, 0);
    assert!(s.apply(&set("search_path", "other")));
    assert_ne!(s.fingerprint(), one);
    assert!(s.apply(&Change::Reset {
        name: "search_path".into()
    }));
    assert_eq!(s.fingerprint(), 0);
    assert!(!s.apply(&Change::Unknown));
    assert_eq!(quote_literal("it's"), "'it''s'");
}

#[test]
fn settings_that_may_fail_where_they_succeeded_are_fragile() {
    let mut s = Settings::from_startup(&[
        ("application_name".into(), "psql".into()),
        ("DateStyle".into(), "ISO, MDY".into()),
        ("TimeZone".into(), "UTC".into()),
    ]);
    assert!(!s.is_fragile(), "what drivers send at startup");
    assert!(s.apply(&set("search_path", "app, public")));
    assert!(s.apply(&set("app.tenant", "'42'")));
    assert!(!s.is_fragile());
    assert!(s.apply(&set("role", "reader")));
    assert!(s.is_fragile(), "a role's membership can be revoked");
    assert!(s.apply(&Change::Reset {
        name: "role".into()
    }));
    assert!(!s.is_fragile());
    assert!(s.apply(&set("default_text_search_config", "'public.mine'")));
    assert!(s.is_fragile(), "a configuration can be dropped");
    assert!(s.apply(&Change::ResetAll));
    assert!(!s.is_fragile());
}

#[test]
fn custom_settings_are_known_from_startup_set_reset_and_reset_all() {
    let mut s = Settings::from_startup(&[("application_name".into(), "pgbench".into())]);
    assert!(!s.has_custom(), "nothing with a dot");
    assert!(s.apply(&set("search_path", "public")));
    assert!(!s.has_custom());
    assert!(s.apply(&set("ShardGate.Shard", "'80-'")));
    assert!(s.has_custom());
    assert!(s.apply(&Change::Reset {
        name: "shardgate.shard".into()
    }));
    assert!(!s.has_custom());
    assert!(s.apply(&set("app.tenant", "'42'")));
    assert!(s.apply(&Change::ResetAll));
    assert!(!s.has_custom());
    let s = Settings::from_startup(&[("options".into(), "-c shardgate.sharding_key=7".into())]);
    assert!(s.has_custom(), "set at startup");
    assert_eq!(s.get("shardgate.sharding_key"), Some("'7'"));
}

#[test]
fn only_values_that_read_the_same_again_are_plain() {
    for plain in [
        "'ISO, MDY'",
        "'it''s'",
        "\"$user\", public",
        "0",
        "-1.5",
        "on",
        "'Europe/Paris'",
        "'30s'",
    ] {
        assert!(is_plain(plain), "{plain}");
    }
    for not in [
        "INTERVAL '+02:00' HOUR TO MINUTE",
        "E'a\\'b'",
        "'a\\b'",
        "'unterminated",
        "",
        "a,",
        "a b",
    ] {
        assert!(!is_plain(not), "{not}");
    }
    for sql in [
        "SET TIME ZONE INTERVAL '+02:00' HOUR TO MINUTE",
        "SET TIME ZONE interval'+02:00'",
    ] {
        assert_eq!(parse_change(sql), Change::Unknown, "{sql}");
    }
    assert_eq!(
        parse_change("SET TIME ZONE intervals_are_no_zone"),
        set("timezone", "intervals_are_no_zone")
    );
    let mut s = Settings::default();
    assert!(s.apply(&set("timezone", "INTERVAL '+02:00' HOUR TO MINUTE")));
    assert!(
        s.is_fragile(),
        "a value that is not plain is replayed answered"
    );
}

#[test]
fn a_list_of_names_at_startup_is_set_again_as_a_list() {
    let s = Settings::from_startup(&[
        ("search_path".into(), "App, \"Mixed\"\"Case\",$user".into()),
        ("options".into(), "-c temp_tablespaces=a,b".into()),
        ("DateStyle".into(), "ISO, MDY".into()),
    ]);
    assert_eq!(
        s.get("search_path"),
        Some("\"app\", \"Mixed\"\"Case\", \"$user\"")
    );
    assert_eq!(s.get("temp_tablespaces"), Some("\"a\", \"b\""));
    assert_eq!(s.get("datestyle"), Some("'ISO, MDY'"));
    assert!(s.is_fragile(), "tablespaces can be dropped");
}

#[test]
fn a_comment_is_never_part_of_a_value() {
    assert_eq!(
        parse_change("SET search_path = app -- why\n"),
        set("search_path", "app")
    );
    assert_eq!(
        parse_change("/* by the app */ SET statement_timeout = '5s' /* a /* nested */ note */;"),
        set("statement_timeout", "'5s'")
    );
    assert_eq!(
        parse_change("SET application_name = 'a -- b'"),
        set("application_name", "'a -- b'")
    );
    assert_eq!(parse_change("SET x.y = 1 /* not closed"), Change::Unknown);
}
