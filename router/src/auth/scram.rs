//! The server side of a SCRAM-SHA-256 exchange (RFC 5802, RFC 7677), as Postgres runs it.
//!
//! Sans-IO: the connection code reads the client's SASL messages, hands their bodies to
//! [`ScramServer`] and writes back the bytes it returns, so the exchange is tested without a
//! socket and a bad client can only ever get an [`AuthError`], never a panic.
//!
//! The exchange on the wire (after the startup message):
//!
//! ```text
//! router: AuthenticationSASL         (code 10, ScramServer::mechanisms())
//! client: SASLInitialResponse        -> client_first()  -> AuthenticationSASLContinue (code 11)
//! client: SASLResponse               -> client_final()  -> AuthenticationSASLFinal (code 12),
//!                                                          then AuthenticationOk
//! ```
//!
//! Like Postgres without TLS channel binding, only `SCRAM-SHA-256` is offered; the GS2 header
//! must be `n,,` or `y,,`. The user name inside the client's message is ignored: Postgres
//! authenticates the user of the startup message, and libpq sends an empty one.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use super::secret::{constant_time_eq, hmac, sha256, ScramVerifier};
use super::AuthError;

/// The only mechanism offered.
const MECHANISM: &str = "SCRAM-SHA-256";

/// Where one exchange is.
enum State {
    /// Waiting for the SASLInitialResponse.
    Initial,
    /// Waiting for the SASLResponse with the client's proof.
    Final {
        /// The GS2 header of client-first (`n,,` or `y,,`); client-final must echo it in `c=`.
        gs2_header: Vec<u8>,
        /// Client nonce followed by ours; client-final must repeat it.
        nonce: Vec<u8>,
        /// client-first-message-bare "," server-first-message: the first two parts of the
        /// AuthMessage that both signatures cover.
        auth_prefix: Vec<u8>,
    },
    /// Finished, successfully or not; any further message is a protocol violation.
    Done,
}

/// One client's SCRAM-SHA-256 login. Create one per connection attempt.
pub struct ScramServer {
    verifier: ScramVerifier,
    /// Base64 of the random bytes we add to the client's nonce (24 characters, as Postgres).
    server_nonce: String,
    state: State,
}

impl ScramServer {
    /// Starts an exchange against `verifier`. `server_nonce` must be fresh random bytes for
    /// every exchange (see [`ScramServer::random_nonce`]); it is a parameter so that tests
    /// can replay recorded exchanges.
    pub fn new(verifier: &ScramVerifier, server_nonce: [u8; 18]) -> Self {
        ScramServer {
            verifier: verifier.clone(),
            server_nonce: STANDARD.encode(server_nonce),
            state: State::Initial,
        }
    }

    /// Fresh nonce bytes from a CSPRNG, for [`ScramServer::new`].
    pub fn random_nonce() -> [u8; 18] {
        let mut nonce = [0u8; 18];
        rand::fill(&mut nonce);
        nonce
    }

    /// The SASL data of the first AuthenticationSASL message: the list of mechanisms, each a
    /// C string, ended by an empty one. The caller writes the `Int32(10)` code before it.
    pub fn mechanisms() -> &'static [u8] {
        b"SCRAM-SHA-256\0\0"
    }

    /// Handles the body of the client's SASLInitialResponse (mechanism C string, Int32
    /// length, client-first-message) and returns the server-first-message, to be sent as the
    /// data of AuthenticationSASLContinue (after the `Int32(11)` code).
    pub fn client_first(
        &mut self,
        sasl_initial_response_body: &[u8],
    ) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::Initial) {
            return Err(
                self.fail("SASLInitialResponse arrived after the SCRAM exchange had started")
            );
        }
        // Whatever happens below, this exchange cannot be resumed.
        self.state = State::Done;
        let data = initial_response_data(sasl_initial_response_body)?;
        let first = parse_client_first(data)?;

        let mut nonce = first.nonce.to_vec();
        nonce.extend_from_slice(self.server_nonce.as_bytes());
        let mut server_first = b"r=".to_vec();
        server_first.extend_from_slice(&nonce);
        server_first.extend_from_slice(
            format!(
                ",s={},i={}",
                STANDARD.encode(&self.verifier.salt),
                self.verifier.iterations
            )
            .as_bytes(),
        );

        let mut auth_prefix = first.bare.to_vec();
        auth_prefix.push(b',');
        auth_prefix.extend_from_slice(&server_first);
        self.state = State::Final {
            gs2_header: first.gs2_header.to_vec(),
            nonce,
            auth_prefix,
        };
        Ok(server_first)
    }

    /// Handles the body of the client's SASLResponse (the client-final-message). On a correct
    /// proof returns the server-final-message (`v=<ServerSignature>`) for
    /// AuthenticationSASLFinal (after the `Int32(12)` code); the caller then sends
    /// AuthenticationOk. A wrong proof is [`AuthError::WrongPassword`].
    pub fn client_final(&mut self, body: &[u8]) -> Result<Vec<u8>, AuthError> {
        let (gs2_header, nonce, auth_prefix) = match std::mem::replace(&mut self.state, State::Done)
        {
            State::Final {
                gs2_header,
                nonce,
                auth_prefix,
            } => (gs2_header, nonce, auth_prefix),
            State::Initial => {
                return Err(protocol("SASLResponse arrived before SASLInitialResponse"))
            }
            State::Done => {
                return Err(protocol(
                    "SASLResponse arrived after the SCRAM exchange had ended",
                ))
            }
        };
        let fin = parse_client_final(body)?;

        // Without channel binding, `c=` is just the base64 of the GS2 header the client sent.
        if STANDARD.decode(fin.channel_binding).ok().as_deref() != Some(gs2_header.as_slice()) {
            return Err(protocol(
                "unexpected SCRAM channel-binding attribute in client-final-message",
            ));
        }
        if fin.nonce != nonce.as_slice() {
            return Err(protocol(
                "SCRAM nonce in client-final-message does not match the exchange",
            ));
        }

        let mut auth_message = auth_prefix;
        auth_message.push(b',');
        auth_message.extend_from_slice(fin.without_proof);

        // ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage), and StoredKey = H(ClientKey):
        // recover ClientKey from the proof and check that it hashes to StoredKey.
        let client_signature = hmac(&self.verifier.stored_key, &[&auth_message]);
        let mut client_key = fin.proof;
        for (k, s) in client_key.iter_mut().zip(client_signature) {
            *k ^= s;
        }
        if !constant_time_eq(&sha256(&client_key), &self.verifier.stored_key) {
            return Err(AuthError::WrongPassword);
        }

        let server_signature = hmac(&self.verifier.server_key, &[&auth_message]);
        let mut server_final = b"v=".to_vec();
        server_final.extend_from_slice(STANDARD.encode(server_signature).as_bytes());
        Ok(server_final)
    }

    fn fail(&mut self, message: &str) -> AuthError {
        self.state = State::Done;
        protocol(message)
    }
}

fn protocol(message: impl Into<String>) -> AuthError {
    AuthError::Protocol(message.into())
}

/// Splits a SASLInitialResponse body into its mechanism and data, checking both.
fn initial_response_data(body: &[u8]) -> Result<&[u8], AuthError> {
    let nul = body.iter().position(|&b| b == 0).ok_or_else(|| {
        protocol("malformed SASLInitialResponse: the mechanism name is not terminated")
    })?;
    let mechanism = &body[..nul];
    if mechanism != MECHANISM.as_bytes() {
        return Err(protocol(format!(
            "client selected SASL mechanism {:?}, but only {MECHANISM} is offered{}",
            String::from_utf8_lossy(mechanism),
            if mechanism == b"SCRAM-SHA-256-PLUS" {
                " (channel binding is not supported; connect with channel_binding=disable or prefer)"
            } else {
                ""
            }
        )));
    }
    let rest = &body[nul + 1..];
    let (len, data) = match rest.split_first_chunk::<4>() {
        Some((len, data)) => (i32::from_be_bytes(*len), data),
        None => return Err(protocol("malformed SASLInitialResponse: no data length")),
    };
    if len < 0 {
        return Err(protocol(
            "SASLInitialResponse carries no client-first-message",
        ));
    }
    if usize::try_from(len).ok() != Some(data.len()) {
        return Err(protocol(format!(
            "malformed SASLInitialResponse: data length {len} does not match the {} bytes that follow",
            data.len()
        )));
    }
    Ok(data)
}

/// The parts of a client-first-message the rest of the exchange needs.
struct ClientFirst<'a> {
    gs2_header: &'a [u8],
    /// client-first-message-bare: everything after the GS2 header.
    bare: &'a [u8],
    nonce: &'a [u8],
}

/// Parses `gs2-cbind-flag "," [authzid] "," "n=" user "," "r=" nonce ["," extensions]`.
fn parse_client_first(data: &[u8]) -> Result<ClientFirst<'_>, AuthError> {
    check_no_nul(data, "client-first-message")?;
    let mut p = Cursor::new(data, "client-first-message");
    match p.next_byte() {
        Some(b'n') | Some(b'y') => {}
        Some(b'p') => {
            return Err(protocol(
                "client requested SCRAM channel binding, which this server does not support; \
                 connect with channel_binding=disable or prefer",
            ))
        }
        _ => return Err(p.malformed("unexpected channel-binding flag")),
    }
    p.expect_comma()?;
    if p.peek() == Some(b'a') {
        return Err(protocol(
            "client uses authorization identity, but it is not supported",
        ));
    }
    p.expect_comma()?;
    let gs2_header = &data[..p.pos];
    let bare = &data[p.pos..];

    // The user name is ignored: the startup message's user is the one being authenticated.
    p.attribute(b'n')?;
    if p.peek() != Some(b',') {
        return Err(p.malformed("expected a nonce after the user name"));
    }
    p.pos += 1;
    if p.peek() == Some(b'm') {
        return Err(protocol("client requires an unsupported SCRAM extension"));
    }
    let nonce = p.attribute(b'r')?;
    if nonce.is_empty() || !nonce.iter().all(|&b| is_printable(b)) {
        return Err(p.malformed("the client nonce is empty or not printable"));
    }
    // Optional extensions after the nonce are ignored, as RFC 5802 allows and Postgres does.
    while p.peek().is_some() {
        p.expect_comma()?;
        p.any_attribute()?;
    }
    Ok(ClientFirst {
        gs2_header,
        bare,
        nonce,
    })
}

/// The parts of a client-final-message.
struct ClientFinal<'a> {
    channel_binding: &'a [u8],
    nonce: &'a [u8],
    /// client-final-message-without-proof, the last part of the AuthMessage.
    without_proof: &'a [u8],
    proof: [u8; 32],
}

/// Parses `"c=" cbind "," "r=" nonce ["," extensions] "," "p=" proof`.
fn parse_client_final(data: &[u8]) -> Result<ClientFinal<'_>, AuthError> {
    check_no_nul(data, "client-final-message")?;
    let mut p = Cursor::new(data, "client-final-message");
    let channel_binding = p.attribute(b'c')?;
    p.expect_comma()?;
    let nonce = p.attribute(b'r')?;
    loop {
        p.expect_comma()?;
        let start = p.pos - 1;
        let (name, value) = p.any_attribute()?;
        if name == b'p' {
            if p.peek().is_some() {
                return Err(p.malformed("garbage after the proof"));
            }
            let proof = STANDARD
                .decode(value)
                .ok()
                .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
                .ok_or_else(|| p.malformed("the proof is not 32 bytes of base64"))?;
            return Ok(ClientFinal {
                channel_binding,
                nonce,
                without_proof: &data[..start],
                proof,
            });
        }
    }
}

fn check_no_nul(data: &[u8], what: &str) -> Result<(), AuthError> {
    if data.contains(&0) {
        return Err(protocol(format!(
            "malformed SCRAM message (NUL byte in {what})"
        )));
    }
    Ok(())
}

/// RFC 5802 `printable`: visible ASCII except ','.
fn is_printable(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && b != b','
}

/// A position in a SCRAM message, which is `attr=value` pairs separated by commas.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8], what: &'static str) -> Self {
        Cursor { data, pos: 0, what }
    }

    fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    fn next_byte(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn malformed(&self, detail: &str) -> AuthError {
        protocol(format!(
            "malformed SCRAM message ({detail} in {})",
            self.what
        ))
    }

    fn expect_comma(&mut self) -> Result<(), AuthError> {
        match self.next_byte() {
            Some(b',') => Ok(()),
            _ => Err(self.malformed("expected a comma")),
        }
    }

    /// Reads `name=value` up to the next comma or the end, and returns the value.
    fn attribute(&mut self, name: u8) -> Result<&'a [u8], AuthError> {
        match self.any_attribute()? {
            (n, value) if n == name => Ok(value),
            _ => Err(self.malformed(&format!("expected attribute '{}'", name as char))),
        }
    }

    /// Reads any `x=value` where x is a letter, as RFC 5802's `attr-val`.
    fn any_attribute(&mut self) -> Result<(u8, &'a [u8]), AuthError> {
        let name = match self.next_byte() {
            Some(b) if b.is_ascii_alphabetic() => b,
            _ => return Err(self.malformed("expected an attribute name")),
        };
        if self.next_byte() != Some(b'=') {
            return Err(self.malformed(&format!("expected '=' after attribute '{}'", name as char)));
        }
        let start = self.pos;
        let end = self.data[start..]
            .iter()
            .position(|&b| b == b',')
            .map_or(self.data.len(), |i| start + i);
        self.pos = end;
        Ok((name, &self.data[start..end]))
    }
}
