//! COPY data in text or CSV format, sans-IO: the rows of a client's CopyData messages cut out of
//! the byte stream, and the key field of a row read, so that a COPY into a sharded table can
//! send each row's bytes, unchanged, to the shard that owns its key.
//!
//! Rows are never re-encoded: each shard receives exactly the bytes the client sent for its
//! rows, and parses them itself with the same COPY options.

/// How COPY data is written, from the COPY statement's options, and where the key is in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub csv: bool,
    pub delimiter: u8,
    pub quote: u8,
    pub escape: u8,
    pub header: bool,
    /// Position of the sharding key in the column list.
    pub key_index: usize,
    /// Number of columns in the list.
    pub columns: usize,
}

impl Format {
    /// The text format's defaults.
    pub fn text(key_index: usize, columns: usize) -> Format {
        Format {
            csv: false,
            delimiter: b'\t',
            quote: b'"',
            escape: b'"',
            header: false,
            key_index,
            columns,
        }
    }
}

/// Splits a stream of COPY data into rows, across CopyData message boundaries.
#[derive(Debug)]
pub struct Rows {
    format: Format,
    pending: Vec<u8>,
    /// Inside a quoted CSV field at the end of `pending` (scanning resumes there).
    scanned: usize,
    in_quotes: bool,
    /// The text format's end-of-data line `\.` was seen: what follows is ignored.
    pub ended: bool,
}

impl Rows {
    pub fn new(format: Format) -> Rows {
        Rows {
            format,
            pending: Vec::new(),
            scanned: 0,
            in_quotes: false,
            ended: false,
        }
    }

    /// The bytes of the row not yet complete (what a client can make the router hold).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Ignores the rest of the data and frees what is held (the COPY is failing).
    pub fn abandon(&mut self) {
        self.ended = true;
        self.pending = Vec::new();
        self.scanned = 0;
    }

    /// Adds CopyData bytes; calls `row` for every complete row (with its line ending).
    pub fn feed(&mut self, data: &[u8], mut row: impl FnMut(&[u8])) {
        if self.ended {
            return;
        }
        self.pending.extend_from_slice(data);
        let mut start = 0;
        let mut i = self.scanned;
        while i < self.pending.len() {
            let b = self.pending[i];
            if self.format.csv {
                if b == self.format.quote && !self.in_quotes {
                    self.in_quotes = true;
                } else if self.in_quotes
                    && b == self.format.escape
                    && self.format.escape != self.format.quote
                {
                    i += 1; // the escaped character, whatever it is
                } else if self.in_quotes && b == self.format.quote {
                    if self.pending.get(i + 1) == Some(&self.format.quote)
                        && self.format.escape == self.format.quote
                    {
                        i += 1; // a doubled quote inside quotes
                    } else if i + 1 == self.pending.len() && self.format.escape == self.format.quote
                    {
                        // Cannot tell a closing quote from the first of a doubled pair yet.
                        break;
                    } else {
                        self.in_quotes = false;
                    }
                }
            } else if b == b'\\' {
                i += 1; // an escaped character (a backslash-n is data, not a row end)
            }
            if b == b'\n' && !self.in_quotes {
                let line = &self.pending[start..=i];
                if !self.format.csv && (line == b"\\.\n" || line == b"\\.\r\n") {
                    self.ended = true;
                    self.pending.clear();
                    self.scanned = 0;
                    return;
                }
                row(line);
                start = i + 1;
            }
            i += 1;
        }
        self.pending.drain(..start);
        // May point one past the end: an escaping backslash was the last byte, and the byte it
        // escapes is the first of the next chunk.
        self.scanned = i - start;
    }

    /// The bytes of a last row without a line ending (at CopyDone).
    pub fn finish(&mut self, mut row: impl FnMut(&[u8])) {
        if !self.pending.is_empty() && !self.ended {
            let last = std::mem::take(&mut self.pending);
            if !(last == b"\\." || last == b"\\.\r") {
                row(&last);
            }
        }
        self.scanned = 0;
    }
}

/// The sharding key of one row, unescaped; `None` for NULL (or a row too short, which the
/// shard will reject with Postgres's own error).
pub fn key_of(line: &[u8], f: &Format) -> Option<String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if f.csv {
        csv_field(line, f)
    } else {
        text_field(line, f)
    }
}

fn text_field(line: &[u8], f: &Format) -> Option<String> {
    let mut field = 0;
    let mut out = Vec::new();
    let mut i = 0;
    let mut raw_start = 0;
    while i <= line.len() {
        let at_end = i == line.len();
        if at_end || line[i] == f.delimiter {
            if field == f.key_index {
                if &line[raw_start..i] == b"\\N" {
                    return None;
                }
                return String::from_utf8(out).ok();
            }
            field += 1;
            out.clear();
            raw_start = i + 1;
            i += 1;
            continue;
        }
        if line[i] == b'\\' && i + 1 < line.len() {
            let c = line[i + 1];
            i += 2;
            match c {
                b'b' => out.push(8),
                b'f' => out.push(12),
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b't' => out.push(b'\t'),
                b'v' => out.push(11),
                b'0'..=b'7' => {
                    let mut v = u32::from(c - b'0');
                    for _ in 0..2 {
                        match line.get(i) {
                            Some(d @ b'0'..=b'7') => {
                                v = v * 8 + u32::from(d - b'0');
                                i += 1;
                            }
                            _ => break,
                        }
                    }
                    out.push(v as u8);
                }
                b'x' => {
                    let mut v = 0u32;
                    let mut n = 0;
                    while n < 2 {
                        match line.get(i).and_then(|d| (*d as char).to_digit(16)) {
                            Some(d) => {
                                v = v * 16 + d;
                                i += 1;
                                n += 1;
                            }
                            None => break,
                        }
                    }
                    if n == 0 {
                        out.push(b'x');
                    } else {
                        out.push(v as u8);
                    }
                }
                other => out.push(other),
            }
            continue;
        }
        out.push(line[i]);
        i += 1;
    }
    None
}

fn csv_field(line: &[u8], f: &Format) -> Option<String> {
    let mut field = 0;
    let mut out = Vec::new();
    let mut quoted = false;
    let mut was_quoted = false;
    let mut i = 0;
    loop {
        let at_end = i >= line.len();
        if at_end || (!quoted && line[i] == f.delimiter) {
            if field == f.key_index {
                // An unquoted empty field is NULL in CSV (the default NULL string).
                if out.is_empty() && !was_quoted {
                    return None;
                }
                return String::from_utf8(out).ok();
            }
            if at_end {
                return None;
            }
            field += 1;
            out.clear();
            was_quoted = false;
            i += 1;
            continue;
        }
        let b = line[i];
        if quoted {
            if b == f.escape && f.escape != f.quote && line.get(i + 1).is_some() {
                out.push(line[i + 1]);
                i += 2;
                continue;
            }
            if b == f.quote {
                if f.escape == f.quote && line.get(i + 1) == Some(&f.quote) {
                    out.push(f.quote);
                    i += 2;
                    continue;
                }
                quoted = false;
                i += 1;
                continue;
            }
            out.push(b);
        } else if b == f.quote {
            quoted = true;
            was_quoted = true;
        } else {
            out.push(b);
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_of(f: Format, chunks: &[&[u8]]) -> Vec<String> {
        let mut r = Rows::new(f);
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, |row| out.push(String::from_utf8_lossy(row).into_owned()));
        }
        r.finish(|row| out.push(String::from_utf8_lossy(row).into_owned()));
        out
    }

    #[test]
    fn splits_text_rows_across_chunks_and_stops_at_the_end_marker() {
        let f = Format::text(0, 2);
        let rows = rows_of(
            f,
            &[b"1\ta\n2\tb", b" c\\\n", b"d\n3\tx\n\\.\n4\tignored\n"],
        );
        assert_eq!(rows, ["1\ta\n", "2\tb c\\\nd\n", "3\tx\n"]);
        // A chunk that ends right after an escaping backslash.
        let rows = rows_of(f, &[b"5\tp\\", b"\nq\n6\tr\n"]);
        assert_eq!(rows, ["5\tp\\\nq\n", "6\tr\n"]);
    }

    #[test]
    fn splits_csv_rows_with_quoted_newlines_and_doubled_quotes() {
        let f = Format {
            csv: true,
            delimiter: b',',
            ..Format::text(1, 2)
        };
        let rows = rows_of(f, &[b"a,\"x\ny\"\nb,\"say \"", b"\"hi\"\"\"\nc,3"]);
        assert_eq!(rows, ["a,\"x\ny\"\n", "b,\"say \"\"hi\"\"\"\n", "c,3"]);
    }

    #[test]
    fn reads_key_fields() {
        let t = Format::text(1, 3);
        assert_eq!(key_of(b"x\t42\ty\n", &t).as_deref(), Some("42"));
        assert_eq!(
            key_of(b"x\ta\\tb\\\\c\\101\\x41\ty\r\n", &t).as_deref(),
            Some("a\tb\\cAA")
        );
        assert_eq!(key_of(b"x\t\\N\ty\n", &t), None);
        let c = Format {
            csv: true,
            delimiter: b',',
            ..Format::text(0, 2)
        };
        assert_eq!(key_of(b"\"a,\"\"b\",1\n", &c).as_deref(), Some("a,\"b"));
        assert_eq!(key_of(b",1\n", &c), None);
        assert_eq!(key_of(b"\"\",1\n", &c).as_deref(), Some(""));
        assert_eq!(key_of(b"17,x", &c).as_deref(), Some("17"));
    }
}
