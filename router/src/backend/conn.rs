//! One raw connection to a Postgres primary.
//!
//! Login (startup, SCRAM-SHA-256 / MD5 / cleartext / trust) uses the `postgres-protocol`
//! crate's sans-IO pieces. After that the connection is a byte pipe: the session writes
//! client frames (rewritten where needed) and reads reply frames without decoding rows.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{self, ScramSha256};
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where and as whom to log in; one per pool.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    pub password: Option<String>,
    pub application_name: String,
    pub connect_timeout: Duration,
}

impl Endpoint {
    /// `host:port/database`, how operators and errors name this endpoint.
    pub fn name(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.database)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("connecting to {endpoint} timed out after {timeout:?}")]
    ConnectTimeout { endpoint: String, timeout: Duration },
    #[error("{endpoint} refused the login: {message} (SQLSTATE {code})")]
    Refused {
        endpoint: String,
        code: String,
        message: String,
    },
    #[error("{endpoint} asks for a password but none is configured for the router's backend user")]
    NoPassword { endpoint: String },
    #[error("login to {endpoint} failed: {why}")]
    Protocol { endpoint: String, why: String },
    #[error("connection to {endpoint} failed: {source}")]
    Io {
        endpoint: String,
        source: std::io::Error,
    },
}

/// A logged-in connection.
pub struct BackendConn {
    pub stream: TcpStream,
    /// Bytes read from Postgres and not yet handled.
    pub rbuf: BytesMut,
    /// The backend's own BackendKeyData, for forwarding cancel requests.
    pub pid: i32,
    pub secret: i32,
    /// ParameterStatus values Postgres sent at login (server_version, ...).
    pub params: Vec<(String, String)>,
    /// Router-wide ids of the statements prepared on this connection (bounded).
    pub prepared: PreparedSet,
    /// Set when the connection may hold state another client must not see, or when its
    /// protocol state is unknown; such a connection is never reused.
    pub broken: bool,
    /// Fingerprint of the session settings this connection holds (see
    /// `frontend::settings`): 0 for a fresh connection, `settings::UNKNOWN` after a change the
    /// router could not follow.
    pub settings_fp: u64,
    pub created: Instant,
}

impl BackendConn {
    /// Writes `out` (whole simple-protocol messages) and hands every reply frame to `on_frame`
    /// until `readies` ReadyForQuery frames have come: the router's own short exchanges, where
    /// nothing is streamed to a client while it waits.
    pub async fn round_trip(
        &mut self,
        out: &[u8],
        mut readies: usize,
        mut on_frame: impl FnMut(&[u8]),
    ) -> std::io::Result<()> {
        use bytes::Buf;
        self.stream.write_all(out).await?;
        while readies > 0 {
            while let Some(h) =
                crate::protocol::frame::next_frame(&self.rbuf).map_err(std::io::Error::other)?
            {
                on_frame(&self.rbuf[..h.total]);
                let ready = h.tag == b'Z';
                self.rbuf.advance(h.total);
                if ready {
                    readies -= 1;
                    if readies == 0 {
                        return Ok(());
                    }
                }
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
        }
        Ok(())
    }

    /// Connects and logs in; the whole login is bounded by the endpoint's connect timeout.
    pub async fn connect(ep: &Endpoint) -> Result<BackendConn, BackendError> {
        match tokio::time::timeout(ep.connect_timeout, Self::login(ep)).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::ConnectTimeout {
                endpoint: ep.name(),
                timeout: ep.connect_timeout,
            }),
        }
    }

    async fn login(ep: &Endpoint) -> Result<BackendConn, BackendError> {
        let name = ep.name();
        let io = |source| BackendError::Io {
            endpoint: name.clone(),
            source,
        };
        let proto = |why: String| BackendError::Protocol {
            endpoint: name.clone(),
            why,
        };
        let stream = TcpStream::connect((ep.host.as_str(), ep.port))
            .await
            .map_err(|source| BackendError::Connect {
                endpoint: name.clone(),
                source,
            })?;
        stream.set_nodelay(true).map_err(io)?;
        let mut conn = BackendConn {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            pid: 0,
            secret: 0,
            params: Vec::new(),
            prepared: PreparedSet::default(),
            broken: false,
            settings_fp: 0,
            created: Instant::now(),
        };
        let mut out = BytesMut::new();
        let params = [
            ("user", ep.user.as_str()),
            ("database", ep.database.as_str()),
            ("application_name", ep.application_name.as_str()),
            ("client_encoding", "UTF8"),
        ];
        frontend::startup_message(params.iter().copied(), &mut out).map_err(io)?;
        conn.stream.write_all(&out).await.map_err(io)?;

        let mut scram: Option<ScramSha256> = None;
        loop {
            let msg = conn.read_message().await.map_err(io)?;
            out.clear();
            match msg {
                backend::Message::AuthenticationOk => {}
                backend::Message::AuthenticationCleartextPassword => {
                    let pw = ep.password.as_deref().ok_or(BackendError::NoPassword {
                        endpoint: name.clone(),
                    })?;
                    frontend::password_message(pw.as_bytes(), &mut out).map_err(io)?;
                }
                backend::Message::AuthenticationMd5Password(body) => {
                    let pw = ep.password.as_deref().ok_or(BackendError::NoPassword {
                        endpoint: name.clone(),
                    })?;
                    let hash = postgres_protocol::authentication::md5_hash(
                        ep.user.as_bytes(),
                        pw.as_bytes(),
                        body.salt(),
                    );
                    frontend::password_message(hash.as_bytes(), &mut out).map_err(io)?;
                }
                backend::Message::AuthenticationSasl(body) => {
                    let pw = ep.password.as_deref().ok_or(BackendError::NoPassword {
                        endpoint: name.clone(),
                    })?;
                    let mut mechs = body.mechanisms();
                    let mut offered = false;
                    while let Some(m) = mechs.next().map_err(io)? {
                        offered |= m == sasl::SCRAM_SHA_256;
                    }
                    if !offered {
                        return Err(proto("the server offers no SASL mechanism the router supports (SCRAM-SHA-256)".into()));
                    }
                    let s = ScramSha256::new(pw.as_bytes(), sasl::ChannelBinding::unsupported());
                    frontend::sasl_initial_response(sasl::SCRAM_SHA_256, s.message(), &mut out)
                        .map_err(io)?;
                    scram = Some(s);
                }
                backend::Message::AuthenticationSaslContinue(body) => {
                    let s = scram
                        .as_mut()
                        .ok_or_else(|| proto("SASL continue without SASL start".into()))?;
                    s.update(body.data())
                        .map_err(|e| proto(format!("SCRAM: {e}")))?;
                    frontend::sasl_response(s.message(), &mut out).map_err(io)?;
                }
                backend::Message::AuthenticationSaslFinal(body) => {
                    let s = scram
                        .as_mut()
                        .ok_or_else(|| proto("SASL final without SASL start".into()))?;
                    s.finish(body.data())
                        .map_err(|e| proto(format!("SCRAM server signature: {e}")))?;
                }
                backend::Message::ParameterStatus(body) => {
                    let (k, v) = (body.name().map_err(io)?, body.value().map_err(io)?);
                    conn.params.push((k.to_string(), v.to_string()));
                }
                backend::Message::BackendKeyData(body) => {
                    conn.pid = body.process_id();
                    conn.secret = body.secret_key();
                }
                backend::Message::ReadyForQuery(_) => return Ok(conn),
                backend::Message::ErrorResponse(body) => {
                    let (code, message) = error_fields(&body);
                    return Err(BackendError::Refused {
                        endpoint: name.clone(),
                        code,
                        message,
                    });
                }
                backend::Message::NoticeResponse(_) => {}
                _ => return Err(proto("unexpected message during login".into())),
            }
            if !out.is_empty() {
                conn.stream.write_all(&out).await.map_err(io)?;
            }
        }
    }

    /// Reads one whole message during login (the hot path reads raw frames instead).
    async fn read_message(&mut self) -> std::io::Result<backend::Message> {
        loop {
            if let Some(msg) = backend::Message::parse(&mut self.rbuf)? {
                return Ok(msg);
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
        }
    }

    /// Whether an idle connection still looks usable: no unread bytes and no EOF. Postgres
    /// only talks unprompted to say goodbye (admin shutdown, idle timeout), so anything
    /// readable means the connection is finished. tokio answers from its readiness state
    /// when nothing happened, so this costs no syscall on a healthy connection.
    pub fn is_idle_healthy(&self) -> bool {
        if self.broken || !self.rbuf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

fn error_fields(body: &backend::ErrorResponseBody) -> (String, String) {
    let mut code = String::new();
    let mut message = String::new();
    let mut fields = body.fields();
    while let Ok(Some(f)) = fields.next() {
        match f.type_() {
            b'C' => code = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            _ => {}
        }
    }
    (code, message)
}

/// Sends a CancelRequest for backend (or router client) `pid` to `addr`: a Postgres server, or
/// another router of the fleet. Like Postgres's own cancel, it says nothing about whether
/// anything was running; errors are only about reaching `addr`.
pub async fn send_cancel(
    addr: impl tokio::net::ToSocketAddrs,
    pid: i32,
    secret: i32,
) -> std::io::Result<()> {
    let packet = crate::protocol::startup::cancel_request(pid, secret);
    let send = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(&packet).await?;
        // The receiver closes the connection when it has acted; wait for that.
        let mut sink = [0u8; 16];
        let _ = s.read(&mut sink).await;
        Ok(())
    };
    match tokio::time::timeout(Duration::from_secs(5), send).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the cancel request timed out",
        )),
    }
}

/// How many router statements one backend connection keeps prepared. Postgres keeps every
/// prepared statement in the backend's memory until the connection ends; a client that
/// prepares many distinct texts must not grow every backend without bound.
pub const MAX_PREPARED_PER_CONNECTION: usize = 1000;

/// The statements prepared on one connection, with the least recently used evicted first.
#[derive(Default, Debug)]
pub struct PreparedSet {
    last_use: HashMap<u64, u64>,
    tick: u64,
}

impl PreparedSet {
    /// Whether statement `id` is prepared; marks it used.
    pub fn contains(&mut self, id: &u64) -> bool {
        self.tick += 1;
        match self.last_use.get_mut(id) {
            Some(t) => {
                *t = self.tick;
                true
            }
            None => false,
        }
    }

    /// Records statement `id` as prepared; returns the statement to close first when the set is
    /// full (the least recently used).
    pub fn insert(&mut self, id: u64) -> Option<u64> {
        self.tick += 1;
        let evict = if self.last_use.len() >= MAX_PREPARED_PER_CONNECTION
            && !self.last_use.contains_key(&id)
        {
            let oldest = self
                .last_use
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(id, _)| *id);
            if let Some(old) = oldest {
                self.last_use.remove(&old);
            }
            oldest
        } else {
            None
        };
        self.last_use.insert(id, self.tick);
        evict
    }

    pub fn remove(&mut self, id: &u64) {
        self.last_use.remove(id);
    }

    pub fn clear(&mut self) {
        self.last_use.clear();
    }

    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut set = PreparedSet::default();
        for id in 0..MAX_PREPARED_PER_CONNECTION as u64 {
            assert_eq!(set.insert(id), None);
        }
        assert!(set.contains(&0));
        assert_eq!(
            set.insert(5000),
            Some(1),
            "0 was used again, 1 is the oldest"
        );
        assert!(!set.contains(&1));
        assert_eq!(set.len(), MAX_PREPARED_PER_CONNECTION);
        assert_eq!(set.insert(5000), None, "already there");
    }
}
