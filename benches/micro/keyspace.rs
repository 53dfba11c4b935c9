//! Nanoseconds per keyspace ID (per key type) and per shard lookup in a 512-shard map: the
//! per-statement cost of routing once the key is known. Plus the whole step from a key as it
//! arrives on the wire (a text-format Bind parameter or literal, e.g. `b"123456"`) to its shard,
//! and a 4096-shard lookup to show how lookups scale with the map.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardmap::{Key, KeyspaceId, ShardMap};

fn keyspace_ids(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyspace_id");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bigint", |b| {
        let mut i = 0i64;
        b.iter(|| {
            i = i.wrapping_add(0x9e37_79b9);
            black_box(Key::Int(black_box(i)).keyspace_id())
        })
    });
    let text = "user-000123456@example.com";
    g.bench_function("text_26_bytes", |b| {
        b.iter(|| black_box(Key::Text(black_box(text)).keyspace_id()))
    });
    let uuid = *uuid_bytes();
    g.bench_function("uuid", |b| {
        b.iter(|| black_box(Key::Uuid(black_box(uuid)).keyspace_id()))
    });
    g.finish();
}

fn uuid_bytes() -> &'static [u8; 16] {
    &[
        0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a,
        0x11,
    ]
}

fn lookups(c: &mut Criterion) {
    let urls: Vec<String> = (0..512)
        .map(|i| format!("postgres://10.0.{}.{}:5432/app", i / 256, i % 256))
        .collect();
    let map = ShardMap::even_split(&urls, vec![]).expect("512-shard map");
    let mut g = c.benchmark_group("lookup_512_shards");
    g.throughput(Throughput::Elements(1));
    g.bench_function("shard_for", |b| {
        let mut id = 0u64;
        b.iter(|| {
            id = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
            black_box(map.shard_for(KeyspaceId(black_box(id))))
        })
    });
    g.bench_function("bigint_key_to_shard", |b| {
        let mut i = 0i64;
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(map.shard_for_key(&Key::Int(black_box(i))))
        })
    });
    // What the router does per statement once the planner knows where the key is: parse the
    // text bytes of the parameter, hash, look up.
    let params: Vec<Vec<u8>> = (0..1024i64)
        .map(|i| (i * 7_919 + 1).to_string().into_bytes())
        .collect();
    g.bench_function("bigint_text_param_to_shard", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & 1023;
            let text = std::str::from_utf8(black_box(&params[i])).expect("ascii digits");
            let key: i64 = text.parse().expect("a bigint");
            black_box(map.shard_for_key(&Key::Int(key)))
        })
    });
    g.finish();

    let urls: Vec<String> = (0..4096)
        .map(|i| format!("postgres://10.{}.{}.1:5432/app", i / 256, i % 256))
        .collect();
    let big = ShardMap::even_split(&urls, vec![]).expect("4096-shard map");
    let mut g = c.benchmark_group("lookup_4096_shards");
    g.throughput(Throughput::Elements(1));
    g.bench_function("shard_for", |b| {
        let mut id = 0u64;
        b.iter(|| {
            id = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
            black_box(big.shard_for(KeyspaceId(black_box(id))))
        })
    });
    g.finish();
}

criterion_group!(benches, keyspace_ids, lookups);
criterion_main!(benches);
