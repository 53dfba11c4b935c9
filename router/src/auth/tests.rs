//! The server is driven by a real client implementation (`postgres-protocol`, the one
//! tokio-postgres uses) and by a recorded psql/Postgres exchange, so "it agrees with itself"
//! is never what the tests check.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const SALT: [u8; 16] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

/// What Postgres (and postgres-protocol's own test) stores for password "secret" with SALT.
const SECRET_VERIFIER: &str = "SCRAM-SHA-256$4096:AQIDBAUGBwgJCgsMDQ4PEA==$8rrDg00OqaiWXJ7p+sCgHEIaBSHY89ZJl3mfIsf32oY=:05L1f+yZbiN8O0AnO40Og85NNRhvzTS57naKRWCcsIA=";

fn initial_response(mechanism: &str, data: &[u8]) -> Vec<u8> {
    let mut body = mechanism.as_bytes().to_vec();
    body.push(0);
    body.extend_from_slice(&(data.len() as i32).to_be_bytes());
    body.extend_from_slice(data);
    body
}

/// Runs a whole login with the postgres-protocol client; Ok only if the server accepted the
/// proof *and* the client accepted the server's signature.
fn login(
    verifier: &ScramVerifier,
    password: &str,
    binding: ChannelBinding,
) -> Result<(), AuthError> {
    let mut client = ScramSha256::new(password.as_bytes(), binding);
    let mut server = ScramServer::new(verifier, ScramServer::random_nonce());
    let server_first = server.client_first(&initial_response("SCRAM-SHA-256", client.message()))?;
    client
        .update(&server_first)
        .map_err(|e| AuthError::Protocol(format!("client rejected server-first: {e}")))?;
    let server_final = server.client_final(client.message())?;
    client
        .finish(&server_final)
        .map_err(|e| AuthError::Protocol(format!("client rejected the server signature: {e}")))
}

#[test]
fn right_password_logs_in_and_client_verifies_the_server() {
    let verifier = scram_verifier("s3cret pass", &SALT, 4096);
    assert_eq!(
        login(&verifier, "s3cret pass", ChannelBinding::unsupported()),
        Ok(())
    );
}

#[test]
fn gs2_header_y_is_accepted() {
    // "y,,": the client could do channel binding but thinks the server cannot (no TLS).
    let verifier = scram_verifier("pw", &SALT, 4096);
    assert_eq!(
        login(&verifier, "pw", ChannelBinding::unrequested()),
        Ok(())
    );
}

#[test]
fn wrong_password_is_wrong_password() {
    let verifier = scram_verifier("right", &SALT, 4096);
    assert_eq!(
        login(&verifier, "wrong", ChannelBinding::unsupported()),
        Err(AuthError::WrongPassword)
    );
    let e = AuthError::WrongPassword;
    assert_eq!(e.sqlstate(), "28P01");
    assert_eq!(
        e.client_message("app"),
        "password authentication failed for user \"app\""
    );
}

#[test]
fn channel_binding_request_is_refused_clearly() {
    let verifier = scram_verifier("pw", &SALT, 4096);
    let err = login(
        &verifier,
        "pw",
        ChannelBinding::tls_server_end_point(vec![1, 2, 3]),
    )
    .unwrap_err();
    assert_eq!(err.sqlstate(), "08P01");
    assert!(err.to_string().contains("channel binding"), "{err}");
    let err = ScramServer::new(&verifier, [0; 18])
        .client_first(&initial_response(
            "SCRAM-SHA-256-PLUS",
            b"p=tls-server-end-point,,n=,r=abc",
        ))
        .unwrap_err();
    assert!(err.to_string().contains("channel_binding=disable"), "{err}");
}

#[test]
fn unknown_user_fails_like_a_wrong_password() {
    let key = [7u8; 32];
    let mock = ScramVerifier::mock("nobody", &key);
    assert_eq!(
        login(&mock, "", ChannelBinding::unsupported()),
        Err(AuthError::WrongPassword)
    );
    // The salt a prober sees is stable per name, like a real user's.
    assert_eq!(ScramVerifier::mock("nobody", &key).salt(), mock.salt());
    assert_ne!(ScramVerifier::mock("other", &key).salt(), mock.salt());
}

#[test]
fn verifier_matches_postgres_for_a_known_salt() {
    assert_eq!(
        scram_verifier("secret", &SALT, 4096).to_string(),
        SECRET_VERIFIER
    );
}

#[test]
fn verifier_matches_postgres_protocol_for_random_salts() {
    for password in ["app", "pässwörd", "a\u{00A0}b"] {
        let theirs = postgres_protocol::password::scram_sha_256(password.as_bytes());
        let parsed = ScramVerifier::parse(&theirs).unwrap();
        let ours = scram_verifier(password, parsed.salt(), parsed.iterations());
        assert_eq!(ours.to_string(), theirs, "password {password:?}");
    }
}

#[test]
fn password_is_saslprepped_like_postgres() {
    // SASLprep maps a no-break space to a plain space; Postgres and libpq both apply it.
    assert_eq!(
        scram_verifier("a\u{00A0}b", &SALT, 4096),
        scram_verifier("a b", &SALT, 4096)
    );
    let verifier = scram_verifier("a\u{00A0}b", &SALT, 4096);
    assert_eq!(
        login(&verifier, "a b", ChannelBinding::unsupported()),
        Ok(())
    );
}

#[test]
fn real_postgres_verifier_parses_and_checks_logins() {
    let verifier = ScramVerifier::parse(SECRET_VERIFIER).unwrap();
    assert_eq!(verifier.iterations(), 4096);
    assert_eq!(verifier.salt(), &SALT);
    assert_eq!(verifier.to_string(), SECRET_VERIFIER);
    assert_eq!(
        login(&verifier, "secret", ChannelBinding::unsupported()),
        Ok(())
    );
    assert_eq!(
        login(&verifier, "Secret", ChannelBinding::unsupported()),
        Err(AuthError::WrongPassword)
    );
}

/// A psql login against Postgres, recorded (also used by postgres-protocol's own tests):
/// our server must produce Postgres's exact messages.
#[test]
fn replays_a_recorded_postgres_exchange() {
    let salt = STANDARD.decode("fs3IXBy7U7+IvVjZ").unwrap();
    let verifier = scram_verifier("foobar", &salt, 4096);
    let nonce: [u8; 18] = STANDARD
        .decode("jx/oIRLs02gGSHcw1KEty3eY")
        .unwrap()
        .try_into()
        .unwrap();
    let mut server = ScramServer::new(&verifier, nonce);
    let server_first = server
        .client_first(&initial_response(
            "SCRAM-SHA-256",
            b"n,,n=,r=9IZ2O01zb9IgiIZ1WJ/zgpJB",
        ))
        .unwrap();
    assert_eq!(
        server_first,
        b"r=9IZ2O01zb9IgiIZ1WJ/zgpJBjx/oIRLs02gGSHcw1KEty3eY,s=fs3IXBy7U7+IvVjZ,i=4096"
    );
    let server_final = server
        .client_final(
            b"c=biws,r=9IZ2O01zb9IgiIZ1WJ/zgpJBjx/oIRLs02gGSHcw1KEty3eY,p=AmNKosjJzS31NTlQYNs5BTeQjdHdk7lOflDo5re2an8=",
        )
        .unwrap();
    assert_eq!(
        server_final,
        b"v=U+ppxD5XUKtradnv8e2MkeupiA8FU87Sg8CXzXHDAzw="
    );
}

#[test]
fn secret_parse() {
    assert_eq!(Secret::parse("app"), Ok(Secret::Plain("app".into())));
    assert!(matches!(
        Secret::parse(SECRET_VERIFIER),
        Ok(Secret::Scram(_))
    ));
    for bad in [
        "SCRAM-SHA-256$",
        "SCRAM-SHA-256$4096:AQID",
        "SCRAM-SHA-256$x:AQID$a:b",
        "SCRAM-SHA-256$0:AQIDBAUGBwgJCgsMDQ4PEA==$8rrDg00OqaiWXJ7p+sCgHEIaBSHY89ZJl3mfIsf32oY=:05L1f+yZbiN8O0AnO40Og85NNRhvzTS57naKRWCcsIA=",
        "SCRAM-SHA-256$4096:!!$8rrDg00OqaiWXJ7p+sCgHEIaBSHY89ZJl3mfIsf32oY=:05L1f+yZbiN8O0AnO40Og85NNRhvzTS57naKRWCcsIA=",
        "SCRAM-SHA-256$4096:AQIDBAUGBwgJCgsMDQ4PEA==$AQID:05L1f+yZbiN8O0AnO40Og85NNRhvzTS57naKRWCcsIA=",
    ] {
        let err = Secret::parse(bad).unwrap_err();
        assert!(err.starts_with("password verifier"), "{bad}: {err}");
    }
    assert!(Secret::parse("md54ab2c5d00339c4b2a4e921d2dc4edec7")
        .unwrap_err()
        .contains("md5"));
    assert!(Secret::parse("").is_err());
    // Passwords never reach logs through Debug.
    assert!(!format!("{:?}", Secret::parse("hunter2").unwrap()).contains("hunter2"));
    let debug = format!("{:?}", Secret::parse(SECRET_VERIFIER).unwrap());
    assert!(!debug.contains("8rrDg00"), "{debug}");
}

#[test]
fn plain_secret_becomes_a_working_verifier() {
    let secret = Secret::Plain("pw".into()).into_scram();
    let Secret::Scram(verifier) = &secret else {
        panic!("still plain: {secret:?}")
    };
    assert_eq!(verifier.iterations(), 4096);
    assert_eq!(verifier.salt().len(), 16);
    assert_eq!(login(verifier, "pw", ChannelBinding::unsupported()), Ok(()));
}

#[test]
fn mechanisms_list() {
    assert_eq!(ScramServer::mechanisms(), b"SCRAM-SHA-256\0\0");
}

fn protocol_error(result: Result<Vec<u8>, AuthError>) -> String {
    match result {
        Err(AuthError::Protocol(m)) => m,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn malformed_client_first_is_a_protocol_error() {
    let verifier = scram_verifier("pw", &SALT, 4096);
    let first =
        |body: &[u8]| protocol_error(ScramServer::new(&verifier, [0; 18]).client_first(body));
    let scram = |data: &[u8]| first(&initial_response("SCRAM-SHA-256", data));

    assert!(first(&initial_response("SCRAM-SHA-1", b"n,,n=,r=abc")).contains("only SCRAM-SHA-256"));
    assert!(first(b"SCRAM-SHA-256").contains("not terminated"));
    assert!(first(b"SCRAM-SHA-256\0\0\0").contains("no data length"));
    assert!(first(b"SCRAM-SHA-256\0\xff\xff\xff\xff").contains("no client-first-message"));
    assert!(first(b"SCRAM-SHA-256\0\0\0\0\x0an,,n=,r=a").contains("does not match"));
    assert!(scram(b"").contains("channel-binding flag"));
    assert!(scram(b"x,,n=,r=abc").contains("channel-binding flag"));
    assert!(scram(b"n,a=admin,n=,r=abc").contains("authorization identity"));
    assert!(scram(b"n,,m=ext,n=,r=abc").contains("expected attribute 'n'"));
    assert!(scram(b"n,,n=,m=ext,r=abc").contains("unsupported SCRAM extension"));
    assert!(scram(b"n,,n=").contains("nonce"));
    assert!(scram(b"n,,n=,r=").contains("nonce"));
    assert!(scram(b"n,,n=,r=a\x01b").contains("nonce"));
    assert!(scram(b"n,,n=,r=ab\0").contains("NUL"));
    assert!(scram(b"n,,n=,r=abc,").contains("attribute name"));
    // Extensions after the nonce are allowed and ignored.
    assert!(ScramServer::new(&verifier, [0; 18])
        .client_first(&initial_response("SCRAM-SHA-256", b"n,,n=user,r=abc,x=1"))
        .is_ok());
}

#[test]
fn malformed_client_final_is_a_protocol_error() {
    let verifier = scram_verifier("pw", &SALT, 4096);
    let nonce = [0u8; 18];
    let full_nonce = format!("abc{}", STANDARD.encode(nonce));
    let proof = STANDARD.encode([0u8; 32]);
    let fin = |data: String| {
        let mut server = ScramServer::new(&verifier, nonce);
        server
            .client_first(&initial_response("SCRAM-SHA-256", b"n,,n=,r=abc"))
            .unwrap();
        protocol_error(server.client_final(data.as_bytes()))
    };

    assert!(fin(format!("c=eSws,r={full_nonce},p={proof}")).contains("channel-binding"));
    assert!(fin(format!("c=!!,r={full_nonce},p={proof}")).contains("channel-binding"));
    assert!(fin(format!("c=biws,r=abc,p={proof}")).contains("nonce"));
    assert!(fin(format!("c=biws,r={full_nonce},p=AQID")).contains("32 bytes"));
    assert!(fin(format!("c=biws,r={full_nonce},p={proof},x=1")).contains("garbage"));
    assert!(fin(format!("c=biws,r={full_nonce}")).contains("comma"));
    assert!(fin(format!("r={full_nonce},c=biws,p={proof}")).contains("expected attribute 'c'"));
    assert!(fin(String::new()).contains("attribute name"));
    // A right-shaped message with a wrong proof is a wrong password, not a protocol error.
    let mut server = ScramServer::new(&verifier, nonce);
    server
        .client_first(&initial_response("SCRAM-SHA-256", b"n,,n=,r=abc"))
        .unwrap();
    assert_eq!(
        server.client_final(format!("c=biws,r={full_nonce},x=ext,p={proof}").as_bytes()),
        Err(AuthError::WrongPassword)
    );
}

#[test]
fn messages_out_of_order_are_protocol_errors() {
    let verifier = scram_verifier("pw", &SALT, 4096);
    let hello = initial_response("SCRAM-SHA-256", b"n,,n=,r=abc");

    let mut server = ScramServer::new(&verifier, [0; 18]);
    assert!(protocol_error(server.client_final(b"c=biws")).contains("before"));

    let mut server = ScramServer::new(&verifier, [0; 18]);
    server.client_first(&hello).unwrap();
    assert!(protocol_error(server.client_first(&hello)).contains("after"));
    // ... and the exchange is over: no second chance at the proof.
    assert!(protocol_error(server.client_final(b"c=biws")).contains("ended"));

    // A failed proof ends the exchange too, so a client cannot retry on one connection.
    assert_eq!(
        login(&verifier, "no", ChannelBinding::unsupported()),
        Err(AuthError::WrongPassword)
    );
    let mut server = ScramServer::new(&verifier, [0; 18]);
    server.client_first(&hello).unwrap();
    let _ = server.client_final(b"junk");
    assert!(protocol_error(server.client_final(b"junk")).contains("ended"));
}

/// Random bytes, and random corruptions of valid messages, never panic: every outcome is an
/// AuthError (or, for harmless corruptions, success).
#[test]
fn random_input_never_panics() {
    let verifier = scram_verifier("pw", &SALT, 4096);
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let valid_first = initial_response("SCRAM-SHA-256", b"n,,n=,r=abcdef");
    let nonce = [9u8; 18];
    let valid_final = format!(
        "c=biws,r=abcdef{},p={}",
        STANDARD.encode(nonce),
        STANDARD.encode([0u8; 32])
    )
    .into_bytes();
    let alphabet = b"nypcr=,mas\0SCRAM-SHA-256biws";

    for round in 0..20_000 {
        let mutate = |rng: &mut StdRng, valid: &[u8]| -> Vec<u8> {
            if round % 2 == 0 {
                let len = rng.random_range(0..64);
                (0..len)
                    .map(|_| {
                        if rng.random_bool(0.5) {
                            alphabet[rng.random_range(0..alphabet.len())]
                        } else {
                            rng.random()
                        }
                    })
                    .collect()
            } else {
                let mut v = valid.to_vec();
                for _ in 0..rng.random_range(1..4) {
                    match rng.random_range(0..3) {
                        0 if !v.is_empty() => {
                            let i = rng.random_range(0..v.len());
                            v[i] = rng.random();
                        }
                        1 if !v.is_empty() => {
                            let i = rng.random_range(0..v.len());
                            v.truncate(i);
                        }
                        _ => v.push(alphabet[rng.random_range(0..alphabet.len())]),
                    }
                }
                v
            }
        };
        let mut server = ScramServer::new(&verifier, nonce);
        let first = mutate(&mut rng, &valid_first);
        let _ = server.client_first(&first);
        let mut server = ScramServer::new(&verifier, nonce);
        if server.client_first(&valid_first).is_ok() {
            let fin = mutate(&mut rng, &valid_final);
            assert!(server.client_final(&fin).is_err(), "accepted {fin:?}");
        }
    }
}
