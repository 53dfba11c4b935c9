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

/// Whether a binary array's element type (its OID) holds values of the key's type: an int of
/// any width for an int key, `text` or `varchar` for a text key, `uuid` for uuid. Anything else
/// (a `float8[]` sent for a bigint key) would be read as the wrong bytes.
pub fn element_type_fits(key_type: KeyType, oid: u32) -> bool {
    match key_type {
        KeyType::SmallInt | KeyType::Integer | KeyType::BigInt => matches!(oid, 20 | 21 | 23),
        KeyType::Text => matches!(oid, 25 | 1043),
        KeyType::Uuid => oid == 2950,
    }
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

/// The elements of a one-dimensional array in Postgres's text format (`{1,2,NULL}`,
/// `{"a b","c\"d"}`, with an optional `[1:3]=` prefix); nested braces are flattened, since
/// `= ANY` compares with every element. `None` is NULL.
pub fn array_elements_text(text: &str) -> Result<Vec<Option<String>>, String> {
    let bad = || format!("malformed array literal: \"{text}\"");
    let mut body = text.trim();
    if body.starts_with('[') {
        body = body.split_once('=').ok_or_else(bad)?.1.trim_start();
    }
    let body = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .ok_or_else(bad)?;
    let mut out = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace() || *c == '{').is_some() {}
        let Some(&first) = chars.peek() else { break };
        if first == '"' {
            chars.next();
            let mut value = String::new();
            loop {
                match chars.next().ok_or_else(bad)? {
                    '"' => break,
                    '\\' => value.push(chars.next().ok_or_else(bad)?),
                    c => value.push(c),
                }
            }
            out.push(Some(value));
        } else {
            let mut value = String::new();
            while let Some(c) = chars.next_if(|c| *c != ',' && *c != '}') {
                if c == '\\' {
                    value.push(chars.next().ok_or_else(bad)?);
                } else {
                    value.push(c);
                }
            }
            let value = value.trim();
            if value.is_empty() {
                return Err(bad());
            }
            out.push((!value.eq_ignore_ascii_case("null")).then(|| value.to_string()));
        }
        while chars.next_if(|c| c.is_whitespace() || *c == '}').is_some() {}
        match chars.next() {
            Some(',') => {}
            None => break,
            Some(_) => return Err(bad()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod array_tests {
    use super::*;

    #[test]
    fn text_arrays() {
        let s = |v: &[Option<&str>]| v.iter().map(|o| o.map(String::from)).collect::<Vec<_>>();
        assert_eq!(
            array_elements_text("{1, 2,NULL}").unwrap(),
            s(&[Some("1"), Some("2"), None])
        );
        assert_eq!(
            array_elements_text(r#"{"a b","c\"d","NULL",x}"#).unwrap(),
            s(&[Some("a b"), Some("c\"d"), Some("NULL"), Some("x")])
        );
        assert_eq!(
            array_elements_text("[0:1]={{1,2},{3,4}}").unwrap(),
            s(&[Some("1"), Some("2"), Some("3"), Some("4")])
        );
        assert_eq!(array_elements_text("{}").unwrap(), s(&[]));
        assert!(array_elements_text("1,2").is_err());
        assert!(array_elements_text("{1,,2}").is_err());
        assert!(array_elements_text("{\"open}").is_err());
    }
}
