//! Sending a request again on another connection, after Postgres aborted it at a shutdown
//! (57P01/57P02/57P03 as the very first reply: nothing of it ran, nothing reached the client).
//! Pure: what the request (the outbox bytes, written for the old connection) needs of the
//! connection it goes to, and the prelude that gives the new one exactly that.
//!
//! A request written for a connection may use router statements (`sg_<id>`) that connection
//! had prepared already, and may prepare others; the replacement holds some set of its own.
//! The prelude prepares the ones the request uses without preparing, and closes the ones the
//! request prepares that the replacement has (a second Parse of a name is an error), so the
//! same bytes mean the same on the new connection.

use bytes::BytesMut;

use crate::backend::prepared::PreparedSet;
use crate::protocol::frame::next_frame;
use crate::protocol::frontend;
use crate::protocol::request::{self, Unwritable};

/// The router statements a request uses and prepares, by id, in order of first use.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Uses {
    /// Bound or described before the request prepares them: the connection must have them.
    pub needed: Vec<u64>,
    /// Prepared by the request.
    pub prepared: Vec<u64>,
    /// Closed by the request (the old connection's least recently used).
    pub closed: Vec<u64>,
}

/// Why a request cannot be sent again as it is.
#[derive(Debug, PartialEq, Eq)]
pub struct NotReplayable(pub &'static str);

/// The id of router statement name `sg_<id>`; `None` for the unnamed statement.
fn router_id(name: &[u8]) -> Result<Option<u64>, NotReplayable> {
    if name.is_empty() {
        return Ok(None);
    }
    name.strip_prefix(b"sg_")
        .filter(|digits| !digits.is_empty())
        .and_then(|digits| {
            digits.iter().try_fold(0u64, |n, &c| {
                c.is_ascii_digit()
                    .then(|| n.checked_mul(10)?.checked_add(u64::from(c - b'0')))?
            })
        })
        .map(Some)
        .ok_or(NotReplayable("a statement name the router did not write"))
}

/// What `bytes` (a request the outbox wrote) uses. The unnamed statement must be parsed in the
/// request before it is used (the outbox always does so on a newly pinned connection).
pub fn uses(bytes: &[u8]) -> Result<Uses, NotReplayable> {
    let mut uses = Uses::default();
    let mut unnamed_parsed = false;
    let mut rest = bytes;
    let malformed = NotReplayable("a request the router cannot read back");
    // The router wrote these messages itself: only their names are read back, not decoded.
    fn name(body: &[u8], nth: usize) -> Result<&[u8], NotReplayable> {
        frontend::nth_cstr(body, nth).ok_or(NotReplayable("a malformed request"))
    }
    while let Some(h) = next_frame(rest).map_err(|_| NotReplayable("a malformed request"))? {
        let body = rest.get(5..h.total).ok_or(NotReplayable("a cut request"))?;
        let used = |name: &[u8], uses: &mut Uses| -> Result<(), NotReplayable> {
            match router_id(name)? {
                None if !unnamed_parsed => {
                    Err(NotReplayable("the unnamed statement of another request"))
                }
                None => Ok(()),
                Some(id) => {
                    if !uses.prepared.contains(&id) && !uses.needed.contains(&id) {
                        uses.needed.push(id);
                    }
                    Ok(())
                }
            }
        };
        match h.tag {
            b'P' => match router_id(name(body, 0)?)? {
                None => unnamed_parsed = true,
                Some(id) => {
                    uses.closed.retain(|&c| c != id);
                    uses.prepared.push(id);
                }
            },
            // Portal, then statement.
            b'B' => used(name(body, 1)?, &mut uses)?,
            b'D' | b'C' => {
                let (&kind, target) = body
                    .split_first()
                    .ok_or(NotReplayable("a malformed target"))?;
                if kind == b'S' {
                    let target = name(target, 0)?;
                    if h.tag == b'D' {
                        used(target, &mut uses)?;
                    } else if let Some(id) = router_id(target)? {
                        uses.prepared.retain(|&p| p != id);
                        uses.closed.push(id);
                    }
                }
            }
            b'Q' | b'E' | b'S' | b'H' => {}
            // COPY data and anything else: not sent again.
            _ => return Err(malformed),
        }
        rest = &rest[h.total..];
    }
    Ok(uses)
}

/// The prelude that makes `conn` (the replacement's prepared set, updated to what it holds
/// after the prelude and the request) fit `uses`: [`preparation`], then a Sync when anything
/// was written; returns whether it did.
pub fn prelude<'t>(
    out: &mut BytesMut,
    uses: &Uses,
    conn: &mut PreparedSet,
    text: impl Fn(u64) -> Option<(&'t str, &'t [u8])>,
) -> Result<bool, NotReplayable> {
    if preparation(out, uses, conn, text)? == 0 {
        return Ok(false);
    }
    request::sync(out);
    Ok(true)
}

/// What makes `conn` (a prepared set, updated to what the connection holds after this and the
/// request) fit `uses`, without a Sync: Parse for each needed statement it lacks (`text` gives
/// its SQL and parameter types), Close for each it has that the request prepares. Returns how
/// many messages it wrote (each answered by a ParseComplete or a CloseComplete).
pub fn preparation<'t>(
    out: &mut BytesMut,
    uses: &Uses,
    conn: &mut PreparedSet,
    text: impl Fn(u64) -> Option<(&'t str, &'t [u8])>,
) -> Result<usize, NotReplayable> {
    let unwritable = |_: Unwritable| NotReplayable("a statement the router cannot write");
    let mut written = 0;
    for &id in &uses.needed {
        if conn.contains(&id) {
            continue;
        }
        let (sql, types) = text(id).ok_or(NotReplayable("a statement the client closed"))?;
        if let Some(old) = conn.insert(id) {
            if uses.needed.contains(&old) {
                return Err(NotReplayable("more statements than a connection keeps"));
            }
            request::close_statement(out, &format!("sg_{old}")).map_err(unwritable)?;
            written += 1;
        }
        request::parse(out, &format!("sg_{id}"), sql, types).map_err(unwritable)?;
        written += 1;
    }
    for &id in &uses.prepared {
        if conn.contains(&id) {
            request::close_statement(out, &format!("sg_{id}")).map_err(unwritable)?;
            written += 1;
            conn.remove(&id);
        }
    }
    // What the request itself does to the set.
    for &id in &uses.prepared {
        if let Some(old) = conn.insert(id) {
            if uses.needed.contains(&old) || uses.prepared.contains(&old) {
                return Err(NotReplayable("more statements than a connection keeps"));
            }
            request::close_statement(out, &format!("sg_{old}")).map_err(unwritable)?;
            written += 1;
        }
    }
    for id in &uses.closed {
        conn.remove(id);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(build: impl FnOnce(&mut BytesMut)) -> BytesMut {
        let mut b = BytesMut::new();
        build(&mut b);
        b
    }

    #[test]
    fn a_bind_of_a_statement_the_old_connection_had_needs_it() {
        let b = request(|b| {
            request::bind_text(b, "sg_7", &[Some("1".to_string())]).unwrap();
            request::execute(b);
            request::sync(b);
        });
        let uses = uses(&b).unwrap();
        assert_eq!(uses.needed, [7]);
        assert!(uses.prepared.is_empty());

        let mut conn = PreparedSet::default();
        let mut out = BytesMut::new();
        let wrote = prelude(&mut out, &uses, &mut conn, |id| {
            (id == 7).then_some(("SELECT $1", &[0u8, 0][..]))
        })
        .unwrap();
        assert!(wrote);
        assert!(conn.contains(&7));
        let tags: Vec<u8> = frames(&out);
        assert_eq!(tags, b"PS");
    }

    #[test]
    fn a_statement_the_request_prepares_is_closed_first_where_it_exists() {
        let b = request(|b| {
            request::parse(b, "sg_3", "SELECT 1", &[0, 0]).unwrap();
            request::bind_text(b, "sg_3", &[]).unwrap();
            request::execute(b);
            request::sync(b);
        });
        let uses = uses(&b).unwrap();
        assert_eq!((uses.needed.len(), uses.prepared.as_slice()), (0, &[3][..]));
        let mut conn = PreparedSet::default();
        conn.insert(3);
        let mut out = BytesMut::new();
        assert!(prelude(&mut out, &uses, &mut conn, |_| None).unwrap());
        assert_eq!(frames(&out), b"CS");
        // A connection without it needs nothing.
        let mut fresh = PreparedSet::default();
        let mut out = BytesMut::new();
        assert!(!prelude(&mut out, &uses, &mut fresh, |_| None).unwrap());
        assert!(out.is_empty() && fresh.contains(&3));
    }

    #[test]
    fn simple_queries_need_nothing_and_odd_requests_are_not_replayed() {
        let b = request(|b| request::query(b, "SELECT 1").unwrap());
        assert_eq!(uses(&b).unwrap(), Uses::default());
        let unnamed = request(|b| {
            request::bind_text(b, "", &[]).unwrap();
            request::execute(b);
        });
        assert!(
            uses(&unnamed).is_err(),
            "the unnamed statement of an earlier request"
        );
        let foreign = request(|b| request::bind_text(b, "mine", &[]).unwrap());
        assert!(uses(&foreign).is_err());
        let mut cut = request(|b| request::query(b, "SELECT 1").unwrap());
        cut.truncate(cut.len() - 1);
        assert_eq!(
            uses(&cut).unwrap(),
            Uses::default(),
            "a partial frame is not read"
        );
    }

    #[test]
    fn only_names_the_router_writes_have_an_id() {
        assert_eq!(router_id(b""), Ok(None));
        assert_eq!(router_id(b"sg_0"), Ok(Some(0)));
        assert_eq!(router_id(b"sg_18446744073709551615"), Ok(Some(u64::MAX)));
        for other in [
            &b"sg_"[..],
            b"sg_12x",
            b"sg_+1",
            b"sg_18446744073709551616",
            b"P0_1",
        ] {
            assert!(
                router_id(other).is_err(),
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn a_describe_of_a_statement_needs_it_and_a_close_forgets_it() {
        let b = request(|b| {
            request::describe_statement(b, "sg_4").unwrap();
            request::close_statement(b, "sg_5").unwrap();
            request::sync(b);
        });
        let found = uses(&b).unwrap();
        assert_eq!((found.needed, found.closed), (vec![4], vec![5]));
        // A name cut before its NUL is not read as a name.
        let mut cut = request(|b| request::describe_statement(b, "sg_4").unwrap());
        let n = cut.len();
        cut[n - 1] = b'9';
        assert!(uses(&cut).is_err());
    }

    fn frames(bytes: &[u8]) -> Vec<u8> {
        let mut tags = Vec::new();
        let mut rest = bytes;
        while let Ok(Some(h)) = next_frame(rest) {
            tags.push(h.tag);
            rest = &rest[h.total..];
        }
        tags
    }
}
