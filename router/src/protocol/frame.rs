//! Message framing: a one-byte tag, a 4-byte big-endian length that counts itself, a body.
//!
//! [`next_frame`] finds the next complete message at the front of a buffer without copying
//! it, so both directions of the proxy can forward whole frames as raw bytes.

/// The largest message accepted from a client or a backend. Postgres caps a query at 1 GiB;
/// anything longer is a broken or hostile peer.
pub const MAX_MESSAGE_LEN: usize = 1 << 30;

/// Where a complete message sits at the front of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub tag: u8,
    /// Length of the whole frame in bytes: tag + length field + body.
    pub total: usize,
}

impl FrameHeader {
    /// The body's range within the frame.
    pub fn body(&self) -> std::ops::Range<usize> {
        5..self.total
    }
}

/// The peer sent a length that cannot be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid message length {len} for message type {tag:?}")]
pub struct FrameError {
    pub tag: char,
    pub len: i64,
}

/// The header of the first message in `buf` if all of it has arrived; `Ok(None)` when more
/// bytes are needed.
#[inline]
pub fn next_frame(buf: &[u8]) -> Result<Option<FrameHeader>, FrameError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 || len as usize > MAX_MESSAGE_LEN {
        return Err(FrameError {
            tag: char::from(buf[0]),
            len: i64::from(len),
        });
    }
    let total = len as usize + 1;
    Ok((buf.len() >= total).then_some(FrameHeader { tag: buf[0], total }))
}

/// The whole frames in `buf`, in order (a buffer of messages the router holds or collects).
/// Each item is a complete frame: its tag is `frame[0]`, its body `&frame[5..]`. Bytes after
/// the last whole frame are not returned.
pub fn frames(buf: &[u8]) -> Frames<'_> {
    Frames { buf }
}

pub struct Frames<'a> {
    buf: &'a [u8],
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<&'a [u8], FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        match next_frame(self.buf) {
            Ok(Some(h)) => {
                let (frame, rest) = self.buf.split_at(h.total);
                self.buf = rest;
                Some(Ok(frame))
            }
            Ok(None) => None,
            Err(e) => {
                self.buf = &[];
                Some(Err(e))
            }
        }
    }
}

/// A buffer frames are appended to: the router's output buffers are `Vec<u8>` toward clients
/// and `BytesMut` toward backends (where `postgres-protocol` writes too).
pub trait Out: std::ops::DerefMut<Target = [u8]> {
    fn put(&mut self, bytes: &[u8]);
}

impl Out for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Out for bytes::BytesMut {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Appends a frame with `tag` and `body`.
pub fn put_frame(out: &mut impl Out, tag: u8, body: &[u8]) {
    out.put(&[tag]);
    out.put(&((body.len() + 4) as i32).to_be_bytes());
    out.put(body);
}

/// Starts a frame whose body the caller appends; finish it with [`end_frame`].
pub fn begin_frame(out: &mut impl Out, tag: u8) -> usize {
    let at = out.len();
    out.put(&[tag, 0, 0, 0, 0]);
    at
}

/// Writes the length of the frame begun at `at`.
pub fn end_frame(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 1) as i32;
    out[at + 1..at + 5].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_whole_frames_only() {
        let mut buf = Vec::new();
        put_frame(&mut buf, b'Q', b"SELECT 1\0");
        let h = next_frame(&buf).unwrap().unwrap();
        assert_eq!((h.tag, h.total), (b'Q', 14));
        assert_eq!(&buf[h.body()], b"SELECT 1\0");
        assert_eq!(next_frame(&buf[..13]).unwrap(), None);
        assert_eq!(next_frame(&buf[..3]).unwrap(), None);
    }

    #[test]
    fn iterates_whole_frames() {
        let mut buf = Vec::new();
        put_frame(&mut buf, b'P', b"x\0");
        put_frame(&mut buf, b'S', b"");
        buf.extend_from_slice(&[b'B', 0, 0]);
        let tags: Vec<u8> = frames(&buf).map(|f| f.unwrap()[0]).collect();
        assert_eq!(tags, b"PS");
        assert!(frames(&[b'Q', 0, 0, 0, 1]).next().unwrap().is_err());
    }

    #[test]
    fn rejects_impossible_lengths() {
        assert!(next_frame(&[b'Q', 0, 0, 0, 3]).is_err());
        assert!(next_frame(&[b'Q', 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(next_frame(&[b'Q', 0x7f, 0, 0, 0]).is_err());
    }

    #[test]
    fn begin_end_frame_matches_put_frame() {
        let mut a = Vec::new();
        put_frame(&mut a, b'C', b"SELECT 1\0");
        let mut b = Vec::new();
        let at = begin_frame(&mut b, b'C');
        b.extend_from_slice(b"SELECT 1\0");
        end_frame(&mut b, at);
        assert_eq!(a, b);
    }
}
