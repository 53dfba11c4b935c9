//! Key values from the wire: a routed statement's key, as text or in binary format, to a
//! [`shardmap::Key`].
//!
//! A key comes from a literal (always text, see [`super::normalize`]) or from a Bind parameter,
//! which the client sends in text or binary format. The binary forms are Postgres's `*send`
//! formats; a client may send an int of any width for any integer column (Postgres would
//! coerce it too), so the width is read from the length, not from the declared key type.

use shardmap::{Key, KeyType};

/// Why a key value cannot be turned into a key; the message is for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValueError {
    pub key_type: KeyType,
    pub message: String,
}

impl std::fmt::Display for KeyValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KeyValueError {}

/// The key a text-format value stands for (a literal, or a text-format Bind parameter).
pub fn key_from_text(key_type: KeyType, text: &str) -> Result<Key<'_>, KeyValueError> {
    key_type.parse_key(text).map_err(|e| KeyValueError {
        key_type,
        message: e.to_string(),
    })
}

/// The key a binary-format Bind parameter stands for.
pub fn key_from_binary(key_type: KeyType, bytes: &[u8]) -> Result<Key<'_>, KeyValueError> {
    let bad = |what: String| KeyValueError {
        key_type,
        message: format!("invalid binary {key_type} key: {what}"),
    };
    let key = match key_type {
        KeyType::SmallInt | KeyType::Integer | KeyType::BigInt => {
            let value = match *bytes {
                [a, b] => i64::from(i16::from_be_bytes([a, b])),
                [a, b, c, d] => i64::from(i32::from_be_bytes([a, b, c, d])),
                [a, b, c, d, e, f, g, h] => i64::from_be_bytes([a, b, c, d, e, f, g, h]),
                _ => {
                    return Err(bad(format!(
                        "{} bytes; an integer is sent as 2, 4 or 8",
                        bytes.len()
                    )))
                }
            };
            // Postgres would refuse a value outside the column's range before it could match.
            let fits = match key_type {
                KeyType::SmallInt => i16::try_from(value).is_ok(),
                KeyType::Integer => i32::try_from(value).is_ok(),
                _ => true,
            };
            if !fits {
                return Err(bad(format!("{value} is out of range for {key_type}")));
            }
            Key::Int(value)
        }
        KeyType::Text => Key::Text(
            std::str::from_utf8(bytes)
                .map_err(|_| bad("the text is not valid UTF-8".to_string()))?,
        ),
        KeyType::Uuid => Key::Uuid(
            bytes
                .try_into()
                .map_err(|_| bad(format!("{} bytes; a uuid is sent as 16", bytes.len())))?,
        ),
    };
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keys() {
        assert_eq!(key_from_text(KeyType::BigInt, "-42"), Ok(Key::Int(-42)));
        assert_eq!(key_from_text(KeyType::Text, " a "), Ok(Key::Text(" a ")));
        let err = key_from_text(KeyType::Integer, "5.5").unwrap_err();
        assert!(err.message.contains("not an integer"), "{err}");
        assert!(key_from_text(KeyType::Uuid, "x").is_err());
    }

    #[test]
    fn binary_ints_of_any_width() {
        for kt in [KeyType::SmallInt, KeyType::Integer, KeyType::BigInt] {
            assert_eq!(key_from_binary(kt, &7i16.to_be_bytes()), Ok(Key::Int(7)));
            assert_eq!(
                key_from_binary(kt, &(-7i32).to_be_bytes()),
                Ok(Key::Int(-7))
            );
            assert_eq!(key_from_binary(kt, &7i64.to_be_bytes()), Ok(Key::Int(7)));
            assert!(key_from_binary(kt, &[1, 2, 3]).is_err());
        }
        assert!(key_from_binary(KeyType::SmallInt, &40_000i32.to_be_bytes()).is_err());
        assert!(key_from_binary(KeyType::Integer, &(1i64 << 40).to_be_bytes()).is_err());
        assert_eq!(
            key_from_binary(KeyType::BigInt, &(1i64 << 40).to_be_bytes()),
            Ok(Key::Int(1 << 40))
        );
    }

    #[test]
    fn binary_text_and_uuid() {
        assert_eq!(
            key_from_binary(KeyType::Text, "é".as_bytes()),
            Ok(Key::Text("é"))
        );
        assert!(key_from_binary(KeyType::Text, &[0xff]).is_err());
        let u = [7u8; 16];
        assert_eq!(key_from_binary(KeyType::Uuid, &u), Ok(Key::Uuid(u)));
        assert!(key_from_binary(KeyType::Uuid, &u[..15]).is_err());
        let text = key_from_text(KeyType::Uuid, "07070707-0707-0707-0707-070707070707").unwrap();
        assert_eq!(text, Key::Uuid(u));
    }
}
