//! The login path: startup packets ([`shardgate::protocol::startup`]) and the SCRAM exchange
//! ([`shardgate::auth::scram`]), driven by arbitrary bytes, by `postgres-protocol`'s own writers and
//! SCRAM client, and by mutations of what those write.

use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend as pg;
use rand::rngs::StdRng;
use rand::Rng;

use super::{bytes, mutate, run, text};
use shardgate::auth::{AuthError, ScramServer, ScramVerifier};
use shardgate::protocol::startup::{self, Startup};

/// Reads a packet as `server::handshake::read_packet` does: the length first, then the whole
/// packet.
fn read_packet(buf: &[u8]) -> Option<Result<Startup, startup::StartupError>> {
    match startup::packet_len(buf) {
        Ok(Some(len)) if len <= buf.len() => Some(startup::decode(&buf[..len])),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    }
}

fn startup_params(rng: &mut StdRng) -> Vec<(String, String)> {
    (0..rng.random_range(0..5))
        .map(|_| {
            let mut key = text(rng, 10);
            if key.is_empty() {
                key.push('k');
            }
            (key, text(rng, 20))
        })
        .collect()
}

#[test]
fn startup_packets_never_panic_and_round_trip() {
    run("login/startup", |rng| {
        // Arbitrary bytes, whole or as a stream.
        let junk = bytes(rng, 40);
        let _ = read_packet(&junk);
        let _ = startup::decode(&junk);

        let params = startup_params(rng);
        let mut buf = BytesMut::new();
        pg::startup_message(
            params.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            &mut buf,
        )
        .expect("startup message");
        match read_packet(&buf) {
            Some(Ok(Startup::Startup { params: got })) => assert_eq!(got, params),
            other => panic!("{params:?} read back as {other:?}"),
        }
        let mut mutated = buf.to_vec();
        mutate(rng, &mut mutated);
        if let Some(Ok(Startup::Startup { params })) = read_packet(&mutated) {
            assert!(params.iter().all(|(k, _)| !k.is_empty()));
        }
    });
}

/// A SASLInitialResponse body with `data`.
fn initial_response(data: &[u8]) -> Vec<u8> {
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    body.extend_from_slice(&(data.len() as i32).to_be_bytes());
    body.extend_from_slice(data);
    body
}

/// A verifier with one PBKDF2 iteration (the client follows the server's count), so that
/// thousands of exchanges stay cheap.
fn verifier(rng: &mut StdRng, password: &str) -> ScramVerifier {
    let salt: Vec<u8> = (0..rng.random_range(1..20)).map(|_| rng.random()).collect();
    scram_verifier(password, &salt)
}

/// The verifier Postgres stores for `password` with `salt` and one iteration, in its text
/// form (RFC 5802: the password SASLprep-normalised where it can be, as libpq does).
fn scram_verifier(password: &str, salt: &[u8]) -> ScramVerifier {
    use base64::Engine;
    use hmac::{KeyInit, Mac};
    let hmac = |key: &[u8], parts: &[&[u8]]| -> Vec<u8> {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().to_vec()
    };
    let prepared = stringprep::saslprep(password).unwrap_or(password.into());
    // Hi() with one iteration is U1 = HMAC(password, salt || INT(1)).
    let salted = hmac(prepared.as_bytes(), &[salt, &1u32.to_be_bytes()]);
    let stored: Vec<u8> = {
        use sha2::Digest;
        sha2::Sha256::digest(hmac(&salted, &[b"Client Key"])).to_vec()
    };
    let server = hmac(&salted, &[b"Server Key"]);
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let text = format!(
        "SCRAM-SHA-256$1:{}${}:{}",
        b64(salt),
        b64(&stored),
        b64(&server)
    );
    ScramVerifier::parse(&text).expect("a well-formed verifier")
}

/// What a real client sends in a whole exchange with `password`: (client-first body,
/// client-final body), against a server that answered the first.
fn real_exchange(
    server: &mut ScramServer,
    password: &str,
) -> Result<(Vec<u8>, Vec<u8>), AuthError> {
    let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
    let first = initial_response(client.message());
    let server_first = server.client_first(&first)?;
    client
        .update(&server_first)
        .map_err(|e| AuthError::Protocol(format!("client rejected server-first: {e}")))?;
    Ok((first, client.message().to_vec()))
}

#[test]
fn scram_exchanges_round_trip_and_never_panic() {
    run("login/scram", |rng| {
        let password = text(rng, 12);
        let v = verifier(rng, &password);

        // The real client logs in with the right password and not with another.
        let mut server = ScramServer::new(&v, rng.random());
        let (first, fin) = real_exchange(&mut server, &password).expect("client-first");
        assert!(server.client_final(&fin).is_ok(), "password {password:?}");
        let other = format!("{password}x");
        let mut server = ScramServer::new(&v, rng.random());
        let (_, wrong) = real_exchange(&mut server, &other).expect("client-first");
        assert_eq!(server.client_final(&wrong), Err(AuthError::WrongPassword));

        // Arbitrary and mutated client-first messages.
        let mut server = ScramServer::new(&v, rng.random());
        let _ = server.client_first(&bytes(rng, 60));
        let _ = server.client_final(&bytes(rng, 60));
        let mut mutated = first.clone();
        mutate(rng, &mut mutated);
        let mut server = ScramServer::new(&v, rng.random());
        if server.client_first(&mutated).is_ok() {
            let _ = server.client_final(&fin);
        }

        // A mutated client-final after a real client-first never logs in.
        let mut server = ScramServer::new(&v, rng.random());
        let (_, fin) = real_exchange(&mut server, &password).expect("client-first");
        let mut mutated = fin.clone();
        mutate(rng, &mut mutated);
        let result = server.client_final(&mutated);
        if mutated != fin {
            assert!(
                result.is_err(),
                "a mutated proof logged in: {:?}",
                String::from_utf8_lossy(&mutated)
            );
        }
        // And the exchange is over either way.
        assert!(server.client_final(&fin).is_err());
    });
}
