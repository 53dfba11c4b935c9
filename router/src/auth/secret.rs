//! What the router stores per user to check a SCRAM-SHA-256 login: the Postgres verifier.
//!
//! A verifier is the same thing Postgres keeps in `pg_authid.rolpassword`
//! (`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`), so an operator can copy one
//! out of Postgres or `psql`'s `\password` into `router.toml` instead of a plain password.
//! Plain passwords from the config are turned into verifiers once, when the config is loaded
//! (with `postgres-protocol`'s derivation, a fresh random salt and Postgres's 4096 iterations),
//! because deriving one costs thousands of HMACs (PBKDF2) while checking a login against one
//! costs a handful; the router never needs the plain password again.

use std::borrow::Cow;
use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::digest::CtOutput;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The iteration count Postgres uses for new verifiers (`scram_iterations` default), used
/// for verifiers the router derives from plain passwords.
pub const DEFAULT_ITERATIONS: u32 = 4096;

/// Salt length Postgres uses for new verifiers.
pub const DEFAULT_SALT_LEN: usize = 16;

/// The prefix of a Postgres SCRAM-SHA-256 verifier string.
const PREFIX: &str = "SCRAM-SHA-256$";

/// A user's stored secret as written in the config.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// A plain password. The config loader replaces it with a verifier at load.
    Plain(String),
    /// A Postgres SCRAM-SHA-256 verifier.
    Scram(ScramVerifier),
}

impl Secret {
    /// Reads a `password` value from the config: a `SCRAM-SHA-256$...` string is a verifier
    /// (and must be a well-formed one), anything else is a plain password. The error is a
    /// sentence for an operator and never repeats the text, which may be a real password.
    pub fn parse(text: &str) -> Result<Secret, String> {
        if text.starts_with(PREFIX) {
            return ScramVerifier::parse(text).map(Secret::Scram);
        }
        // Postgres stores md5 hashes as "md5" + 32 hex digits. Taken as a plain password such
        // a hash would silently never match, so say what is wrong instead.
        if text.len() == 35
            && text.starts_with("md5")
            && text[3..].bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(
                "password is a Postgres md5 hash, which cannot check a SCRAM-SHA-256 login; \
                 give the plain password or a SCRAM-SHA-256$... verifier"
                    .to_string(),
            );
        }
        if text.is_empty() {
            return Err("password is empty; Postgres rejects empty passwords too".to_string());
        }
        Ok(Secret::Plain(text.to_string()))
    }

    /// The verifier to check logins against. For a plain password this derives one with a
    /// fresh random salt, which is slow (PBKDF2): do it once, not per login.
    pub fn verifier(&self) -> Cow<'_, ScramVerifier> {
        match self {
            Secret::Scram(v) => Cow::Borrowed(v),
            Secret::Plain(p) => Cow::Owned(
                ScramVerifier::parse(&postgres_protocol::password::scram_sha_256(p.as_bytes()))
                    // postgres-protocol writes the same format Postgres does.
                    .unwrap_or_else(|e| {
                        panic!("postgres-protocol wrote an unreadable verifier: {e}")
                    }),
            ),
        }
    }

    /// Turns a plain password into a verifier (random salt, 4096 iterations); a verifier stays
    /// as it is.
    pub fn into_scram(self) -> Secret {
        match self {
            Secret::Plain(_) => Secret::Scram(self.verifier().into_owned()),
            scram => scram,
        }
    }
}

// Secrets end up inside `Config`, which is logged with `{:?}`: never print a password.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Plain(_) => f.write_str("Plain(<redacted>)"),
            Secret::Scram(v) => f.debug_tuple("Scram").field(v).finish(),
        }
    }
}

/// A SCRAM-SHA-256 verifier: what a server needs to check a client's proof and to prove
/// itself back, without knowing the password.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    pub(crate) iterations: u32,
    pub(crate) salt: Vec<u8>,
    pub(crate) stored_key: [u8; 32],
    pub(crate) server_key: [u8; 32],
}

impl ScramVerifier {
    /// Parses `SCRAM-SHA-256$<iterations>:<salt b64>$<StoredKey b64>:<ServerKey b64>`.
    pub fn parse(text: &str) -> Result<ScramVerifier, String> {
        const SHAPE: &str =
            "write it as SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, as Postgres stores it";
        let rest = text
            .strip_prefix(PREFIX)
            .ok_or_else(|| format!("password verifier does not start with {PREFIX}; {SHAPE}"))?;
        let (params, keys) = rest
            .split_once('$')
            .ok_or_else(|| format!("password verifier has no '$' before its keys; {SHAPE}"))?;
        let (iterations, salt) = params.split_once(':').ok_or_else(|| {
            format!("password verifier has no ':' between iterations and salt; {SHAPE}")
        })?;
        let (stored_key, server_key) = keys.split_once(':').ok_or_else(|| {
            format!("password verifier has no ':' between StoredKey and ServerKey; {SHAPE}")
        })?;
        let iterations = match iterations.parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "password verifier has iteration count {iterations:?}; it must be a whole number of 1 or more"
                ))
            }
        };
        let salt = match STANDARD.decode(salt) {
            Ok(s) if !s.is_empty() => s,
            _ => return Err("password verifier's salt is not base64".to_string()),
        };
        let key = |name: &str, b64: &str| -> Result<[u8; 32], String> {
            STANDARD
                .decode(b64)
                .ok()
                .and_then(|k| <[u8; 32]>::try_from(k.as_slice()).ok())
                .ok_or_else(|| format!("password verifier's {name} is not 32 bytes of base64"))
        };
        Ok(ScramVerifier {
            iterations,
            salt,
            stored_key: key("StoredKey", stored_key)?,
            server_key: key("ServerKey", server_key)?,
        })
    }

    /// A verifier for a user that does not exist, so that an unknown user name goes through
    /// the whole exchange and fails like a wrong password (as Postgres does), rather than
    /// telling a prober which names exist. The salt is derived from `name` and a per-process
    /// `key` so it is stable across attempts, as a real user's is; the keys are random, so no
    /// password matches.
    pub fn mock(name: &str, key: &[u8; 32]) -> ScramVerifier {
        let salt = Sha256::new()
            .chain_update(key)
            .chain_update(name.as_bytes())
            .finalize();
        let mut stored_key = [0u8; 32];
        let mut server_key = [0u8; 32];
        rand::fill(&mut stored_key);
        rand::fill(&mut server_key);
        ScramVerifier {
            iterations: DEFAULT_ITERATIONS,
            salt: salt[..DEFAULT_SALT_LEN].to_vec(),
            stored_key,
            server_key,
        }
    }

    pub fn iterations(&self) -> u32 {
        self.iterations
    }

    pub fn salt(&self) -> &[u8] {
        &self.salt
    }
}

/// The Postgres text form, as stored in `pg_authid.rolpassword`.
impl fmt::Display for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}:{}${}:{}",
            self.iterations,
            STANDARD.encode(&self.salt),
            STANDARD.encode(self.stored_key),
            STANDARD.encode(self.server_key)
        )
    }
}

// The keys are password-equivalent for anyone who also sees one exchange: keep them out of logs.
impl fmt::Debug for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramVerifier")
            .field("iterations", &self.iterations)
            .field("salt", &STANDARD.encode(&self.salt))
            .finish_non_exhaustive()
    }
}

/// Derives the verifier for `password` with a given salt (tests replay recorded exchanges, and
/// check it against Postgres's own output); the router itself uses `postgres-protocol`'s.
///
/// Derives the verifier for `password`, byte for byte what Postgres stores for the same
/// password, salt and iteration count (the password is SASLprep-normalised first, and used
/// as raw bytes when it cannot be, exactly as Postgres and libpq do).
#[cfg(test)]
pub fn scram_verifier(password: &str, salt: &[u8], iterations: u32) -> ScramVerifier {
    let prepared = stringprep::saslprep(password).unwrap_or(Cow::Borrowed(password));
    let salted = hi(prepared.as_bytes(), salt, iterations.max(1));
    let client_key = hmac(&salted, &[b"Client Key"]);
    ScramVerifier {
        iterations: iterations.max(1),
        salt: salt.to_vec(),
        stored_key: sha256(&client_key),
        server_key: hmac(&salted, &[b"Server Key"]),
    }
}

/// SCRAM's Hi(): PBKDF2-HMAC-SHA-256 with one output block.
#[cfg(test)]
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut u = hmac(password, &[salt, &1u32.to_be_bytes()]);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &[&u]);
        for (o, b) in out.iter_mut().zip(u) {
            *o ^= b;
        }
    }
    out
}

/// HMAC-SHA-256 of the concatenation of `parts`.
pub(crate) fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length (long ones are hashed), so this cannot fail.
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Compares two 32-byte values in time that does not depend on where they differ, so the
/// proof check leaks nothing about how close a guess was.
pub(crate) fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    CtOutput::<Sha256>::new((*a).into()) == CtOutput::<Sha256>::new((*b).into())
}
