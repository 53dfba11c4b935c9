//! Messages the router writes to a Postgres backend itself (frontend messages), with the
//! writers of `postgres-protocol`. A client's own messages are forwarded as they came and are
//! not built here; only a Bind whose statement name changes is re-framed ([`rebind`]).
//!
//! The writers fail only on a string with a NUL byte or a message past 2 GiB, neither of which
//! a text that arrived in a protocol message can be; such a failure is reported, never sent.

use bytes::BytesMut;
use postgres_protocol::message::frontend;

use super::frame::{begin_frame, end_frame};

/// A message that cannot be written (a NUL inside a string, or too long).
#[derive(Debug, thiserror::Error)]
#[error("cannot write a {message} message: {source}")]
pub struct Unwritable {
    pub message: &'static str,
    source: std::io::Error,
}

fn written(message: &'static str, r: std::io::Result<()>) -> Result<(), Unwritable> {
    r.map_err(|source| Unwritable { message, source })
}

/// `Q`: a simple query.
pub fn query(buf: &mut BytesMut, sql: &str) -> Result<(), Unwritable> {
    written("Query", frontend::query(sql, buf))
}

/// A `Q` message of its own, for a request that is only that.
pub fn query_message(sql: &str) -> Result<Vec<u8>, Unwritable> {
    let mut buf = BytesMut::new();
    query(&mut buf, sql)?;
    Ok(buf.to_vec())
}

/// `P`: Parse of `sql` as statement `name`; `param_types` is a Parse message's own section
/// (count + OIDs, as a client sent it), kept as it came.
pub fn parse(
    buf: &mut BytesMut,
    name: &str,
    sql: &str,
    param_types: &[u8],
) -> Result<(), Unwritable> {
    let oids = param_types
        .get(2..)
        .unwrap_or_default()
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    written("Parse", frontend::parse(name, sql, oids, buf))
}

/// `B`: Bind of statement `name` to the unnamed portal with text parameters (`None` is NULL)
/// and text results.
pub fn bind_text(
    buf: &mut BytesMut,
    name: &str,
    params: &[Option<String>],
) -> Result<(), Unwritable> {
    let r = frontend::bind(
        "",
        name,
        [0i16],
        params.iter(),
        |p, buf| match p {
            Some(v) => {
                buf.extend_from_slice(v.as_bytes());
                Ok(postgres_protocol::IsNull::No)
            }
            None => Ok(postgres_protocol::IsNull::Yes),
        },
        [0i16],
        buf,
    );
    r.map_err(|e| Unwritable {
        message: "Bind",
        source: match e {
            frontend::BindError::Conversion(e) => std::io::Error::other(e),
            frontend::BindError::Serialization(e) => e,
        },
    })
}

/// `B`: a client's Bind sent on with another statement name. `portal` is the portal name and
/// `tail` everything after the statement name (parameter formats and values, result formats),
/// both as the client sent them.
pub fn rebind(buf: &mut BytesMut, portal: &[u8], name: &str, tail: &[u8]) {
    let at = begin_frame(buf, b'B');
    buf.extend_from_slice(portal);
    buf.extend_from_slice(b"\0");
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b"\0");
    buf.extend_from_slice(tail);
    end_frame(buf, at);
}

/// `sql` run as a client's batch runs it: Parse (unnamed, with `param_types`), Describe of
/// the statement, the client's Bind (`tail`, everything after its statement name) of the
/// unnamed portal, Describe of the portal, Execute, Sync.
pub fn bound(sql: &str, param_types: &[u8], tail: &[u8]) -> Result<Vec<u8>, Unwritable> {
    let mut buf = BytesMut::new();
    parse(&mut buf, "", sql, param_types)?;
    describe_statement(&mut buf, "")?;
    rebind(&mut buf, b"", "", tail);
    describe_portal(&mut buf);
    execute(&mut buf);
    sync(&mut buf);
    Ok(buf.to_vec())
}

/// `sql` bound with `tail` (a Bind's bytes after the statement name), run without a
/// description of the statement: Parse (unnamed, with `param_types`), Bind, Describe of the
/// portal, Execute, Sync.
pub fn bound_portal(sql: &str, param_types: &[u8], tail: &[u8]) -> Result<Vec<u8>, Unwritable> {
    let mut buf = BytesMut::new();
    parse(&mut buf, "", sql, param_types)?;
    rebind(&mut buf, b"", "", tail);
    describe_portal(&mut buf);
    execute(&mut buf);
    sync(&mut buf);
    Ok(buf.to_vec())
}

/// The tail of a Bind (what follows the statement name): a client's parameters (`params`, its
/// Bind's format codes and values as it sent them), then `extra` values in binary, then
/// `result_formats` (count and codes).
pub fn bind_tail(
    params: &[u8],
    extra: &[Vec<u8>],
    result_formats: &[u8],
) -> Result<Vec<u8>, Unwritable> {
    let bad = |why: &str| Unwritable {
        message: "Bind",
        source: std::io::Error::other(why.to_string()),
    };
    let mut r = super::frontend::Reader::new(params, "Bind");
    let codes_given = r.count().map_err(|_| bad("malformed parameter formats"))?;
    let mut codes = Vec::with_capacity(codes_given);
    for _ in 0..codes_given {
        codes.push(r.i16().map_err(|_| bad("malformed parameter formats"))?);
    }
    let n = r.count().map_err(|_| bad("malformed parameter count"))?;
    let total = i16::try_from(n + extra.len()).map_err(|_| bad("too many parameters"))?;
    let mut tail = Vec::with_capacity(params.len() + 4 * extra.len() + result_formats.len() + 8);
    // Every parameter's format, then the router's (binary) ones.
    tail.extend_from_slice(&total.to_be_bytes());
    for i in 0..n {
        let code = match codes.as_slice() {
            [] => 0,
            [one] => *one,
            each => each
                .get(i)
                .copied()
                .ok_or_else(|| bad("fewer formats than parameters"))?,
        };
        tail.extend_from_slice(&code.to_be_bytes());
    }
    for _ in extra {
        tail.extend_from_slice(&1i16.to_be_bytes());
    }
    tail.extend_from_slice(&total.to_be_bytes());
    tail.extend_from_slice(r.rest());
    for value in extra {
        let len = i32::try_from(value.len()).map_err(|_| bad("a value past 2 GiB"))?;
        tail.extend_from_slice(&len.to_be_bytes());
        tail.extend_from_slice(value);
    }
    tail.extend_from_slice(result_formats);
    Ok(tail)
}

/// `D` of a statement.
pub fn describe_statement(buf: &mut BytesMut, name: &str) -> Result<(), Unwritable> {
    written("Describe", frontend::describe(b'S', name, buf))
}

/// `D` of the unnamed portal.
pub fn describe_portal(buf: &mut BytesMut) {
    // An empty name has no NUL inside.
    let _ = frontend::describe(b'P', "", buf);
}

/// `E` of the unnamed portal, all rows.
pub fn execute(buf: &mut BytesMut) {
    // An empty name has no NUL inside.
    let _ = frontend::execute("", 0, buf);
}

/// `D` of portal `name`.
pub fn describe_named_portal(buf: &mut BytesMut, name: &str) -> Result<(), Unwritable> {
    written("Describe", frontend::describe(b'P', name, buf))
}

/// `E` of portal `name`, at most `max_rows` rows (0: all).
pub fn execute_portal(buf: &mut BytesMut, name: &str, max_rows: i32) -> Result<(), Unwritable> {
    written("Execute", frontend::execute(name, max_rows, buf))
}

/// `C` of a portal.
pub fn close_portal(buf: &mut BytesMut, name: &str) -> Result<(), Unwritable> {
    written("Close", frontend::close(b'P', name, buf))
}

/// `C` of a statement.
pub fn close_statement(buf: &mut BytesMut, name: &str) -> Result<(), Unwritable> {
    written("Close", frontend::close(b'S', name, buf))
}

/// `S`: Sync.
pub fn sync(buf: &mut BytesMut) {
    frontend::sync(buf);
}

/// `d`: CopyData.
pub fn copy_data(buf: &mut BytesMut, data: &[u8]) -> Result<(), Unwritable> {
    let data = frontend::CopyData::new(data).map_err(|source| Unwritable {
        message: "CopyData",
        source,
    })?;
    data.write(buf);
    Ok(())
}

/// `c`: CopyDone.
pub fn copy_done(buf: &mut BytesMut) {
    frontend::copy_done(buf);
}

/// `f`: CopyFail with a message.
pub fn copy_fail(buf: &mut BytesMut, why: &str) -> Result<(), Unwritable> {
    written("CopyFail", frontend::copy_fail(why, buf))
}

/// A CancelRequest packet (it has no tag: it is a connection's first and only packet).
pub fn cancel_request(pid: i32, secret: i32) -> BytesMut {
    let mut buf = BytesMut::with_capacity(16);
    frontend::cancel_request(pid, secret, &mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::{frames, put_frame};

    #[test]
    fn writers_frame_like_postgres() {
        let mut b = BytesMut::new();
        query(&mut b, "SELECT 1").unwrap();
        let mut want = Vec::new();
        put_frame(&mut want, b'Q', b"SELECT 1\0");
        assert_eq!(&b[..], &want[..]);

        let mut b = BytesMut::new();
        parse(&mut b, "sg_1", "SELECT $1", &[0, 1, 0, 0, 0, 20]).unwrap();
        let mut want = Vec::new();
        put_frame(&mut want, b'P', b"sg_1\0SELECT $1\0\0\x01\0\0\0\x14");
        assert_eq!(&b[..], &want[..]);

        let mut b = BytesMut::new();
        rebind(&mut b, b"", "sg_1", b"\0\0\0\0\0\0");
        let mut want = Vec::new();
        put_frame(&mut want, b'B', b"\0sg_1\0\0\0\0\0\0\0");
        assert_eq!(&b[..], &want[..]);

        let mut b = BytesMut::new();
        bind_text(&mut b, "sg_2", &[Some("42".into()), None]).unwrap();
        let mut want = Vec::new();
        put_frame(
            &mut want,
            b'B',
            b"\0sg_2\0\0\x01\0\0\0\x02\0\0\0\x0242\xff\xff\xff\xff\0\x01\0\0",
        );
        assert_eq!(&b[..], &want[..]);

        let mut b = BytesMut::new();
        describe_portal(&mut b);
        execute(&mut b);
        sync(&mut b);
        let tags: Vec<u8> = frames(&b).map(|f| f.unwrap()[0]).collect();
        assert_eq!(tags, b"DES");
        assert!(query(&mut BytesMut::new(), "SELECT '\0'").is_err());
        assert_eq!(cancel_request(7, 9).len(), 16);
    }
}
