//! What a run is asked to do and how it is split over connections ("lanes"): the rate, the
//! connections' targets, their open-loop rates and phases, and which shard each request goes
//! to. Pure: no I/O, so the exactness of per-shard rates is unit tested here.
//!
//! Through routers, the lanes' requests interleave into one schedule for the whole run whose
//! every block of N consecutive requests visits each of the N shards once
//! (`Shards::Interleaved`), so every shard gets its rate exactly; straight to the shards,
//! each lane serves one shard.

use std::time::{Duration, SystemTime};

use crate::report::Settings;
use crate::schedule;
use crate::target::{Mode, Topology};
use crate::workload::{Mix, Protocol};

/// The request rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// Closed loop: every connection sends its next request as soon as a slot is free.
    Max,
    /// Open loop, requests a second over all shards.
    Total(f64),
    /// Open loop, requests a second to each shard.
    PerShard(f64),
}

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub topology: Topology,
    pub rows_per_shard: usize,
    pub connections: usize,
    pub pipeline: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub rate: Rate,
    pub mix: Mix,
    pub zipf: Option<f64>,
    pub protocol: Protocol,
    pub timeout: Duration,
    /// Open loop: requests due within this much of a wake-up are sent with it (see
    /// `--batch-window`).
    pub batch_window: Duration,
    pub threads: usize,
    pub value_size: usize,
    pub quiet: bool,
    pub seed: Option<u64>,
    /// When the load starts (wall clock), so several hosts start together; `None`: now.
    pub start_at: Option<SystemTime>,
    /// This host's name in reports (default: its hostname).
    pub label: Option<String>,
}

impl RunConfig {
    /// The total open-loop rate, if any.
    pub fn total_rate(&self) -> Option<f64> {
        match self.rate {
            Rate::Max => None,
            Rate::Total(r) => Some(r),
            Rate::PerShard(r) => Some(r * self.topology.map.shards().len() as f64),
        }
    }

    pub(crate) fn settings(&self) -> Settings {
        let shards = self.topology.map.shards().len();
        Settings {
            mode: match self.topology.mode {
                Mode::Direct => "direct".into(),
                Mode::Routers(_) => "router".into(),
            },
            targets: self.topology.describe(),
            shardmap: self.topology.map_path.clone(),
            connections: self.lane_count(),
            pipeline: self.pipeline,
            protocol: self.protocol.to_string(),
            mix: self.mix.to_string(),
            keys: match self.zipf {
                None => "uniform".into(),
                Some(s) => format!("zipf {s}"),
            },
            rows_per_shard: self.rows_per_shard,
            rate: match self.rate {
                Rate::Max => "max".into(),
                Rate::Total(r) => format!("{r}/s total"),
                Rate::PerShard(r) => format!("{r}/s per shard ({}/s total)", r * shards as f64),
            },
            duration_s: self.duration.as_secs_f64(),
            warmup_s: self.warmup.as_secs_f64(),
            timeout_ms: self.timeout.as_millis() as u64,
            threads: self.threads,
            start_at: self
                .start_at
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
        }
    }

    /// Connections actually opened: direct mode needs at least one per shard.
    pub fn lane_count(&self) -> usize {
        match self.topology.mode {
            Mode::Direct => self.connections.max(self.topology.map.shards().len()),
            Mode::Routers(_) => self.connections.max(1),
        }
    }
}

/// Which shards a lane's requests go to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shards {
    /// Always this one (direct mode: the connection is to its primary).
    Fixed(usize),
    /// Through routers: lane `lane` of `lanes` sends requests `lane, lane + lanes, ...` of the
    /// run's single interleaved schedule, and request `k` goes to shard [`block_shard`]`(k)`:
    /// every block of `shards` consecutive requests visits every shard once, so over any
    /// window every shard's count is within two of every other's, and each lane still reaches
    /// every shard over time (a plain `k mod shards` would pin a lane to `shards / gcd` of them).
    Interleaved { lane: u64, lanes: u64 },
}

impl Shards {
    /// The shard of the lane's `seq`-th request, of `shards`.
    pub(crate) fn of(self, seq: u64, shards: usize) -> usize {
        match self {
            Shards::Fixed(s) => s,
            Shards::Interleaved { lane, lanes } => {
                block_shard(lane.wrapping_add(seq.wrapping_mul(lanes)), shards)
            }
        }
    }
}

/// The shard of the run's `k`-th request: block `k / shards` is the shards in order, rotated by
/// an offset that a hash of the block number picks.
fn block_shard(k: u64, shards: usize) -> usize {
    let n = shards.max(1) as u64;
    let offset = splitmix64(k / n) % n;
    ((k % n + offset) % n) as usize
}

/// SplitMix64's finaliser: a well-mixed 64-bit value from a counter.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug, Clone)]
pub(crate) struct LaneSpec {
    pub(crate) url: String,
    /// Index of the router (`--target`) it goes to; in direct mode, of its shard.
    pub(crate) target: usize,
    pub(crate) shards: Shards,
    /// Open-loop rate and phase.
    pub(crate) rate: Option<(f64, Duration)>,
}

pub(crate) fn plan_lanes(cfg: &RunConfig) -> Vec<LaneSpec> {
    let n = cfg.lane_count();
    let shards = cfg.topology.map.shards().len();
    let total = cfg.total_rate();
    match cfg.topology.mode {
        Mode::Direct => {
            let per_shard_rate = total.map(|t| t / shards as f64);
            (0..n)
                .map(|i| {
                    let shard = i % shards;
                    let j = i / shards;
                    let lanes_of_shard = n / shards + usize::from(shard < n % shards);
                    let rate = per_shard_rate.map(|r| {
                        let (lane_rate, phase) = schedule::split(r, lanes_of_shard)[j];
                        // Shards start staggered so their requests do not arrive in bursts.
                        let stagger = total.map_or(0.0, |t| shard as f64 / t);
                        (lane_rate, phase + Duration::from_secs_f64(stagger))
                    });
                    LaneSpec {
                        url: cfg.topology.url_for(i, shard).to_string(),
                        target: shard,
                        shards: Shards::Fixed(shard),
                        rate,
                    }
                })
                .collect()
        }
        Mode::Routers(ref targets) => {
            let parts = total.map(|t| schedule::split(t, n));
            (0..n)
                .map(|i| LaneSpec {
                    url: cfg.topology.url_for(i, 0).to_string(),
                    target: i % targets.len().max(1),
                    shards: Shards::Interleaved {
                        lane: i as u64,
                        lanes: n as u64,
                    },
                    rate: parts.as_ref().map(|p| p[i]),
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;
    use shardmap::ShardMap;
    use shardmap::{KeyType, Table};
    use std::time::Instant;

    fn config(shards: usize, targets: usize, connections: usize, rate: Rate) -> RunConfig {
        let urls: Vec<String> = (0..shards)
            .map(|i| format!("postgres://u@10.0.0.1:5432/shard_{i}"))
            .collect();
        let map = ShardMap::even_split(&urls, vec![Table::new("kv", "id", KeyType::BigInt)])
            .expect("map");
        let mode = if targets == 0 {
            Mode::Direct
        } else {
            Mode::Routers(
                (0..targets)
                    .map(|i| format!("postgres://u@10.0.1.{i}:6432/app"))
                    .collect(),
            )
        };
        RunConfig {
            topology: Topology {
                map,
                map_path: None,
                mode,
            },
            rows_per_shard: 10,
            connections,
            pipeline: 1,
            duration: Duration::from_secs(10),
            warmup: Duration::from_millis(1300),
            rate,
            mix: Mix::default(),
            zipf: None,
            protocol: Protocol::Prepared,
            timeout: Duration::from_secs(1),
            batch_window: Duration::ZERO,
            threads: 1,
            value_size: 8,
            quiet: true,
            seed: None,
            start_at: None,
            label: None,
        }
    }

    /// Requests per shard whose intended time falls in the measured window, as `run` counts
    /// them.
    fn per_shard_in_window(cfg: &RunConfig) -> Vec<u64> {
        let shards = cfg.topology.map.shards().len();
        let start = Instant::now();
        let (from, end) = (start + cfg.warmup, start + cfg.warmup + cfg.duration);
        let mut counts = vec![0u64; shards];
        for spec in plan_lanes(cfg) {
            let Some((rate, phase)) = spec.rate else {
                continue;
            };
            let mut sched = Schedule::new(start, rate, phase);
            let mut seq = 0;
            while sched.peek() < end {
                let at = sched.take();
                let shard = spec.shards.of(seq, shards);
                seq += 1;
                if at >= from {
                    counts[shard] += 1;
                }
            }
        }
        counts
    }

    #[test]
    fn every_shard_gets_its_rate_within_half_a_percent() {
        // The case (512 shards, 20/s each through a router) and awkward ratios of
        // connections to shards and routers.
        for (shards, targets, conns) in [
            (512, 1, 8),
            (512, 3, 64),
            (64, 3, 48),
            (7, 2, 12),
            (4, 1, 8),
            (5, 0, 12),
        ] {
            let cfg = config(shards, targets, conns, Rate::PerShard(20.0));
            let counts = per_shard_in_window(&cfg);
            let want = 20.0 * cfg.duration.as_secs_f64();
            // Within two of each other (a partial block at each end of the window).
            let (lo, hi) = (
                counts.iter().min().copied().unwrap_or(0),
                counts.iter().max().copied().unwrap_or(0),
            );
            assert!(hi - lo <= 2, "{shards} shards: {lo}..{hi}");
            for (i, &n) in counts.iter().enumerate() {
                assert!(
                    (n as f64 - want).abs() <= want * 0.005,
                    "{shards} shards, {targets} routers, {conns} connections: shard {i} got {n} of {want}"
                );
            }
        }
    }

    #[test]
    fn every_lane_reaches_every_shard() {
        // 64 connections over 512 shards: k mod 512 would give each only 8 shards.
        let cfg = config(512, 1, 64, Rate::PerShard(20.0));
        for spec in plan_lanes(&cfg).iter().take(4) {
            let mut seen = vec![false; 512];
            for seq in 0..20_000 {
                seen[spec.shards.of(seq, 512)] = true;
            }
            let reached = seen.iter().filter(|s| **s).count();
            assert!(reached > 500, "a lane reached only {reached} of 512 shards");
        }
    }

    #[test]
    fn lanes_spread_over_routers() {
        let cfg = config(16, 3, 7, Rate::Total(700.0));
        let lanes = plan_lanes(&cfg);
        let per_router: Vec<usize> = (0..3)
            .map(|t| lanes.iter().filter(|l| l.target == t).count())
            .collect();
        assert_eq!(per_router, [3, 2, 2]);
        assert!(lanes
            .iter()
            .all(|l| l.url.ends_with(&format!("10.0.1.{}:6432/app", l.target))));
    }
}
