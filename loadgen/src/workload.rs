//! What a request is: the operation mix (`--mix`), the statements of each operation, and how
//! they are sent (`--protocol`).

use std::fmt;
use std::time::Duration;

use rand::Rng;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

/// Point select by primary key (the reference workload).
pub const READ_SQL: &str = "SELECT v FROM kv WHERE id = $1";
pub const UPDATE_SQL: &str = "UPDATE kv SET v = $2 WHERE id = $1";
pub const INSERT_SQL: &str = "INSERT INTO kv (id, v) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING";

/// One kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Read,
    Update,
    Insert,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::Read, Op::Update, Op::Insert];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Update => "update",
            Op::Insert => "insert",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Relative weights of reads, updates and inserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    weights: [u32; 3],
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            weights: [100, 0, 0],
        }
    }
}

impl Mix {
    /// Parses `read=90,update=5,insert=5` (weights, not necessarily summing to 100; missing
    /// operations get 0).
    pub fn parse(text: &str) -> Result<Mix, crate::Error> {
        let mut weights = [0u32; 3];
        let mut seen = [false; 3];
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').ok_or_else(|| {
                format!("--mix {text:?}: {part:?} is not NAME=WEIGHT; write e.g. read=90,update=5,insert=5")
            })?;
            let op = Op::ALL
                .into_iter()
                .find(|o| o.name() == name.trim())
                .ok_or_else(|| {
                    format!(
                        "--mix {text:?}: unknown operation {name:?}; use read, update and insert"
                    )
                })?;
            let w: u32 = value.trim().parse().map_err(|_| {
                format!(
                    "--mix {text:?}: the weight of {name} must be a whole number, got {value:?}"
                )
            })?;
            if seen[op.index()] {
                return Err(format!("--mix {text:?}: {name} is given twice"));
            }
            seen[op.index()] = true;
            weights[op.index()] = w;
        }
        if weights.iter().all(|&w| w == 0) {
            return Err(format!(
                "--mix {text:?}: at least one weight must be above 0"
            ));
        }
        Ok(Mix { weights })
    }

    /// An operation, drawn with the mix's weights.
    pub fn pick<R: Rng>(&self, rng: &mut R) -> Op {
        let total: u32 = self.weights.iter().sum();
        if self.weights[0] == total {
            return Op::Read;
        }
        let mut x = rng.random_range(0..total);
        for op in Op::ALL {
            if x < self.weights[op.index()] {
                return op;
            }
            x -= self.weights[op.index()];
        }
        Op::Read
    }

    pub fn weight(&self, op: Op) -> u32 {
        self.weights[op.index()]
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = Op::ALL
            .into_iter()
            .filter(|o| self.weight(*o) > 0)
            .map(|o| format!("{}={}", o.name(), self.weight(o)))
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// How statements are sent.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Query messages with the key as a literal (what psql sends).
    Simple,
    /// Parse/Bind/Execute of the unnamed statement every time, one round trip.
    Extended,
    /// Prepared once per connection, then Bind/Execute only.
    Prepared,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Simple => "simple",
            Protocol::Extended => "extended",
            Protocol::Prepared => "prepared",
        })
    }
}

/// One connection, ready to run the workload's statements.
pub struct Conn {
    pub client: Client,
    protocol: Protocol,
    /// `prepared`: the statements of the operations the mix uses, by [`Op::index`].
    prepared: [Option<Statement>; 3],
}

impl Op {
    fn sql_and_types(self) -> (&'static str, &'static [Type]) {
        match self {
            Op::Read => (READ_SQL, &[Type::INT8]),
            Op::Update => (UPDATE_SQL, &[Type::INT8, Type::TEXT]),
            Op::Insert => (INSERT_SQL, &[Type::INT8, Type::TEXT]),
        }
    }
}

impl Conn {
    /// Connects and, for `prepared`, prepares the statements the mix uses (only those: a
    /// read-only workload must not need a table it could update).
    pub async fn open(
        url: &str,
        protocol: Protocol,
        mix: Mix,
        timeout: Duration,
    ) -> Result<Conn, tokio_postgres::Error> {
        let client = crate::target::connect(url, timeout).await?;
        let mut prepared = [None, None, None];
        if protocol == Protocol::Prepared {
            for op in Op::ALL.into_iter().filter(|o| mix.weight(*o) > 0) {
                let (sql, types) = op.sql_and_types();
                prepared[op.index()] = Some(client.prepare_typed(sql, types).await?);
            }
        }
        Ok(Conn {
            client,
            protocol,
            prepared,
        })
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Runs one request; `value` is the text written by updates and inserts.
    pub async fn exec(&self, op: Op, id: i64, value: &str) -> Result<(), tokio_postgres::Error> {
        match (self.protocol, &self.prepared[op.index()]) {
            (Protocol::Prepared, Some(stmt)) => match op {
                Op::Read => self.client.query(stmt, &[&id]).await.map(drop),
                Op::Update | Op::Insert => {
                    self.client.execute(stmt, &[&id, &value]).await.map(drop)
                }
            },
            (Protocol::Simple, _) => {
                // Keys are integers and values are made by loadgen from [a-z0-9]: no quoting needed.
                let sql = match op {
                    Op::Read => format!("SELECT v FROM kv WHERE id = {id}"),
                    Op::Update => format!("UPDATE kv SET v = '{value}' WHERE id = {id}"),
                    Op::Insert => format!(
                        "INSERT INTO kv (id, v) VALUES ({id}, '{value}') ON CONFLICT (id) DO NOTHING"
                    ),
                };
                self.client.simple_query(&sql).await.map(drop)
            }
            _ => match op {
                Op::Read => self
                    .client
                    .query_typed(READ_SQL, &[(&id, Type::INT8)])
                    .await
                    .map(drop),
                Op::Update => self
                    .client
                    .execute_typed(UPDATE_SQL, &[(&id, Type::INT8), (&value, Type::TEXT)])
                    .await
                    .map(drop),
                Op::Insert => self
                    .client
                    .execute_typed(INSERT_SQL, &[(&id, Type::INT8), (&value, Type::TEXT)])
                    .await
                    .map(drop),
            },
        }
    }
}

/// A row value of `len` characters from [a-z0-9], different for different ids.
pub fn value_for(id: i64, len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parses_and_rejects() {
        let m = Mix::parse("read=90,update=5,insert=5").expect("mix");
        assert_eq!(m.to_string(), "read=90,update=5,insert=5");
        assert_eq!(Mix::parse("update=1").expect("mix").to_string(), "update=1");
        for bad in ["", "read", "read=x", "delete=3", "read=0", "read=1,read=2"] {
            assert!(Mix::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mix_draws_in_proportion() {
        let m = Mix::parse("read=50,insert=50").expect("mix");
        let mut rng = rand::rng();
        let reads = (0..10_000).filter(|_| m.pick(&mut rng) == Op::Read).count();
        assert!((4000..6000).contains(&reads), "{reads}");
    }

    #[test]
    fn values_are_plain_text() {
        let v = value_for(42, 20);
        assert_eq!(v.len(), 20);
        assert!(v.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(v, value_for(43, 20));
    }
}
