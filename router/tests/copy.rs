//! COPY through the router: FROM STDIN into a sharded table is split by key (text and CSV,
//! with HEADER), TO STDOUT gathers every shard; bad keys and failing shards are reported.

mod common;

use std::process::Command;

use common::{pg_program, run, shared_env};
use shardmap::Key;

fn psql(env: &common::Env, args: &[&str]) -> (bool, String, String) {
    run(Command::new(pg_program("psql"))
        .arg(env.router.url())
        .args(["-X", "-v", "ON_ERROR_STOP=1"])
        .args(args))
}

fn count_on(env: &common::Env, shard: usize, filter: &str) -> usize {
    env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE {filter}"))
        .parse()
        .expect("count")
}

#[test]
fn copy_in_splits_rows_by_key_and_copy_out_gathers() {
    let env = shared_env();
    let dir = &env.router.dir;
    // CSV with a header and quoted values (a comma and a newline inside quotes).
    let csv: String = std::iter::once("id,v\n".to_string())
        .chain((16_000_000..16_001_000i64).map(|i| format!("{i},\"csv, row\n{i}\"\n")))
        .collect();
    std::fs::write(dir.join("rows.csv"), csv).expect("csv");
    let (ok, out, err) = psql(
        env,
        &[
            "-c",
            &format!(
                "\\copy kv (id, v) FROM '{}' WITH (FORMAT csv, HEADER true)",
                dir.join("rows.csv").display()
            ),
        ],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("COPY 1000"), "{out}");
    let mut expected = [0usize; 4];
    for i in 16_000_000..16_001_000i64 {
        expected[env.map.shard_for_key(&Key::Int(i))] += 1;
    }
    for (s, want) in expected.iter().enumerate() {
        assert_eq!(
            count_on(env, s, "id >= 16000000 AND id < 16001000"),
            *want,
            "shard {s}"
        );
    }
    assert_eq!(
        env.on_shard(
            env.shard_of(16_000_007),
            "SELECT v FROM kv WHERE id = 16000007"
        ),
        "csv, row\n16000007"
    );

    // Text format (tabs, backslash escapes).
    let text: String = (16_001_000..16_001_500i64)
        .map(|i| format!("{i}\ttext\\trow {i}\n"))
        .collect();
    std::fs::write(dir.join("rows.txt"), text).expect("txt");
    let (ok, out, err) = psql(
        env,
        &[
            "-c",
            &format!(
                "\\copy kv (id, v) FROM '{}'",
                dir.join("rows.txt").display()
            ),
        ],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("COPY 500"), "{out}");
    let total: usize = (0..4)
        .map(|s| count_on(env, s, "id >= 16001000 AND id < 16001500"))
        .sum();
    assert_eq!(total, 500);
    assert_eq!(
        env.on_shard(
            env.shard_of(16_001_003),
            "SELECT v FROM kv WHERE id = 16001003"
        ),
        "text\trow 16001003"
    );

    // COPY TO STDOUT gathers from every shard.
    let (ok, out, err) = psql(
        env,
        &[
            "-c",
            "\\copy (SELECT id FROM kv WHERE id >= 16000000 AND id < 16001500) TO STDOUT",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().filter(|l| l.parse::<i64>().is_ok()).count(),
        1500,
        "{out}"
    );
    let (ok, _, err) = psql(env, &["-c", "\\copy (SELECT count(*) FROM kv) TO STDOUT"]);
    assert!(
        !ok && err.contains("not supported"),
        "a count is refused in COPY: {err}"
    );
    let (ok, out, err) = psql(env, &["-c", "\\copy kv TO STDOUT"]);
    assert!(ok, "{err}");
    let direct: usize = (0..4).map(|s| count_on(env, s, "true")).sum();
    assert!(
        out.lines().count() >= 1500 && out.lines().count() <= direct + 1000,
        "lines: {}",
        out.lines().count()
    );
}

#[test]
fn copy_in_errors_name_what_went_wrong() {
    let env = shared_env();
    let dir = &env.router.dir;
    // A key that is not a bigint: nothing is loaded anywhere.
    std::fs::write(
        dir.join("bad.csv"),
        "16100001,a\nnot-a-number,b\n16100002,c\n",
    )
    .expect("csv");
    let (ok, _, err) = psql(
        env,
        &[
            "-c",
            &format!(
                "\\copy kv (id, v) FROM '{}' CSV",
                dir.join("bad.csv").display()
            ),
        ],
    );
    assert!(!ok);
    assert!(err.contains("not a bigint"), "{err}");
    let loaded: usize = (0..4)
        .map(|s| count_on(env, s, "id IN (16100001, 16100002)"))
        .sum();
    assert_eq!(loaded, 0, "a rejected COPY loads nothing");

    // One shard already has one of the keys: that shard fails, the others load their rows.
    let taken = env.key_on(1, 16_200_000);
    env.on_shard(1, &format!("INSERT INTO kv VALUES ({taken}, 'already')"));
    let rows: String = (16_200_000..16_200_100i64)
        .map(|i| format!("{i},new\n"))
        .collect();
    std::fs::write(dir.join("dup.csv"), rows).expect("csv");
    let (ok, _, err) = psql(
        env,
        &[
            "-c",
            &format!(
                "\\copy kv (id, v) FROM '{}' CSV",
                dir.join("dup.csv").display()
            ),
        ],
    );
    assert!(!ok);
    let range = env.map.shards()[1].range.to_string();
    assert!(
        err.contains("1 of 4 shards") && err.contains(&range) && err.contains("duplicate key"),
        "{err}"
    );
    assert_eq!(
        count_on(env, 1, "id >= 16200000 AND id < 16200100 AND v = 'new'"),
        0
    );
    assert!(count_on(env, 0, "id >= 16200000 AND id < 16200100 AND v = 'new'") > 0);

    // Without a column list naming the key, COPY into a sharded table is refused.
    let (ok, _, err) = psql(
        env,
        &[
            "-c",
            &format!("\\copy kv FROM '{}' CSV", dir.join("dup.csv").display()),
        ],
    );
    assert!(!ok);
    assert!(err.contains("column list"), "{err}");
}
