//! The address of a shard's Postgres primary, from a `postgres://` URL.
//!
//! Routers keep one pool per (host, port, database), so those three are parsed and checked
//! when the map is loaded, not when the first statement needs them.

use std::fmt;

use url::Url;

/// A parsed `postgres://[user[:password]@]host[:port]/database[?options]` URL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Primary {
    url: String,
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: Option<String>,
    pub password: Option<String>,
}

impl Primary {
    /// Parses and checks a primary URL; the error is a sentence for an operator.
    pub fn parse(text: &str) -> Result<Primary, String> {
        let url = Url::parse(text.trim()).map_err(|e| {
            format!(
                "primary {:?} is not a URL ({e}); write it as postgres://HOST:PORT/DATABASE",
                redact(text)
            )
        })?;
        if url.scheme() != "postgres" && url.scheme() != "postgresql" {
            return Err(format!(
                "primary {:?} must start with postgres:// (found {}://)",
                redact(text),
                url.scheme()
            ));
        }
        let host = match url.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_string(),
            _ => {
                return Err(format!(
                    "primary {:?} names no host; write it as postgres://HOST:PORT/DATABASE",
                    redact(text)
                ))
            }
        };
        let database = url.path().trim_start_matches('/');
        if database.is_empty() || database.contains('/') {
            return Err(format!(
                "primary {:?} must name exactly one database in its path, as in postgres://{host}:5432/app",
                redact(text)
            ));
        }
        let decode = |s: &str| {
            percent_decode(s)
                .ok_or_else(|| format!("primary {:?} has a malformed %-escape", redact(text)))
        };
        let database = decode(database)?;
        let user = match url.username() {
            "" => None,
            u => Some(decode(u)?),
        };
        let password = url.password().map(decode).transpose()?;
        Ok(Primary {
            url: text.trim().to_string(),
            host,
            port: url.port().unwrap_or(5432),
            database,
            user,
            password,
        })
    }

    /// The URL exactly as configured (it may hold a password: never log it, use Display).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `host:port/database`, the identity of this primary's pool.
    pub fn endpoint(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.database)
    }
}

/// Shows the URL with its password replaced, for logs and error messages.
impl fmt::Display for Primary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.url))
    }
}

impl fmt::Debug for Primary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Primary({})", redact(&self.url))
    }
}

/// The URL with any password replaced by `***`.
pub fn redact(text: &str) -> String {
    match Url::parse(text.trim()) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => text.trim().to_string(),
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_url() {
        let p = Primary::parse("postgres://app:s%40cret@10.0.0.5:5433/shard_001?sslmode=disable")
            .unwrap();
        assert_eq!(p.host, "10.0.0.5");
        assert_eq!(p.port, 5433);
        assert_eq!(p.database, "shard_001");
        assert_eq!(p.user.as_deref(), Some("app"));
        assert_eq!(p.password.as_deref(), Some("s@cret"));
        assert_eq!(p.endpoint(), "10.0.0.5:5433/shard_001");
        assert!(!p.to_string().contains("cret"));
    }

    #[test]
    fn defaults_the_port() {
        assert_eq!(
            Primary::parse("postgresql://db.internal/app").unwrap().port,
            5432
        );
    }

    #[test]
    fn rejects_bad_urls_with_a_reason() {
        for (bad, why) in [
            ("not a url", "not a URL"),
            ("mysql://h/app", "postgres://"),
            ("postgres://h:5432", "database"),
            ("postgres://h:5432/", "database"),
            ("postgres://h:99999/app", "not a URL"),
            ("postgres:///app", "host"),
        ] {
            let err = Primary::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
