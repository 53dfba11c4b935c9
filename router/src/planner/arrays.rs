//! One-dimensional array values, in Postgres's text (`{1,"a b",NULL}`) and binary
//! (`array_send`) formats: their elements, and the array of some of them, written in the same
//! format. This is what splits `INSERT ... SELECT * FROM UNNEST($1::bigint[], $2::text[])` by
//! shard: each shard is sent, for every array, only the elements of its rows.
//!
//! An element is kept exactly as the client wrote it (quotes, escapes, binary bytes), so a part
//! of an array means to Postgres what those elements meant in the whole. Multi-dimensional
//! arrays are refused: UNNEST flattens them, and which element becomes which row would then
//! depend on the shape.
//!
//! Sans-IO: bytes in, bytes out.

use std::ops::Range;

use crate::protocol::frontend::Format;

/// An array value's elements.
#[derive(Debug, PartialEq, Eq)]
pub struct Elements<'a> {
    format: Format,
    /// The binary format's element type OID (0 in text format).
    elem_oid: u32,
    /// Each element as written (`None`: NULL); in text format, with its quotes.
    raw: Vec<Option<&'a [u8]>>,
}

impl<'a> Elements<'a> {
    /// The elements of `value`, a one-dimensional array in `format`.
    pub fn parse(format: Format, value: &'a [u8]) -> Result<Elements<'a>, String> {
        match format {
            Format::Text => text_elements(value),
            Format::Binary => binary_elements(value),
        }
    }

    /// The element type OID of a binary array (0 for text).
    pub fn elem_oid(&self) -> u32 {
        self.elem_oid
    }

    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Element `i`'s value for a key: the text (unquoted, unescaped) or the binary bytes;
    /// `None` for NULL.
    pub fn value(&self, i: usize) -> Option<Vec<u8>> {
        let raw = self.raw.get(i).copied().flatten()?;
        Some(match self.format {
            Format::Binary => raw.to_vec(),
            Format::Text => unquote(raw),
        })
    }

    /// The array of the elements `pick` (indices, in the order given), in this value's format.
    pub fn pick(&self, pick: &[usize]) -> Vec<u8> {
        let chosen = pick.iter().filter_map(|&i| self.raw.get(i).copied());
        match self.format {
            Format::Text => {
                let mut out = b"{".to_vec();
                for (n, e) in chosen.enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(e.unwrap_or(b"NULL"));
                }
                out.push(b'}');
                out
            }
            Format::Binary => {
                let chosen: Vec<Option<&[u8]>> = chosen.collect();
                let mut out = Vec::with_capacity(
                    20 + chosen.iter().flatten().map(|e| e.len() + 4).sum::<usize>(),
                );
                if chosen.is_empty() {
                    // Postgres sends an empty array with no dimensions.
                    out.extend_from_slice(&0i32.to_be_bytes());
                    out.extend_from_slice(&0i32.to_be_bytes());
                    out.extend_from_slice(&self.elem_oid.to_be_bytes());
                    return out;
                }
                out.extend_from_slice(&1i32.to_be_bytes());
                out.extend_from_slice(&i32::from(chosen.iter().any(Option::is_none)).to_be_bytes());
                out.extend_from_slice(&self.elem_oid.to_be_bytes());
                out.extend_from_slice(&(chosen.len() as i32).to_be_bytes());
                out.extend_from_slice(&1i32.to_be_bytes());
                for e in chosen {
                    match e {
                        Some(bytes) => {
                            out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                            out.extend_from_slice(bytes);
                        }
                        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                    }
                }
                out
            }
        }
    }
}

fn binary_elements(value: &[u8]) -> Result<Elements<'_>, String> {
    let bad = |what: &str| format!("malformed binary array: {what}");
    let mut at = 0usize;
    let int = |at: &mut usize| -> Result<i32, String> {
        let b = value
            .get(*at..*at + 4)
            .ok_or_else(|| bad("it ends early"))?;
        *at += 4;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let ndim = int(&mut at)?;
    let _flags = int(&mut at)?;
    let elem_oid = int(&mut at)? as u32;
    let count = match ndim {
        0 => 0,
        1 => {
            let len = int(&mut at)?;
            let _lbound = int(&mut at)?;
            usize::try_from(len).map_err(|_| bad("a negative dimension"))?
        }
        n if n > 1 => return Err(format!("an array of {n} dimensions cannot be split into rows by shard; send a one-dimensional array")),
        _ => return Err(bad("a negative number of dimensions")),
    };
    let mut raw = Vec::with_capacity(count.min(value.len() / 4));
    for _ in 0..count {
        let len = int(&mut at)?;
        if len < 0 {
            raw.push(None);
            continue;
        }
        let len = len as usize;
        let bytes = value
            .get(at..at + len)
            .ok_or_else(|| bad("an element is cut off"))?;
        at += len;
        raw.push(Some(bytes));
    }
    if at != value.len() {
        return Err(bad("bytes after the last element"));
    }
    Ok(Elements {
        format: Format::Binary,
        elem_oid,
        raw,
    })
}

fn text_elements(value: &[u8]) -> Result<Elements<'_>, String> {
    let bad = || {
        format!(
            "malformed array literal: \"{}\"",
            String::from_utf8_lossy(value)
        )
    };
    let mut at = skip_space(value, 0);
    if value.get(at) == Some(&b'[') {
        // Explicit bounds (`[0:2]={...}`): UNNEST does not use them.
        let eq = value[at..]
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(bad)?;
        at = skip_space(value, at + eq + 1);
    }
    if value.get(at) != Some(&b'{') {
        return Err(bad());
    }
    at = skip_space(value, at + 1);
    let mut raw = Vec::new();
    if value.get(at) == Some(&b'}') {
        at += 1;
    } else {
        loop {
            let (element, escaped) = element_end(value, at).ok_or_else(bad)?;
            let text = trim(value, element.clone(), escaped);
            if text.is_empty() {
                return Err(bad());
            }
            let bytes = &value[text];
            raw.push((!bytes.eq_ignore_ascii_case(b"NULL")).then_some(bytes));
            at = skip_space(value, element.end);
            match value.get(at) {
                Some(b',') => at = skip_space(value, at + 1),
                Some(b'}') => {
                    at += 1;
                    break;
                }
                _ => return Err(bad()),
            }
        }
    }
    if skip_space(value, at) != value.len() {
        return Err(bad());
    }
    Ok(Elements {
        format: Format::Text,
        elem_oid: 0,
        raw,
    })
}

/// The span of the element starting at `at`: a quoted string (quotes included) or unquoted
/// text up to a `,` or `}`, and where its last escaped byte ends (trailing blanks before that
/// are the element's own). `None` for a nested array or an unterminated element.
fn element_end(value: &[u8], at: usize) -> Option<(Range<usize>, usize)> {
    let mut i = at;
    match value.get(i)? {
        b'{' => None,
        b'"' => {
            i += 1;
            loop {
                match value.get(i)? {
                    b'\\' => i += 2,
                    b'"' => return Some((at..i + 1, i + 1)),
                    _ => i += 1,
                }
            }
        }
        _ => {
            let mut escaped = at;
            while let Some(&b) = value.get(i) {
                match b {
                    b',' | b'}' => break,
                    b'{' | b'"' => return None,
                    b'\\' => {
                        i += 2;
                        escaped = i;
                    }
                    _ => i += 1,
                }
            }
            (i <= value.len()).then_some((at..i, escaped))
        }
    }
}

/// An element's value: quotes removed, backslash escapes resolved.
fn unquote(raw: &[u8]) -> Vec<u8> {
    let inner = match raw {
        [b'"', inner @ .., b'"'] => inner,
        _ => raw,
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        if b == b'\\' {
            if let Some(&next) = bytes.next() {
                out.push(next);
            }
        } else {
            out.push(b);
        }
    }
    out
}

fn skip_space(value: &[u8], mut at: usize) -> usize {
    while value.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

fn trim(value: &[u8], mut r: Range<usize>, escaped: usize) -> Range<usize> {
    while r.start < r.end && value[r.start].is_ascii_whitespace() {
        r.start += 1;
    }
    // Trailing blanks of an unquoted element are not part of it, unless escaped; a quoted one
    // ends at its quote.
    while r.end > r.start.max(escaped) && value[r.end - 1].is_ascii_whitespace() {
        r.end -= 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &str) -> Elements<'_> {
        Elements::parse(Format::Text, v.as_bytes()).unwrap()
    }

    #[test]
    fn text_arrays_split_as_written() {
        let a = text(r#"{1, "b c" ,NULL,"q\"x",d\,e}"#);
        assert_eq!(a.len(), 5);
        assert_eq!(a.value(0), Some(b"1".to_vec()));
        assert_eq!(a.value(1), Some(b"b c".to_vec()));
        assert_eq!(a.value(2), None);
        assert_eq!(a.value(3), Some(b"q\"x".to_vec()));
        assert_eq!(a.value(4), Some(b"d,e".to_vec()));
        assert_eq!(a.pick(&[3, 2, 0]), br#"{"q\"x",NULL,1}"#.to_vec());
        assert_eq!(a.pick(&[]), b"{}".to_vec());
        assert_eq!(text("[3:4]={7,8}").pick(&[1]), b"{8}".to_vec());
        assert!(text("{}").is_empty());
        assert_eq!(text(r#"{"NULL"}"#).value(0), Some(b"NULL".to_vec()));
        // An escaped blank at the end is the element's.
        let a = text(r"{a\ ,b,c\\ }");
        assert_eq!(a.value(0), Some(b"a ".to_vec()));
        assert_eq!(a.value(2), Some(b"c\\".to_vec()));
        assert_eq!(a.pick(&[0, 2]), br"{a\ ,c\\}".to_vec());
    }

    #[test]
    fn bad_text_arrays_are_errors() {
        for bad in [
            "",
            "1,2",
            "{1,,2}",
            "{{1},{2}}",
            r#"{"open}"#,
            "{1} x",
            "{1,2",
        ] {
            assert!(
                Elements::parse(Format::Text, bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
    }

    fn binary(elems: &[Option<&[u8]>]) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [
            1i32,
            i32::from(elems.iter().any(Option::is_none)),
            20,
            elems.len() as i32,
            1,
        ] {
            v.extend_from_slice(&x.to_be_bytes());
        }
        for e in elems {
            match e {
                Some(b) => {
                    v.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    v.extend_from_slice(b);
                }
                None => v.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        v
    }

    #[test]
    fn binary_arrays_split_and_rebuild() {
        let one = 1i64.to_be_bytes();
        let two = 2i64.to_be_bytes();
        let whole = binary(&[Some(&one), None, Some(&two)]);
        let a = Elements::parse(Format::Binary, &whole).unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a.value(2), Some(two.to_vec()));
        assert_eq!(a.pick(&[0, 1, 2]), whole);
        assert_eq!(a.pick(&[2]), binary(&[Some(&two)]));
        let empty = a.pick(&[]);
        assert!(Elements::parse(Format::Binary, &empty).unwrap().is_empty());
        assert!(Elements::parse(Format::Binary, &whole[..whole.len() - 1]).is_err());
        let mut two_dims = whole.clone();
        two_dims[3] = 2;
        assert!(Elements::parse(Format::Binary, &two_dims).is_err());
    }
}
