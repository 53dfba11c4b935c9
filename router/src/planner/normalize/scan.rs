//! The scanner behind [`super::normalize`]: one pass over the statement text, following
//! Postgres's lexer (`scan.l`) closely enough to never mistake the inside of a comment, quoted
//! identifier or string for code. It records each literal's span and value and each comment's
//! span in the [`NormalizeBuf`]; the caller assembles the normalized text from them.

use super::{LiteralKind, NormalizeBuf, Span};

pub(super) struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    buf: &'a mut NormalizeBuf,
    /// Whether a `-` here would be a prefix (unary) minus: at the start, after `(`, `,`, an
    /// operator or one of a few reserved keywords.
    unary: bool,
    /// The previous token was `.`, so a keyword here is a column or table label.
    after_dot: bool,
    /// Bound on the normalized text ([`normalize_within`]), and a lower bound of its length up
    /// to the end of the last literal recorded.
    limit: usize,
    kept: usize,
    /// Bytes of the comments since the last literal (each is counted as its one space in
    /// `kept` when it is scanned).
    skipped: usize,
}

/// Byte classes, one table look-up a byte: the scanner runs over every byte of every simple
/// Query, and three range checks a byte for each question cost more than the look-up.
const IDENT_START: u8 = 1;
const IDENT_CONT: u8 = 2;
const OP: u8 = 4;

static CLASS: [u8; 256] = classes();

const fn classes() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphabetic() || b == b'_' || b >= 0x80 {
            t[c] |= IDENT_START | IDENT_CONT;
        }
        if b.is_ascii_digit() || b == b'$' {
            t[c] |= IDENT_CONT;
        }
        if matches!(
            b,
            b'+' | b'-'
                | b'*'
                | b'/'
                | b'<'
                | b'>'
                | b'='
                | b'~'
                | b'!'
                | b'@'
                | b'#'
                | b'%'
                | b'^'
                | b'&'
                | b'|'
                | b'`'
                | b'?'
        ) {
            t[c] |= OP;
        }
        c += 1;
    }
    t
}

fn is_ident_start(c: u8) -> bool {
    CLASS[usize::from(c)] & IDENT_START != 0
}

pub(super) fn is_ident_cont(c: u8) -> bool {
    CLASS[usize::from(c)] & IDENT_CONT != 0
}

fn is_op_char(c: u8) -> bool {
    CLASS[usize::from(c)] & OP != 0
}

/// Whether `word` is a reserved keyword after which `-` can only be a prefix minus. Only
/// reserved words count: an unreserved one could be a column name, as in `SELECT value -1`.
/// Runs for every word of every statement, so it is a length check and one `match`.
fn is_unary_keyword(word: &[u8]) -> bool {
    if !(2..=9).contains(&word.len()) {
        return false;
    }
    let mut lower = [0u8; 9];
    for (l, &c) in lower.iter_mut().zip(word) {
        *l = c.to_ascii_lowercase();
    }
    matches!(
        &lower[..word.len()],
        b"select"
            | b"where"
            | b"and"
            | b"or"
            | b"not"
            | b"then"
            | b"else"
            | b"when"
            | b"case"
            | b"limit"
            | b"offset"
            | b"on"
            | b"having"
            | b"default"
            | b"returning"
            | b"in"
            | b"to"
    )
}

impl<'a> Scanner<'a> {
    /// A scanner of `sql` into `buf` (cleared), stopping past `limit` bytes of normalized text.
    pub(super) fn new(sql: &'a str, buf: &'a mut NormalizeBuf, limit: usize) -> Scanner<'a> {
        Scanner {
            b: sql.as_bytes(),
            i: 0,
            buf,
            unary: true,
            after_dot: false,
            limit,
            kept: 0,
            skipped: 0,
        }
    }
}

impl Scanner<'_> {
    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    pub(super) fn run(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            // Whitespace, a fifth of a typical statement, is passed before anything else is
            // looked at. Like a comment, it does not separate a `.` from the name after it.
            if matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c') {
                self.i += 1;
                continue;
            }
            let next = self.at(self.i + 1);
            let mut dot = false;
            match c {
                b'-' if next == b'-' => {
                    let start = self.i;
                    self.line_comment();
                    self.comment(start);
                    continue;
                }
                b'/' if next == b'*' => {
                    let start = self.i;
                    if self.block_comment() {
                        self.comment(start);
                    }
                    continue;
                }
                b'\'' => {
                    let start = self.i;
                    self.i += 1;
                    self.quoted_string(start, false, true);
                    self.unary = false;
                }
                b'"' => {
                    self.quoted_identifier();
                    self.unary = false;
                }
                b'$' => self.dollar(),
                b'0'..=b'9' => self.number(self.i, self.i),
                b'.' if next.is_ascii_digit() => self.number(self.i, self.i),
                b'.' if next == b'.' => {
                    // `..` (PL/pgSQL ranges) is one token: `1..2` is not `1` and `.2`. A word
                    // right after it counts as after a `.`, as it always has here.
                    dot = true;
                    self.i += 2;
                    self.unary = true;
                }
                b'(' | b',' | b'[' | b';' => {
                    self.i += 1;
                    self.unary = true;
                }
                _ if is_op_char(c) => self.operator(),
                _ if is_ident_start(c) => self.word(),
                _ => {
                    // `)`, `]`, `.`, `:` and anything else end an operand or qualify a name.
                    dot = c == b'.';
                    self.i += 1;
                    self.unary = false;
                }
            }
            self.after_dot = dot;
        }
    }

    /// A comment from `start` to here, kept as one space.
    fn comment(&mut self, start: usize) {
        self.buf.comments.push((start, self.i));
        self.skipped += self.i - start;
        // Its one space counts: a text of millions of comments costs their spans, so it
        // stops at the bound too.
        self.kept = self.kept.saturating_add(1);
        if self.kept > self.limit {
            self.buf.too_long = true;
            self.i = self.b.len();
        }
    }

    fn line_comment(&mut self) {
        while self.i < self.b.len() && self.b[self.i] != b'\n' && self.b[self.i] != b'\r' {
            self.i += 1;
        }
    }

    /// `/* ... */`, which nests in Postgres; an unterminated one runs to the end (and is kept
    /// as it is, for Postgres to report). Whether it was terminated.
    fn block_comment(&mut self) -> bool {
        let mut depth = 0usize;
        while self.i < self.b.len() {
            match (self.b[self.i], self.at(self.i + 1)) {
                (b'/', b'*') => {
                    depth += 1;
                    self.i += 2;
                }
                (b'*', b'/') => {
                    depth -= 1;
                    self.i += 2;
                    if depth == 0 {
                        return true;
                    }
                }
                _ => self.i += 1,
            }
        }
        false
    }

    fn quoted_identifier(&mut self) {
        self.i += 1;
        while self.i < self.b.len() {
            if self.b[self.i] == b'"' {
                if self.at(self.i + 1) == b'"' {
                    self.i += 2;
                    continue;
                }
                self.i += 1;
                return;
            }
            self.i += 1;
        }
    }

    /// A string body from `self.i` (just after the opening quote) to its closing quote;
    /// `start` is where the literal began (its prefix included). `escapes` selects `E'..'`
    /// rules; `record` whether it becomes a placeholder.
    fn quoted_string(&mut self, start: usize, escapes: bool, record: bool) {
        // The value is at most the rest of the text: room for it at once, so that a long one is
        // not copied again and again as the buffer doubles (a no-op once the session's buffer
        // has grown to its statements).
        self.buf.values.reserve(self.b.len() - self.i);
        let value_start = self.buf.values.len();
        let mut ok = true;
        loop {
            let Some(&c) = self.b.get(self.i) else {
                // Unterminated: Postgres will say so; leave the text as it is.
                self.buf.values.truncate(value_start);
                return;
            };
            match c {
                b'\'' if self.at(self.i + 1) == b'\'' => {
                    self.buf.values.push(b'\'');
                    self.i += 2;
                }
                b'\'' => {
                    self.i += 1;
                    break;
                }
                b'\\' if escapes => ok &= self.escape(),
                _ => {
                    self.buf.values.push(c);
                    self.i += 1;
                }
            }
        }
        let valid = std::str::from_utf8(&self.buf.values[value_start..]).is_ok();
        if record && ok && valid {
            self.record(start, self.i, value_start, LiteralKind::String);
        } else {
            self.buf.values.truncate(value_start);
        }
    }

    /// One backslash escape of an `E'..'` string, at `self.i`; false when its value is not
    /// a character (the literal is then left in the text).
    fn escape(&mut self) -> bool {
        let c = self.at(self.i + 1);
        self.i += 2;
        let simple = match c {
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(v) = simple {
            self.buf.values.push(v);
            return true;
        }
        match c {
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match self.at(self.i) {
                        d @ b'0'..=b'7' => {
                            v = v * 8 + u32::from(d - b'0');
                            self.i += 1;
                        }
                        _ => break,
                    }
                }
                // Postgres keeps the low byte of `\777`.
                self.buf.values.push(v as u8);
                true
            }
            b'x' if self.at(self.i).is_ascii_hexdigit() => {
                let v = self.hex_digits(2);
                self.buf.values.push(v as u8);
                true
            }
            b'u' | b'U' => {
                let width = if c == b'u' { 4 } else { 8 };
                let Some(mut code) = self.exact_hex(width) else {
                    return false;
                };
                // A UTF-16 surrogate pair written as two `\u` escapes.
                if (0xd800..0xdc00).contains(&code) {
                    if self.at(self.i) != b'\\' || self.at(self.i + 1) != b'u' {
                        return false;
                    }
                    self.i += 2;
                    match self.exact_hex(4) {
                        Some(low @ 0xdc00..=0xdfff) => {
                            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
                        }
                        _ => return false,
                    }
                }
                match char::from_u32(code) {
                    Some(ch) => {
                        let mut tmp = [0u8; 4];
                        self.buf
                            .values
                            .extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
                        true
                    }
                    None => false,
                }
            }
            0 if self.i > self.b.len() => {
                // A backslash at the very end: the string is unterminated anyway.
                self.i = self.b.len();
                true
            }
            _ => {
                // `\'`, `\\` and any other character stand for themselves; copy a whole
                // UTF-8 sequence, not just its first byte.
                let start = self.i - 1;
                let mut end = self.i;
                while end < self.b.len() && (self.b[end] & 0xc0) == 0x80 {
                    end += 1;
                }
                self.buf.values.extend_from_slice(&self.b[start..end]);
                self.i = end;
                true
            }
        }
    }

    fn hex_digits(&mut self, max: usize) -> u32 {
        let mut v = 0;
        for _ in 0..max {
            match (self.at(self.i) as char).to_digit(16) {
                Some(d) => {
                    v = v * 16 + d;
                    self.i += 1;
                }
                None => break,
            }
        }
        v
    }

    fn exact_hex(&mut self, width: usize) -> Option<u32> {
        let digits = self.b.get(self.i..self.i + width)?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        Some(self.hex_digits(width))
    }

    /// `$n` parameters and `$tag$...$tag$` strings.
    fn dollar(&mut self) {
        let start = self.i;
        if self.at(start + 1).is_ascii_digit() {
            let mut n = 0usize;
            self.i += 1;
            while self.at(self.i).is_ascii_digit() {
                n = n
                    .saturating_mul(10)
                    .saturating_add(usize::from(self.b[self.i] - b'0'));
                self.i += 1;
            }
            self.buf.params_before = self.buf.params_before.max(n);
            self.unary = false;
            return;
        }
        // The tag is an identifier without `$`, possibly empty.
        let mut end = start + 1;
        if is_ident_start(self.at(end)) {
            while is_ident_cont(self.at(end)) && self.at(end) != b'$' {
                end += 1;
            }
        }
        if self.at(end) != b'$' {
            self.i += 1;
            self.unary = false;
            return;
        }
        let delim = &self.b[start..=end];
        let body = end + 1;
        let close = self.b[body..]
            .windows(delim.len())
            .position(|w| w == delim)
            .map(|p| body + p);
        match close {
            Some(close) => {
                let value_start = self.buf.values.len();
                self.buf.values.extend_from_slice(&self.b[body..close]);
                self.i = close + delim.len();
                self.record(start, self.i, value_start, LiteralKind::String);
            }
            // Unterminated: Postgres reports it; nothing after it can be scanned reliably.
            None => self.i = self.b.len(),
        }
        self.unary = false;
    }

    /// A numeric constant whose digits start at `digits`; `start` is where the literal starts
    /// (one byte earlier when a unary minus is folded in).
    fn number(&mut self, start: usize, digits: usize) {
        let mut j = digits;
        while self.at(j).is_ascii_digit() {
            j += 1;
        }
        // `1..5` is an integer followed by `..` (PL/pgSQL ranges), not `1.` then `.5`.
        if self.at(j) == b'.' && self.at(j + 1) != b'.' {
            j += 1;
            while self.at(j).is_ascii_digit() {
                j += 1;
            }
        }
        if matches!(self.at(j), b'e' | b'E') {
            let mut k = j + 1;
            if matches!(self.at(k), b'+' | b'-') {
                k += 1;
            }
            if self.at(k).is_ascii_digit() {
                j = k;
                while self.at(j).is_ascii_digit() {
                    j += 1;
                }
            }
        }
        self.unary = false;
        if is_ident_cont(self.at(j)) {
            // `0x1F`, `1_000`, `123abc`: newer Postgres reads these as one number or rejects
            // them, older ones as a number and an alias. Leave the whole token alone.
            while is_ident_cont(self.at(j)) {
                j += 1;
            }
            self.i = j;
            return;
        }
        let value_start = self.buf.values.len();
        self.buf.values.extend_from_slice(&self.b[start..j]);
        self.i = j;
        self.record(start, j, value_start, LiteralKind::Number);
    }

    /// An operator, split as Postgres splits it: a run of operator characters, cut before any
    /// comment start, with trailing `+`/`-` given back unless the run holds a character that
    /// only multi-character operators use (so `=-1` is `=` then `-1`, but `@-1` is `@-` `1`).
    fn operator(&mut self) {
        let start = self.i;
        let mut end = start;
        while end < self.b.len() && is_op_char(self.b[end]) {
            if end > start && matches!((self.b[end], self.at(end + 1)), (b'-', b'-') | (b'/', b'*'))
            {
                break;
            }
            end += 1;
        }
        let run = &self.b[start..end];
        let special = run.iter().any(|c| {
            matches!(
                c,
                b'~' | b'!' | b'@' | b'#' | b'%' | b'^' | b'&' | b'|' | b'`' | b'?'
            )
        });
        if run.len() > 1 && !special {
            while end > start + 1 && matches!(self.b[end - 1], b'+' | b'-') {
                end -= 1;
            }
        }
        if end == start + 1 && self.b[start] == b'-' && self.unary {
            let next = self.at(end);
            let starts_number =
                next.is_ascii_digit() || (next == b'.' && self.at(end + 1).is_ascii_digit());
            if starts_number && !self.cast_follows(end) {
                self.number(start, end);
                return;
            }
        }
        self.i = end;
        self.unary = true;
    }

    /// Whether the number starting at `digits` is followed by `::`: `-1::text` is
    /// `-(1::text)`, so the minus must stay an operator.
    fn cast_follows(&self, digits: usize) -> bool {
        let mut j = digits;
        while self.at(j).is_ascii_alphanumeric() || matches!(self.at(j), b'.' | b'_') {
            j += 1;
        }
        while self.at(j).is_ascii_whitespace() {
            j += 1;
        }
        self.at(j) == b':' && self.at(j + 1) == b':'
    }

    /// An identifier or keyword, or the prefix of a special string (`E'..'`, `B'..'`, ...).
    fn word(&mut self) {
        let start = self.i;
        let c = self.b[start];
        let next = self.at(start + 1);
        if next == b'\'' {
            match c {
                b'e' | b'E' => {
                    self.i += 2;
                    self.quoted_string(start, true, true);
                    self.unary = false;
                    return;
                }
                // Bit strings and national characters keep their own types: left alone.
                b'b' | b'B' | b'x' | b'X' | b'n' | b'N' => {
                    self.i += 2;
                    self.quoted_string(start, false, false);
                    self.unary = false;
                    return;
                }
                _ => {}
            }
        }
        if matches!(c, b'u' | b'U') && next == b'&' && self.at(start + 2) == b'\'' {
            // U&'..' has its own escapes (and UESCAPE): left alone.
            self.i += 3;
            self.quoted_string(start, false, false);
            self.unary = false;
            return;
        }
        let end = self.b[start..]
            .iter()
            .position(|&c| !is_ident_cont(c))
            .map_or(self.b.len(), |n| start + n);
        self.i = end;
        let word = &self.b[start..end];
        self.unary = !self.after_dot && is_unary_keyword(word);
    }

    fn record(&mut self, start: usize, end: usize, value_start: usize, kind: LiteralKind) {
        // At least the code since the last literal (its comments counted already), then `$n`:
        // once that is past the bound, the whole text is, and the scan stops here.
        let since = start - self.buf.literals.last().map_or(0, |l| l.src.1) - self.skipped;
        self.skipped = 0;
        self.kept = self.kept.saturating_add(since + 2);
        if self.kept > self.limit {
            self.buf.too_long = true;
            self.i = self.b.len();
            return;
        }
        self.buf.literals.push(Span {
            src: (start, end),
            value: (value_start, self.buf.values.len()),
            kind,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_table_says_what_postgres_lexer_says() {
        // scan.l: ident_start [A-Za-z\200-\377_], ident_cont [A-Za-z\200-\377_0-9\$],
        // op_chars [\~\!\@\#\^\&\|\`\?\+\-\*\/\%\<\>\=].
        for c in 0..=255u8 {
            let start = c.is_ascii_alphabetic() || c == b'_' || c >= 0x80;
            assert_eq!(is_ident_start(c), start, "{c}");
            assert_eq!(
                is_ident_cont(c),
                start || c.is_ascii_digit() || c == b'$',
                "{c}"
            );
            assert_eq!(is_op_char(c), b"~!@#^&|`?+-*/%<>=".contains(&c), "{c}");
        }
    }
}
