//! The first packet of a connection: SSLRequest, GSSENCRequest, CancelRequest or a v3
//! StartupMessage. These have no tag byte, only a length and a code.

use super::frontend::{Malformed, Reader};

/// Startup packets are small; Postgres caps them at 10,000 bytes.
pub const MAX_STARTUP_LEN: usize = 10_000;

const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;
const CANCEL_REQUEST: i32 = 80_877_102;
const PROTOCOL_3_0: i32 = 196_608;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup {
    Ssl,
    GssEnc,
    Cancel {
        pid: i32,
        secret: i32,
    },
    /// Protocol 3.0 with its parameters (user, database, application_name, options, ...).
    Startup {
        params: Vec<(String, String)>,
    },
}

impl Startup {
    pub fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a startup packet is refused; each becomes a FATAL error with SQLSTATE 08P01.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartupError {
    #[error("invalid startup packet length {0}")]
    Length(i64),
    #[error("unsupported frontend protocol {major}.{minor}: shardgate speaks 3.0")]
    Protocol { major: i32, minor: i32 },
    #[error("{0}")]
    Malformed(#[from] Malformed),
}

/// Length of the startup packet at the front of `buf` once its 4-byte length has arrived.
pub fn packet_len(buf: &[u8]) -> Result<Option<usize>, StartupError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len < 8 || len as usize > MAX_STARTUP_LEN {
        return Err(StartupError::Length(i64::from(len)));
    }
    Ok(Some(len as usize))
}

/// Decodes a whole startup packet (length included).
pub fn decode(packet: &[u8]) -> Result<Startup, StartupError> {
    // The caller passes what `packet_len` measured, but a short slice is an error, not a panic.
    let mut r = Reader::new(packet.get(4..).unwrap_or_default(), "startup");
    let code = r.i32()?;
    match code {
        SSL_REQUEST => Ok(Startup::Ssl),
        GSSENC_REQUEST => Ok(Startup::GssEnc),
        CANCEL_REQUEST => {
            let pid = r.i32()?;
            let secret = r.i32()?;
            Ok(Startup::Cancel { pid, secret })
        }
        PROTOCOL_3_0 => {
            let mut params = Vec::new();
            loop {
                let key = r.cstr()?;
                if key.is_empty() {
                    break;
                }
                let value = r.cstr()?;
                params.push((key.to_string(), value.to_string()));
            }
            Ok(Startup::Startup { params })
        }
        other => Err(StartupError::Protocol {
            major: other >> 16,
            minor: other & 0xffff,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(code: i32, rest: &[u8]) -> Vec<u8> {
        let mut p = ((8 + rest.len()) as i32).to_be_bytes().to_vec();
        p.extend_from_slice(&code.to_be_bytes());
        p.extend_from_slice(rest);
        p
    }

    #[test]
    fn decodes_every_kind() {
        assert_eq!(decode(&packet(SSL_REQUEST, b"")).unwrap(), Startup::Ssl);
        assert_eq!(
            decode(&packet(GSSENC_REQUEST, b"")).unwrap(),
            Startup::GssEnc
        );
        let mut c = 7i32.to_be_bytes().to_vec();
        c.extend_from_slice(&9i32.to_be_bytes());
        assert_eq!(
            decode(&packet(CANCEL_REQUEST, &c)).unwrap(),
            Startup::Cancel { pid: 7, secret: 9 }
        );
        let s = decode(&packet(PROTOCOL_3_0, b"user\0app\0database\0db\0\0")).unwrap();
        let Startup::Startup { params } = s else {
            panic!("not a startup")
        };
        assert_eq!(Startup::param(&params, "database"), Some("db"));
        assert!(matches!(
            decode(&packet(0x0002_0000, b"")),
            Err(StartupError::Protocol { major: 2, .. })
        ));
        assert!(decode(&packet(PROTOCOL_3_0, b"user\0app")).is_err());
        assert!(packet_len(&[0, 0, 0, 4]).is_err());
        // Found by fuzzing: fewer than 4 bytes panicked on the slice.
        assert!(decode(&[0, 0]).is_err());
        assert!(packet_len(&[0, 1, 0, 0]).is_err());
    }
}
