//! Keys, key types and the keyspace ID they hash to.
//!
//! A sharded table names one key column of a supported type. Its values map to a 64-bit
//! keyspace ID with Postgres's own extended hash functions and one fixed seed, so the same ID
//! can be computed by the router (here) and by any shard (in SQL, see [`crate::predicate`]).

use std::fmt;

use crate::hash;

/// The seed of every keyspace hash. Changing it moves every row: it is part of the on-disk
/// placement, like the hash functions themselves.
pub const KEYSPACE_SEED: u64 = 0;

/// A position in the keyspace: the unsigned view of the 64 bits Postgres's hash returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyspaceId(pub u64);

impl KeyspaceId {
    /// The value Postgres shows for the same hash (its `bigint` is signed).
    pub fn as_pg_bigint(self) -> i64 {
        self.0 as i64
    }
}

impl fmt::Display for KeyspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The type of a sharding key column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyType {
    SmallInt,
    Integer,
    BigInt,
    Text,
    Uuid,
}

impl KeyType {
    /// Every spelling accepted in `shardmap.toml`, for error messages.
    pub const ACCEPTED: &'static str =
        "bigint (int8), integer (int, int4), smallint (int2), text (varchar), uuid";

    /// Parses a Postgres type name as written in `shardmap.toml`.
    pub fn parse(name: &str) -> Option<KeyType> {
        match name.trim().to_ascii_lowercase().as_str() {
            "bigint" | "int8" => Some(KeyType::BigInt),
            "integer" | "int" | "int4" => Some(KeyType::Integer),
            "smallint" | "int2" => Some(KeyType::SmallInt),
            "text" | "varchar" | "character varying" => Some(KeyType::Text),
            "uuid" => Some(KeyType::Uuid),
            _ => None,
        }
    }

    /// The canonical Postgres name.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::SmallInt => "smallint",
            KeyType::Integer => "integer",
            KeyType::BigInt => "bigint",
            KeyType::Text => "text",
            KeyType::Uuid => "uuid",
        }
    }

    /// The largest value of an integer type (`None` for the others): how far keys the router
    /// gives may go.
    pub fn integer_max(self) -> Option<i64> {
        match self {
            KeyType::SmallInt => Some(i16::MAX.into()),
            KeyType::Integer => Some(i32::MAX.into()),
            KeyType::BigInt => Some(i64::MAX),
            KeyType::Text | KeyType::Uuid => None,
        }
    }

    /// The Postgres function that computes the keyspace ID of a column of this type.
    pub fn pg_hash_function(self) -> &'static str {
        match self {
            KeyType::SmallInt => "hashint2extended",
            KeyType::Integer => "hashint4extended",
            KeyType::BigInt => "hashint8extended",
            KeyType::Text => "hashtextextended",
            KeyType::Uuid => "uuid_hash_extended",
        }
    }

    /// Parses the text form of a key of this type, as a client would write it in SQL.
    pub fn parse_key(self, text: &str) -> Result<Key<'_>, KeyError> {
        let bad = |why: &'static str| KeyError {
            key_type: self,
            value: text.to_string(),
            why,
        };
        match self {
            KeyType::SmallInt => text
                .trim()
                .parse::<i16>()
                .map(|v| Key::Int(i64::from(v)))
                .map_err(|_| bad("not a smallint (-32768 to 32767)")),
            KeyType::Integer => text
                .trim()
                .parse::<i32>()
                .map(|v| Key::Int(i64::from(v)))
                .map_err(|_| bad("not an integer (-2147483648 to 2147483647)")),
            KeyType::BigInt => text
                .trim()
                .parse::<i64>()
                .map(Key::Int)
                .map_err(|_| bad("not a bigint (a 64-bit signed integer)")),
            KeyType::Text => Ok(Key::Text(text)),
            KeyType::Uuid => uuid::Uuid::try_parse(text.trim())
                .map(|u| Key::Uuid(*u.as_bytes()))
                .map_err(|_| bad("not a uuid (e.g. a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11)")),
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A key value that could not be read as its column's type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {key_type} key {value:?}: {why}")]
pub struct KeyError {
    pub key_type: KeyType,
    pub value: String,
    pub why: &'static str,
}

/// A sharding key value, borrowed where it can be so that hashing allocates nothing.
///
/// All integer widths are one variant: Postgres hashes an int2, int4 and int8 of the same value
/// to the same ID, and so do we.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key<'a> {
    Int(i64),
    Text(&'a str),
    Uuid([u8; 16]),
}

impl Key<'_> {
    /// The key as an SQL literal of its type's text form (`42`, `'a''b'`, `'0e...-...'`).
    pub fn sql_literal(&self) -> String {
        match self {
            Key::Int(v) => v.to_string(),
            Key::Text(s) => crate::sql::quote_literal(s),
            Key::Uuid(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                format!(
                    "'{}-{}-{}-{}-{}'",
                    &hex[..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..]
                )
            }
        }
    }

    /// The keyspace ID of this key.
    #[inline]
    pub fn keyspace_id(&self) -> KeyspaceId {
        KeyspaceId(match *self {
            Key::Int(v) => hash::hashint8extended(v, KEYSPACE_SEED),
            Key::Text(s) => hash::hashtextextended(s, KEYSPACE_SEED),
            Key::Uuid(ref u) => hash::uuid_hash_extended(u, KEYSPACE_SEED),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_as_sql_literals() {
        assert_eq!(Key::Int(-5).sql_literal(), "-5");
        assert_eq!(Key::Text("it's").sql_literal(), "'it''s'");
        let u = KeyType::Uuid
            .parse_key("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11")
            .unwrap();
        assert_eq!(u.sql_literal(), "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'");
    }

    #[test]
    fn parses_type_names() {
        assert_eq!(KeyType::parse("BIGINT"), Some(KeyType::BigInt));
        assert_eq!(KeyType::parse("int"), Some(KeyType::Integer));
        assert_eq!(KeyType::parse("int2"), Some(KeyType::SmallInt));
        assert_eq!(KeyType::parse("varchar"), Some(KeyType::Text));
        assert_eq!(KeyType::parse("numeric"), None);
    }

    #[test]
    fn parses_keys_and_rejects_out_of_range() {
        assert_eq!(KeyType::BigInt.parse_key("-5"), Ok(Key::Int(-5)));
        assert!(KeyType::Integer.parse_key("3000000000").is_err());
        assert!(KeyType::SmallInt.parse_key("40000").is_err());
        assert!(KeyType::Uuid.parse_key("nope").is_err());
        let u = KeyType::Uuid
            .parse_key("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11")
            .unwrap();
        assert_eq!(
            u,
            KeyType::Uuid
                .parse_key("a0eebc999c0b4ef8bb6d6bb9bd380a11")
                .unwrap()
        );
    }

    #[test]
    fn int_key_ids_do_not_depend_on_the_declared_width() {
        let a = KeyType::SmallInt.parse_key("7").unwrap().keyspace_id();
        let b = KeyType::BigInt.parse_key("7").unwrap().keyspace_id();
        assert_eq!(a, b);
        assert_eq!(format!("{a}").len(), 16);
    }
}
