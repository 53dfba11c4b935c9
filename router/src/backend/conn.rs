//! One raw connection to a Postgres primary.
//!
//! Login (startup, SCRAM-SHA-256 / MD5 / cleartext / trust) uses the `postgres-protocol`
//! crate's sans-IO pieces. After that the connection is a byte pipe: the session writes
//! client frames (rewritten where needed) and reads reply frames without decoding rows.
//!
//! Every exchange that writes a request and then reads its replies up to ReadyForQuery goes
//! through [`BackendConn::request`] (frame by frame) or [`BackendConn::round_trip`] (all at
//! once). The one exception is a client's own statement on its pinned connection
//! (`session::relay`), which must write, read, forward to the client and watch a timer at
//! the same time.
//!
//! With `[backend] sslmode` the connection is TLS from the SSLRequest on (see
//! [`super::stream`]); everything after that is the same over either stream.

use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{self, ScramSha256};
use postgres_protocol::message::{backend, frontend};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::settings::Settings;
use super::stream::{BackendStream, TlsFailure};
use crate::protocol::reply::SqlError;
use crate::tls::BackendTls;

/// What a simple query of [`BackendConn::simple_query`] answered.
#[derive(Debug, Default)]
pub struct Answer {
    /// The command tag of its (last) CommandComplete.
    pub tag: String,
    /// The first column of every row, as text (NULLs left out).
    pub first_column: Vec<String>,
    /// Its first error: SQLSTATE and message.
    pub error: Option<(String, String)>,
    /// The transaction status its ReadyForQuery reported.
    pub status: Option<crate::protocol::reply::TxStatus>,
}

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
    /// Whether and how the connection is encrypted (`[backend] sslmode`).
    pub tls: BackendTls,
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
    #[error("TLS to {endpoint}: {source}")]
    Tls {
        endpoint: String,
        source: TlsFailure,
    },
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
    pub stream: BackendStream,
    /// Bytes read from Postgres and not yet handled.
    pub rbuf: BytesMut,
    /// The backend's own BackendKeyData, for forwarding cancel requests.
    pub pid: i32,
    pub secret: i32,
    /// ParameterStatus values Postgres sent at login (server_version, ...).
    pub params: Vec<(String, String)>,
    /// Router-wide ids of the statements prepared on this connection (bounded).
    pub prepared: super::prepared::PreparedSet,
    /// Set when the connection may hold state another client must not see, or when its
    /// protocol state is unknown; such a connection is never reused.
    pub broken: bool,
    /// Fingerprint of the session settings this connection holds (see
    /// `backend::settings`): 0 for a fresh connection, `settings::UNKNOWN` after a change the
    /// router could not follow.
    pub settings_fp: u64,
    pub created: Instant,
    /// How long connecting and logging in took (a checkout that opened this connection
    /// waited that long).
    pub connect_time: Duration,
}

/// What went wrong with a prelude ([`BackendConn::run_prelude`]).
#[derive(Debug)]
pub struct PreludeProblem {
    pub what: String,
    /// The server refused the prelude with this error (not a shutdown): the client's own
    /// settings or a statement it uses, on any connection, so the client's error.
    pub refused: Option<SqlError>,
    /// The connection broke or the server ended it at a shutdown: nothing of the request was
    /// sent on it, so another connection may be tried.
    pub connection_ended: bool,
}

impl BackendConn {
    /// Writes `out` and returns its replies, frame by frame, up to and including the
    /// `readies`-th ReadyForQuery.
    pub async fn request(&mut self, out: &[u8], readies: usize) -> std::io::Result<Replies<'_>> {
        self.stream.send(out).await?;
        Ok(self.replies(readies))
    }

    /// [`BackendConn::request`] of `head` and then `body` ([`BackendStream::send_parts`]).
    pub async fn request_parts(
        &mut self,
        head: &[u8],
        body: &[u8],
        readies: usize,
    ) -> std::io::Result<Replies<'_>> {
        self.stream.send_parts(head, body).await?;
        Ok(self.replies(readies))
    }

    /// The replies to what was written last, up to and including the `readies`-th
    /// ReadyForQuery (see [`BackendConn::request`]).
    pub fn replies(&mut self, readies: usize) -> Replies<'_> {
        Replies {
            conn: self,
            readies,
            read: 0,
        }
    }

    /// Runs a prelude (what makes the connection fit for a request: settings, statements it
    /// uses) up to its `readies`-th ReadyForQuery; what went wrong, if anything.
    pub async fn run_prelude(&mut self, prelude: &[u8], readies: usize) -> Option<PreludeProblem> {
        let ended = |e: std::io::Error| PreludeProblem {
            what: e.to_string(),
            refused: None,
            connection_ended: true,
        };
        let mut replies = match self.request(prelude, readies).await {
            Ok(r) => r,
            Err(e) => return Some(ended(e)),
        };
        let mut problem = None;
        loop {
            match replies.next().await {
                Ok(Some(frame)) if frame[0] == b'E' => {
                    let (code, message) = crate::protocol::backend::error_fields(frame);
                    let shutdown = crate::protocol::backend::is_shutdown(frame);
                    problem.get_or_insert(PreludeProblem {
                        what: format!("{message} (SQLSTATE {code})"),
                        refused: (!shutdown).then(|| SqlError::with_code(code, message)),
                        connection_ended: shutdown,
                    });
                }
                Ok(Some(_)) => {}
                Ok(None) => return problem,
                Err(e) => {
                    // The connection broke after the error: it is not fit for anyone either.
                    return Some(match problem {
                        Some(p) => PreludeProblem {
                            connection_ended: true,
                            ..p
                        },
                        None => ended(e),
                    });
                }
            }
        }
    }

    /// Gives the connection a client's `settings` and waits for their answer, when it holds
    /// others and they may fail ([`Settings::is_fragile`]): the statement written next must
    /// never run without them. Otherwise nothing: [`Settings::write_apply`] writes them in
    /// the same write as the statement. The connection holds settings it does not know of
    /// ([`super::settings::UNKNOWN`]) after a failure, so the next client resets it.
    pub async fn settle_settings(&mut self, settings: &Settings) -> Result<(), PreludeProblem> {
        if self.settings_fp == settings.fingerprint() || !settings.is_fragile() {
            return Ok(());
        }
        self.give_settings(settings).await
    }

    /// Gives the connection exactly `settings` ([`Settings::write_all`]) and waits for their
    /// answer.
    pub async fn give_settings(&mut self, settings: &Settings) -> Result<(), PreludeProblem> {
        let mut out = BytesMut::new();
        let readies = settings.write_all(&mut out).map_err(|e| PreludeProblem {
            what: e.to_string(),
            refused: None,
            connection_ended: false,
        })?;
        self.settings_fp = super::settings::UNKNOWN;
        if let Some(problem) = self.run_prelude(&out, readies).await {
            return Err(problem);
        }
        self.settings_fp = settings.fingerprint();
        Ok(())
    }

    /// Writes `out` and hands every reply frame to `on_frame` until `readies` ReadyForQuery
    /// frames have come: the router's own short exchanges, where nothing is streamed to a
    /// client while it waits.
    pub async fn round_trip(
        &mut self,
        out: &[u8],
        readies: usize,
        mut on_frame: impl FnMut(&[u8]),
    ) -> std::io::Result<()> {
        let mut replies = self.request(out, readies).await?;
        while let Some(frame) = replies.next().await? {
            on_frame(frame);
        }
        Ok(())
    }

    /// Runs one simple query of the router's own (one statement, nothing streamed) and
    /// gathers what it answered.
    pub async fn simple_query(&mut self, sql: &str) -> std::io::Result<Answer> {
        let mut out = BytesMut::with_capacity(sql.len() + 8);
        crate::protocol::request::query(&mut out, sql).map_err(std::io::Error::other)?;
        let mut answer = Answer::default();
        self.round_trip(&out, 1, |frame| match frame[0] {
            b'E' => {
                answer
                    .error
                    .get_or_insert_with(|| crate::protocol::backend::error_fields(frame));
            }
            b'C' => {
                answer.tag =
                    String::from_utf8_lossy(frame.get(5..frame.len() - 1).unwrap_or_default())
                        .into_owned();
            }
            b'D' => {
                if let Ok(Some(v)) = crate::merge::row::nth_field(&frame[5..], 0) {
                    answer
                        .first_column
                        .push(String::from_utf8_lossy(v).into_owned());
                }
            }
            b'Z' => answer.status = crate::protocol::backend::ready_status(frame),
            _ => {}
        })
        .await?;
        Ok(answer)
    }

    /// The header of the next whole frame in the read buffer, reading from the socket until
    /// one has arrived. The frame stays in `rbuf` until the caller advances past it.
    pub async fn next_frame(&mut self) -> std::io::Result<crate::protocol::FrameHeader> {
        loop {
            if let Some(h) =
                crate::protocol::frame::next_frame(&self.rbuf).map_err(std::io::Error::other)?
            {
                return Ok(h);
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
        }
    }

    /// Connects and logs in; the whole login is bounded by the endpoint's connect timeout.
    pub async fn connect(ep: &Endpoint) -> Result<BackendConn, BackendError> {
        let asked = Instant::now();
        match tokio::time::timeout(ep.connect_timeout, Self::login(ep)).await {
            Ok(r) => r.map(|mut conn| {
                conn.connect_time = asked.elapsed();
                conn
            }),
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
        let tcp = TcpStream::connect((ep.host.as_str(), ep.port))
            .await
            .map_err(|source| BackendError::Connect {
                endpoint: name.clone(),
                source,
            })?;
        tcp.set_nodelay(true).map_err(io)?;
        let stream = BackendStream::open(tcp, &ep.tls, &ep.host)
            .await
            .map_err(|source| BackendError::Tls {
                endpoint: name.clone(),
                source,
            })?;
        let mut conn = BackendConn {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            pid: 0,
            secret: 0,
            params: Vec::new(),
            prepared: Default::default(),
            broken: false,
            settings_fp: 0,
            created: Instant::now(),
            connect_time: Duration::ZERO,
        };
        let mut out = BytesMut::new();
        let params = [
            ("user", ep.user.as_str()),
            ("database", ep.database.as_str()),
            ("application_name", ep.application_name.as_str()),
            ("client_encoding", "UTF8"),
        ];
        frontend::startup_message(params.iter().copied(), &mut out).map_err(io)?;
        conn.stream.send(&out).await.map_err(io)?;

        let mut scram: Option<ScramSha256> = None;
        loop {
            let h = conn.next_frame().await.map_err(io)?;
            if h.tag == b'E' {
                let (code, message) = crate::protocol::backend::error_fields(&conn.rbuf[..h.total]);
                return Err(BackendError::Refused {
                    endpoint: name.clone(),
                    code,
                    message,
                });
            }
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
                backend::Message::ReadyForQuery(_) => {
                    // A server that ends the session right after the login (a shutdown that
                    // began meanwhile) has already said so: such a connection is no use.
                    return match crate::protocol::frame::next_frame(&conn.rbuf) {
                        Ok(Some(h)) if h.tag == b'E' => {
                            let (code, message) =
                                crate::protocol::backend::error_fields(&conn.rbuf[..h.total]);
                            Err(BackendError::Refused {
                                endpoint: name.clone(),
                                code,
                                message,
                            })
                        }
                        // Nothing more, a notice, or a frame not complete yet: left for the
                        // first request.
                        _ => Ok(conn),
                    };
                }
                backend::Message::NoticeResponse(_) => {}
                _ => return Err(proto("unexpected message during login".into())),
            }
            if !out.is_empty() {
                conn.stream.send(&out).await.map_err(io)?;
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

    /// Whether an idle connection still looks usable: no unread bytes and no EOF (see
    /// [`BackendStream::is_idle_quiet`]).
    pub fn is_idle_healthy(&self) -> bool {
        !self.broken && self.rbuf.is_empty() && self.stream.is_idle_quiet()
    }
}

/// The replies to one request, frame by frame (see [`BackendConn::request`]).
pub struct Replies<'c> {
    conn: &'c mut BackendConn,
    readies: usize,
    /// Length of the frame handed out last, dropped from the buffer on the next call.
    read: usize,
}

impl Replies<'_> {
    /// Reads past the replies of the request's first `queries` Query messages: the router's
    /// own prelude in front of a client's statement (the client's settings, a `BEGIN`), whose
    /// answers are the router's business. Each ErrorResponse among them goes to `on_error`:
    /// the statement behind them ran with the wrong settings or in a failed transaction, so
    /// the error may be the caller's to report. `false` when the replies ended first.
    pub async fn skip_prelude(
        &mut self,
        queries: usize,
        mut on_error: impl FnMut(&[u8]),
    ) -> std::io::Result<bool> {
        let mut left = queries;
        while left > 0 {
            let Some(frame) = self.next().await? else {
                return Ok(false);
            };
            match frame[0] {
                b'Z' => left -= 1,
                b'E' => on_error(frame),
                _ => {}
            }
        }
        Ok(true)
    }

    /// The next reply frame; `None` once the last ReadyForQuery has been handed out.
    pub async fn next(&mut self) -> std::io::Result<Option<&[u8]>> {
        self.conn.rbuf.advance(std::mem::take(&mut self.read));
        if self.readies == 0 {
            return Ok(None);
        }
        let h = self.conn.next_frame().await?;
        if h.tag == b'Z' {
            self.readies -= 1;
        }
        self.read = h.total;
        Ok(Some(&self.conn.rbuf[..h.total]))
    }
}

impl Drop for Replies<'_> {
    fn drop(&mut self) {
        // A caller that stops early (at a CopyInResponse, say) leaves the rest for later reads.
        self.conn.rbuf.advance(self.read);
    }
}
