//! Frames and the messages a client sends after login ([`shardgate::protocol::frame`],
//! [`shardgate::protocol::frontend`]): arbitrary and mutated byte streams never panic, and
//! messages written by `postgres-protocol` decode to the fields they were written with.

use bytes::BytesMut;
use postgres_protocol::message::frontend as pg;
use postgres_protocol::IsNull;
use rand::rngs::StdRng;
use rand::Rng;

use super::{bytes, mutate, run, text};
use shardgate::protocol::frame::{frames, next_frame};
use shardgate::protocol::frontend::{self, Format};

/// Decodes one frame as the session does for its tag, using every accessor of the result.
fn decode(frame: &[u8]) {
    let body = &frame[5..];
    match frame[0] {
        b'Q' => {
            let _ = frontend::query(body);
        }
        b'P' => {
            let _ = frontend::parse(body);
        }
        b'B' => {
            if let Ok(b) = frontend::bind(body) {
                for i in 0..=b.param_count + 1 {
                    let _ = b.param(i);
                    let _ = b.result_binary(i);
                }
                let _ = (b.result_format_count(), b.without_result_formats());
            }
        }
        b'D' => {
            let _ = frontend::target(body, "Describe");
        }
        b'C' => {
            let _ = frontend::target(body, "Close");
        }
        _ => {}
    }
}

/// Walks a byte stream frame by frame, as the session's read loop does.
fn walk(buf: &[u8]) {
    let mut at = 0;
    while let Ok(Some(h)) = next_frame(&buf[at..]) {
        assert!(h.total >= 5 && at + h.total <= buf.len());
        decode(&buf[at..at + h.total]);
        at += h.total;
    }
    for frame in frames(buf).flatten() {
        decode(frame);
    }
}

/// A session's worth of real messages and what they were written with.
struct Written {
    buf: BytesMut,
    sql: String,
    name: String,
    portal: String,
    types: Vec<u32>,
    formats: Vec<i16>,
    values: Vec<Option<Vec<u8>>>,
    results: Vec<i16>,
}

fn written(rng: &mut StdRng) -> Written {
    let sql = text(rng, 40);
    let name = text(rng, 8);
    let portal = text(rng, 8);
    let types: Vec<u32> = (0..rng.random_range(0..4)).map(|_| rng.random()).collect();
    let n = rng.random_range(0..5);
    let values: Vec<Option<Vec<u8>>> = (0..n)
        .map(|_| rng.random_bool(0.8).then(|| bytes(rng, 12)))
        .collect();
    let formats: Vec<i16> = match rng.random_range(0..3) {
        0 => vec![],
        1 => vec![rng.random_range(0..2)],
        _ => (0..n).map(|_| rng.random_range(0..2)).collect(),
    };
    let results: Vec<i16> = (0..rng.random_range(0..4))
        .map(|_| rng.random_range(0..2))
        .collect();
    let mut buf = BytesMut::new();
    pg::query(&sql, &mut buf).expect("query");
    pg::parse(&name, &sql, types.iter().copied(), &mut buf).expect("parse");
    pg::describe(b'S', &name, &mut buf).expect("describe");
    pg::bind(
        &portal,
        &name,
        formats.iter().copied(),
        values.iter(),
        |v: &Option<Vec<u8>>, out: &mut BytesMut| match v {
            Some(v) => {
                out.extend_from_slice(v);
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        },
        results.iter().copied(),
        &mut buf,
    )
    .map_err(|_| "bind")
    .expect("bind");
    pg::execute(&portal, 0, &mut buf).expect("execute");
    pg::close(b'P', &portal, &mut buf).expect("close");
    pg::sync(&mut buf);
    Written {
        buf,
        sql,
        name,
        portal,
        types,
        formats,
        values,
        results,
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    run("wire/arbitrary", |rng| {
        let mut buf = bytes(rng, 64);
        // A plausible header half the time, so bodies get decoded.
        if rng.random_bool(0.5) && buf.len() >= 5 {
            buf[0] = b"QPBDCSEHXdcf"[rng.random_range(0..12)];
            let len = (buf.len() - 1) as i32;
            buf[1..5].copy_from_slice(&len.to_be_bytes());
        }
        walk(&buf);
    });
}

#[test]
fn written_messages_decode_to_their_fields() {
    run("wire/roundtrip", |rng| {
        let w = written(rng);
        let all: Vec<&[u8]> = frames(&w.buf).map(|f| f.expect("a whole frame")).collect();
        assert_eq!(
            all.iter().map(|f| f[0]).collect::<Vec<_>>(),
            b"QPDBECS",
            "every message is one frame"
        );
        assert_eq!(frontend::query(&all[0][5..]), Ok(w.sql.as_str()));
        let p = frontend::parse(&all[1][5..]).expect("parse");
        assert_eq!((p.name, p.sql), (w.name.as_str(), w.sql.as_str()));
        assert_eq!(p.param_types.len(), 2 + 4 * w.types.len());
        let d = frontend::target(&all[2][5..], "Describe").expect("describe");
        assert_eq!((d.kind, d.name), (b'S', w.name.as_str()));
        let b = frontend::bind(&all[3][5..]);
        if w.formats.len() > 1 && w.formats.len() != w.values.len() {
            assert!(b.is_err(), "formats that match no parameter count");
            return;
        }
        let b = b.expect("bind");
        assert_eq!(
            (b.portal, b.statement),
            (w.portal.as_str(), w.name.as_str())
        );
        assert_eq!(b.param_count, w.values.len());
        assert_eq!(b.result_format_count(), w.results.len());
        for (i, v) in w.values.iter().enumerate() {
            let code = match w.formats.len() {
                0 => 0,
                1 => w.formats[0],
                _ => w.formats[i],
            };
            let format = if code == 1 {
                Format::Binary
            } else {
                Format::Text
            };
            assert_eq!(b.param(i), Some((format, v.as_deref())), "parameter {i}");
        }
        assert_eq!(b.param(w.values.len()), None);
        for i in 0..w.results.len() + 1 {
            let want = match w.results.len() {
                0 => false,
                1 => w.results[0] == 1,
                n if i < n => w.results[i] == 1,
                _ => false,
            };
            assert_eq!(b.result_binary(i), want, "result column {i}");
        }
        let c = frontend::target(&all[5][5..], "Close").expect("close");
        assert_eq!((c.kind, c.name), (b'P', w.portal.as_str()));
    });
}

#[test]
fn mutated_sessions_never_panic() {
    run("wire/mutated", |rng| {
        let mut buf = written(rng).buf.to_vec();
        mutate(rng, &mut buf);
        walk(&buf);
        // A mutated body inside an intact frame, so the decoders see it rather than framing.
        let w = written(rng);
        for frame in frames(&w.buf).flatten() {
            let mut body = frame[5..].to_vec();
            mutate(rng, &mut body);
            let mut f = vec![frame[0]];
            f.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
            f.extend_from_slice(&body);
            decode(&f);
        }
    });
}
