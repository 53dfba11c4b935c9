//! Raw wire-protocol rows: parsing a RowDescription ('T') body into [`Column`]s, walking the
//! fields of a DataRow ('D') body, and writing both back.
//!
//! Bodies are the bytes after the 1-byte tag and the 4-byte length. Everything here comes from
//! the network, so every length is checked and malformed input is an error, never a panic.

use super::MergeError;

/// One column of a RowDescription, with every field kept so the description can be rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Column name (without the terminating NUL).
    pub name: Vec<u8>,
    /// OID of the table the column comes from, or 0.
    pub table_oid: u32,
    /// Attribute number of the column in that table, or 0.
    pub attr_number: i16,
    /// OID of the column's data type.
    pub type_oid: u32,
    /// The type's size (`pg_type.typlen`), negative for variable-width types.
    pub type_len: i16,
    /// The type modifier (`pg_attribute.atttypmod`), -1 when there is none.
    pub type_modifier: i32,
    /// Whether values are in binary format (format code 1) rather than text (0).
    pub binary: bool,
}

impl Column {
    /// A computed column (no table) of the given type, e.g. for tests or for a column the
    /// router itself produces.
    pub fn new(name: &[u8], type_oid: u32, binary: bool) -> Column {
        Column {
            name: name.to_vec(),
            table_oid: 0,
            attr_number: 0,
            type_oid,
            type_len: super::value::type_len(type_oid),
            type_modifier: -1,
            binary,
        }
    }
}

/// A small cursor over untrusted bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MergeError> {
        if self.buf.len() < n {
            return Err("truncated message from a shard".into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn i16(&mut self) -> Result<i16, MergeError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, MergeError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn cstr(&mut self) -> Result<&'a [u8], MergeError> {
        let end = self
            .buf
            .iter()
            .position(|&c| c == 0)
            .ok_or("unterminated column name in a RowDescription")?;
        let s = &self.buf[..end];
        self.buf = &self.buf[end + 1..];
        Ok(s)
    }
}

/// Parses a RowDescription body.
pub fn columns(row_description_body: &[u8]) -> Result<Vec<Column>, MergeError> {
    let mut r = Reader {
        buf: row_description_body,
    };
    let n = r.i16()?;
    if n < 0 {
        return Err("negative column count in a RowDescription".into());
    }
    let mut cols = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let name = r.cstr()?.to_vec();
        let table_oid = r.i32()? as u32;
        let attr_number = r.i16()?;
        let type_oid = r.i32()? as u32;
        let type_len = r.i16()?;
        let type_modifier = r.i32()?;
        let binary = match r.i16()? {
            0 => false,
            1 => true,
            _ => return Err("unknown format code in a RowDescription".into()),
        };
        cols.push(Column {
            name,
            table_oid,
            attr_number,
            type_oid,
            type_len,
            type_modifier,
            binary,
        });
    }
    if !r.buf.is_empty() {
        return Err("trailing bytes after a RowDescription".into());
    }
    Ok(cols)
}

/// Writes a RowDescription body for `cols`.
pub fn row_description_body(cols: &[Column]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(cols.len() as i16).to_be_bytes());
    for c in cols {
        out.extend_from_slice(&c.name);
        out.push(0);
        out.extend_from_slice(&c.table_oid.to_be_bytes());
        out.extend_from_slice(&c.attr_number.to_be_bytes());
        out.extend_from_slice(&c.type_oid.to_be_bytes());
        out.extend_from_slice(&c.type_len.to_be_bytes());
        out.extend_from_slice(&c.type_modifier.to_be_bytes());
        out.extend_from_slice(&(c.binary as i16).to_be_bytes());
    }
    out
}

/// The fields of a DataRow body, `None` for SQL NULL.
pub fn fields(data_row_body: &[u8]) -> Result<Vec<Option<&[u8]>>, MergeError> {
    let mut r = Reader { buf: data_row_body };
    let n = r.i16()?;
    if n < 0 {
        return Err("negative field count in a DataRow".into());
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        out.push(next_field(&mut r)?);
    }
    if !r.buf.is_empty() {
        return Err("trailing bytes after a DataRow".into());
    }
    Ok(out)
}

/// Field `n` of a DataRow body, without collecting the others (sorting looks at a few
/// key fields of every row, so this avoids an allocation per comparison).
pub fn nth_field(data_row_body: &[u8], n: usize) -> Result<Option<&[u8]>, MergeError> {
    let mut r = Reader { buf: data_row_body };
    let count = r.i16()?;
    if count < 0 || n >= count as usize {
        return Err("a DataRow has fewer fields than its RowDescription".into());
    }
    for _ in 0..n {
        next_field(&mut r)?;
    }
    next_field(&mut r)
}

fn next_field<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, MergeError> {
    match r.i32()? {
        -1 => Ok(None),
        len if len < 0 => Err("negative field length in a DataRow".into()),
        len => Ok(Some(r.take(len as usize)?)),
    }
}

/// Writes a DataRow body.
pub fn data_row_body(fields: &[Option<&[u8]>]) -> Vec<u8> {
    let mut out = Vec::new();
    write_fields(fields, &mut out);
    out
}

/// Appends a whole DataRow frame (tag 'D', length, body) to `out`.
pub fn write_data_row_frame(body: &[u8], out: &mut Vec<u8>) {
    out.push(b'D');
    out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    out.extend_from_slice(body);
}

fn write_fields(fields: &[Option<&[u8]>], out: &mut Vec<u8>) {
    out.extend_from_slice(&(fields.len() as i16).to_be_bytes());
    for f in fields {
        match f {
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(v) => {
                out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                out.extend_from_slice(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_description_round_trips() {
        let cols = vec![
            Column::new(b"id", 23, false),
            Column::new(b"avg", 1700, true),
        ];
        let body = row_description_body(&cols);
        assert_eq!(columns(&body).unwrap(), cols);
        assert!(columns(&body[..body.len() - 1]).is_err());
    }

    #[test]
    fn data_row_fields() {
        let body = data_row_body(&[Some(b"12"), None, Some(b"")]);
        assert_eq!(
            fields(&body).unwrap(),
            vec![Some(&b"12"[..]), None, Some(&b""[..])]
        );
        assert_eq!(nth_field(&body, 1).unwrap(), None);
        assert_eq!(nth_field(&body, 2).unwrap(), Some(&b""[..]));
        assert!(nth_field(&body, 3).is_err());
        assert!(fields(&body[..body.len() - 1]).is_err());
        // A length that runs past the end.
        assert!(fields(&[0, 1, 0, 0, 0, 9, b'x']).is_err());
    }
}
