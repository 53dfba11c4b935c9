//! The messages a client sends after startup, read in place from their frame bodies.
//!
//! Only what routing needs is decoded: statement and portal names, the SQL text, parameter
//! values of Bind (to find the sharding key). Everything borrows from the frame.

/// A protocol violation by the client; answered with SQLSTATE 08P01.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {message} message: {why}")]
pub struct Malformed {
    pub message: &'static str,
    pub why: &'static str,
}

/// A cursor over a message body.
pub struct Reader<'a> {
    buf: &'a [u8],
    message: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], message: &'static str) -> Reader<'a> {
        Reader { buf, message }
    }

    fn bad(&self, why: &'static str) -> Malformed {
        Malformed {
            message: self.message,
            why,
        }
    }

    /// A NUL-terminated string, as UTF-8.
    pub fn cstr(&mut self) -> Result<&'a str, Malformed> {
        let nul = memchr::memchr(0, self.buf)
            .ok_or_else(|| self.bad("a string is not NUL-terminated"))?;
        let s = std::str::from_utf8(&self.buf[..nul])
            .map_err(|_| self.bad("a string is not valid UTF-8"))?;
        self.buf = &self.buf[nul + 1..];
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8, Malformed> {
        let (&b, rest) = self
            .buf
            .split_first()
            .ok_or_else(|| self.bad("it ends early"))?;
        self.buf = rest;
        Ok(b)
    }

    pub fn i16(&mut self) -> Result<i16, Malformed> {
        let b = self.bytes(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub fn i32(&mut self) -> Result<i32, Malformed> {
        let b = self.bytes(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.buf.len() < n {
            return Err(self.bad("it ends early"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// A count field: non-negative i16.
    pub fn count(&mut self) -> Result<usize, Malformed> {
        let n = self.i16()?;
        usize::try_from(n).map_err(|_| self.bad("a count is negative"))
    }

    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    pub fn finish(&self) -> Result<(), Malformed> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.bad("it has trailing bytes"))
        }
    }
}

/// The `nth` NUL-terminated string of `body` (from 0), as bytes, without decoding or
/// validating anything else: names read back from a message the router wrote itself.
pub fn nth_cstr(body: &[u8], nth: usize) -> Option<&[u8]> {
    let mut parts = body.splitn(nth + 2, |&b| b == 0);
    let s = parts.nth(nth)?;
    // Only a string followed by its NUL counts.
    parts.next().map(|_| s)
}

/// `Q`: a simple query.
pub fn query(body: &[u8]) -> Result<&str, Malformed> {
    let mut r = Reader::new(body, "Query");
    let sql = r.cstr()?;
    r.finish()?;
    Ok(sql)
}

/// `P`: Parse.
#[derive(Debug, Clone, Copy)]
pub struct Parse<'a> {
    pub name: &'a str,
    pub sql: &'a str,
    /// The raw parameter type OIDs (count-prefixed), kept as bytes to re-send unchanged.
    pub param_types: &'a [u8],
}

pub fn parse(body: &[u8]) -> Result<Parse<'_>, Malformed> {
    let mut r = Reader::new(body, "Parse");
    let name = r.cstr()?;
    let sql = r.cstr()?;
    let param_types = r.rest();
    let n = r.count()?;
    r.bytes(4 * n)?;
    r.finish()?;
    Ok(Parse {
        name,
        sql,
        param_types,
    })
}

/// `B`: Bind. Parameter values are found lazily with [`Bind::param`].
#[derive(Debug, Clone, Copy)]
pub struct Bind<'a> {
    pub portal: &'a str,
    pub statement: &'a str,
    /// Everything after the statement name, re-sent unchanged when the name is rewritten.
    pub tail: &'a [u8],
    formats: &'a [u8],
    params: &'a [u8],
    pub param_count: usize,
    /// The result format section (count + codes), validated.
    result_formats: &'a [u8],
}

/// A parameter value's format code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Binary,
}

pub fn bind(body: &[u8]) -> Result<Bind<'_>, Malformed> {
    let mut r = Reader::new(body, "Bind");
    let portal = r.cstr()?;
    let statement = r.cstr()?;
    let tail = r.rest();
    let nfmt = r.count()?;
    let formats = r.bytes(2 * nfmt)?;
    let param_count = r.count()?;
    let params = r.rest();
    for _ in 0..param_count {
        let len = r.i32()?;
        if len > 0 {
            r.bytes(len as usize)?;
        } else if len < -1 {
            return Err(Malformed {
                message: "Bind",
                why: "a parameter length is negative",
            });
        }
    }
    let result_formats = r.rest();
    let nres = r.count()?;
    r.bytes(2 * nres)?;
    r.finish()?;
    if nfmt > 1 && nfmt != param_count {
        return Err(Malformed {
            message: "Bind",
            why:
                "the number of parameter formats matches neither 0, 1 nor the number of parameters",
        });
    }
    Ok(Bind {
        portal,
        statement,
        tail,
        formats,
        params,
        param_count,
        result_formats,
    })
}

impl<'a> Bind<'a> {
    /// Whether result column `index` is requested in binary format.
    pub fn result_binary(&self, index: usize) -> bool {
        let n = i16::from_be_bytes([self.result_formats[0], self.result_formats[1]]) as usize;
        let code_at = |i: usize| {
            i16::from_be_bytes([
                self.result_formats[2 + 2 * i],
                self.result_formats[3 + 2 * i],
            ])
        };
        match n {
            0 => false,
            1 => code_at(0) == 1,
            _ if index < n => code_at(index) == 1,
            _ => false,
        }
    }

    /// Everything after the statement name up to the result formats (parameter formats and
    /// values), for re-sending the Bind with other result formats.
    pub fn without_result_formats(&self) -> &'a [u8] {
        &self.tail[..self.tail.len() - self.result_formats.len()]
    }

    /// The result format section (count and codes), as the client sent it.
    pub fn result_formats(&self) -> &'a [u8] {
        self.result_formats
    }

    /// How many result format codes the Bind gives: 0 (all text), 1 (one for all columns), or
    /// one per column.
    pub fn result_format_count(&self) -> usize {
        i16::from_be_bytes([self.result_formats[0], self.result_formats[1]]) as usize
    }

    /// Parameter `index`: its format and its value (`None` for NULL).
    pub fn param(&self, index: usize) -> Option<(Format, Option<&'a [u8]>)> {
        if index >= self.param_count {
            return None;
        }
        let code = match self.formats.len() / 2 {
            0 => 0,
            1 => i16::from_be_bytes([self.formats[0], self.formats[1]]),
            _ => i16::from_be_bytes([self.formats[2 * index], self.formats[2 * index + 1]]),
        };
        let format = if code == 1 {
            Format::Binary
        } else {
            Format::Text
        };
        // Validated in `bind`, so the walk cannot run off the end.
        let mut at = 0;
        let mut value = None;
        for i in 0..=index {
            let len = i32::from_be_bytes(self.params.get(at..at + 4)?.try_into().ok()?);
            at += 4;
            let v = if len < 0 {
                None
            } else {
                let v = self.params.get(at..at + len as usize)?;
                at += len as usize;
                Some(v)
            };
            if i == index {
                value = v;
            }
        }
        Some((format, value))
    }
}

/// `D` and `C`: Describe or Close of a statement (`S`) or portal (`P`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub kind: u8,
    pub name: &'a str,
}

/// An Execute: its portal and its row limit (0: all rows).
pub fn execute_target(body: &[u8]) -> Result<(&str, i32), Malformed> {
    let mut r = Reader::new(body, "Execute");
    let portal = r.cstr()?;
    let max_rows = r.i32()?;
    r.finish()?;
    Ok((portal, max_rows))
}

pub fn target<'a>(body: &'a [u8], message: &'static str) -> Result<Target<'a>, Malformed> {
    let mut r = Reader::new(body, message);
    let kind = r.u8()?;
    if kind != b'S' && kind != b'P' {
        return Err(Malformed {
            message,
            why: "the target is neither 'S' nor 'P'",
        });
    }
    let name = r.cstr()?;
    r.finish()?;
    Ok(Target { kind, name })
}

/// A Bind body for tests: portal, statement, parameter format codes, parameter values (`None`
/// is NULL), no result format codes.
#[cfg(test)]
pub(crate) fn bind_body(
    portal: &str,
    statement: &str,
    formats: &[i16],
    params: &[Option<&[u8]>],
) -> Vec<u8> {
    let mut b = format!("{portal}\0{statement}\0").into_bytes();
    b.extend_from_slice(&(formats.len() as i16).to_be_bytes());
    for f in formats {
        b.extend_from_slice(&f.to_be_bytes());
    }
    b.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        match p {
            None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(v) => {
                b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                b.extend_from_slice(v);
            }
        }
    }
    b.extend_from_slice(&0i16.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_cstr_reads_only_terminated_strings() {
        let body = b"portal\0sg_7\0\0\x01";
        assert_eq!(nth_cstr(body, 0), Some(&b"portal"[..]));
        assert_eq!(nth_cstr(body, 1), Some(&b"sg_7"[..]));
        assert_eq!(nth_cstr(body, 2), Some(&b""[..]));
        assert_eq!(nth_cstr(body, 3), None, "the bytes after the last NUL");
        assert_eq!(nth_cstr(b"no nul", 0), None);
    }

    #[test]
    fn reads_bind_parameters() {
        let body = bind_body(
            "portal",
            "stmt",
            &[0, 1],
            &[Some(b"42"), Some(&7i64.to_be_bytes())],
        );
        let b = bind(&body).unwrap();
        assert_eq!(
            (b.portal, b.statement, b.param_count),
            ("portal", "stmt", 2)
        );
        assert_eq!(b.param(0), Some((Format::Text, Some(&b"42"[..]))));
        assert_eq!(
            b.param(1),
            Some((Format::Binary, Some(&7i64.to_be_bytes()[..])))
        );
        assert_eq!(b.param(2), None);
        let body = bind_body("portal", "stmt", &[1], &[None, Some(b"x")]);
        let b = bind(&body).unwrap();
        assert_eq!(b.param(0), Some((Format::Binary, None)));
        assert_eq!(b.param(1), Some((Format::Binary, Some(&b"x"[..]))));
    }

    #[test]
    fn rejects_malformed_binds() {
        let mut body = bind_body("portal", "stmt", &[], &[Some(b"42")]);
        body.truncate(body.len() - 4);
        assert!(bind(&body).is_err());
        assert!(bind(&bind_body("portal", "stmt", &[0, 0, 0], &[Some(b"1")])).is_err());
        assert!(bind(b"no nul").is_err());
    }

    #[test]
    fn reads_parse_and_targets() {
        let mut body = b"s1\0SELECT $1\0".to_vec();
        body.extend_from_slice(&1i16.to_be_bytes());
        body.extend_from_slice(&20i32.to_be_bytes());
        let p = parse(&body).unwrap();
        assert_eq!((p.name, p.sql, p.param_types.len()), ("s1", "SELECT $1", 6));
        assert!(parse(b"s1\0SELECT 1\0\x00\x02\0\0\0\x14").is_err());
        assert_eq!(
            target(b"Sname\0", "Close").unwrap(),
            Target {
                kind: b'S',
                name: "name"
            }
        );
        assert!(target(b"Xname\0", "Close").is_err());
        assert_eq!(query(b"SELECT 1\0").unwrap(), "SELECT 1");
        assert!(query(b"SELECT 1").is_err());
    }
}
