//! Randomized tests of everything that reads what a client sends: frames and frontend messages
//! ([`wire`]), startup packets and the SCRAM exchange ([`login`]), and the statement text
//! readers — the normalizer, the array literal reader and the VALUES cutter ([`text`]) — and
//! the value readers of merges across shards ([`merge`]).
//!
//! Stable Rust has no coverage-guided fuzzer (cargo-fuzz needs nightly), so these are seeded
//! random loops: arbitrary bytes, inputs built from real grammar pieces, and real messages
//! (written by `postgres-protocol`, the client library tokio-postgres uses) mutated by byte
//! flips, truncations, insertions and corrupted length fields. Every target checks that
//! nothing panics, and where there is a writer or an invariant, that it holds.
//!
//! `cargo test -p shardgate --test fuzz_parsers` runs a short mode (a few thousand cases per target);
//! `SHARDGATE_FUZZ_CASES=N` runs N per target and `SHARDGATE_FUZZ_SEED=S` another seed
//! (`benches/fuzz.sh` runs the long mode). A failing case prints its target, seed and number.

#[path = "fuzz_parsers/login.rs"]
mod login;
#[path = "fuzz_parsers/merge.rs"]
mod merge;
#[path = "fuzz_parsers/text.rs"]
mod text;
#[path = "fuzz_parsers/wire.rs"]
mod wire;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Cases per target in the short mode (`cargo test`).
const SHORT_CASES: u64 = 3000;

/// Runs `case` for the configured number of cases, each with its own RNG derived from the
/// seed, the target's name and the case number, so a failure can be replayed alone.
pub(crate) fn run(target: &str, mut case: impl FnMut(&mut StdRng)) {
    let cases = env_u64("SHARDGATE_FUZZ_CASES").unwrap_or(SHORT_CASES);
    let seed = env_u64("SHARDGATE_FUZZ_SEED").unwrap_or(0x5eed_cafe);
    let only = env_u64("SHARDGATE_FUZZ_CASE");
    let salt = target.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let started = std::time::Instant::now();
    for n in 0..cases {
        if only.is_some_and(|o| o != n) {
            continue;
        }
        let mut rng = StdRng::seed_from_u64(seed ^ salt ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let report = Report { target, seed, n };
        case(&mut rng);
        std::mem::forget(report);
    }
    eprintln!(
        "fuzz {target}: {cases} cases in {:.1}s (seed {seed:#x})",
        started.elapsed().as_secs_f64()
    );
}

/// Says which case failed when a case panics (it is dropped only while unwinding).
struct Report<'a> {
    target: &'a str,
    seed: u64,
    n: u64,
}

impl Drop for Report<'_> {
    fn drop(&mut self) {
        eprintln!(
            "fuzz {}: case {} failed; replay with SHARDGATE_FUZZ_SEED={} SHARDGATE_FUZZ_CASE={}",
            self.target, self.n, self.seed, self.n
        );
    }
}

/// `name` as a number (decimal, or hex with `0x`, as failures print seeds); a value that is
/// not one stops the run rather than being ignored.
fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => t.replace('_', "").parse(),
    };
    match parsed {
        Ok(v) => Some(v),
        Err(e) => panic!("{name}={text:?} is not a number (decimal, or hex with 0x): {e}"),
    }
}

/// Bytes that parsers treat specially, to make random input hit their branches.
const INTERESTING: &[u8] = b"\0\xff\x7f\x80\xc3'\"$\\,;=(){}[]-/*\n\r Ee0123456789pnyrcS";

/// Random bytes, up to `max` long, often drawn from [`INTERESTING`].
pub(crate) fn bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let len = rng.random_range(0..=max);
    (0..len).map(|_| byte(rng)).collect()
}

fn byte(rng: &mut StdRng) -> u8 {
    if rng.random_bool(0.5) {
        INTERESTING[rng.random_range(0..INTERESTING.len())]
    } else {
        rng.random()
    }
}

/// Lengths that break length fields: negative, zero, off by one, huge.
fn bad_length(rng: &mut StdRng, len: usize) -> i32 {
    let len = len as i32;
    match rng.random_range(0..8) {
        0 => -1,
        1 => 0,
        2 => 3,
        3 => len.saturating_sub(1),
        4 => len.saturating_add(1),
        5 => i32::MAX,
        6 => i32::MIN,
        _ => rng.random(),
    }
}

/// Mutates `input` one to four times: bit flips, random bytes, truncation, insertion,
/// duplication of a slice, or a corrupted 4- or 2-byte length field.
pub(crate) fn mutate(rng: &mut StdRng, input: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..=4) {
        let len = input.len();
        let at = if len == 0 {
            0
        } else {
            rng.random_range(0..len)
        };
        match rng.random_range(0..7) {
            0 if len > 0 => input[at] ^= 1 << rng.random_range(0..8),
            1 if len > 0 => input[at] = byte(rng),
            2 => input.truncate(rng.random_range(0..=len)),
            3 => {
                let extra = bytes(rng, 8);
                input.splice(at..at, extra);
            }
            4 if len > 0 => {
                let end = rng.random_range(at..=len.min(at + 16));
                let copy = input[at..end].to_vec();
                input.splice(at..at, copy);
            }
            5 if len >= 4 => {
                let at = rng.random_range(0..=len - 4);
                let v = bad_length(rng, len);
                input[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            6 if len >= 2 => {
                let at = rng.random_range(0..=len - 2);
                let v = [i16::MIN, -1, 0, 1, 2, i16::MAX][rng.random_range(0..6)];
                input[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
            _ => input.push(byte(rng)),
        }
    }
}

/// A string of up to `max` characters for names and values: ASCII, some punctuation that
/// matters to the parsers, and multi-byte characters; never NUL.
pub(crate) fn text(rng: &mut StdRng, max: usize) -> String {
    const CHARS: &[char] = &[
        'a', 'b', 'z', 'A', 'Z', '0', '9', '_', ' ', ',', '=', '\'', '"', '\\', '$', '{', '}', '(',
        ')', ';', '-', '\n', 'é', 'ß', '€', '😀', '\u{7f}', '\u{1}',
    ];
    let len = rng.random_range(0..=max);
    (0..len)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())])
        .collect()
}
