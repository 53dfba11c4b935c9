//! Literal normalization: statement text → the same text with every constant replaced by `$N`.
//!
//! The plan cache is keyed by the normalized text, so `... WHERE id = 41` and `... WHERE id = 42`
//! share one plan, and the literal values (kept here, in the caller's reusable
//! [`NormalizeBuf`]) say which key this particular statement carries. Normalized text is only a
//! cache key and parser input: the statement sent to Postgres is always the original.
//!
//! The scanner follows Postgres's lexer (`scan.l`) closely enough to never mistake the inside of
//! a comment, quoted identifier or string for code, and assumes `standard_conforming_strings =
//! on` (the default since 9.1): in a plain `'...'` a backslash is an ordinary character. Where it
//! is unsure whether a token is a constant (bit strings, `N'..'`, `U&'..'`, numbers glued to
//! letters) it leaves the token alone: an unreplaced literal costs only plan sharing, while
//! text that no longer parses is handled by the planner's fallback to the original text.
//! Each terminated comment is one space in the normalized text, as it is to Postgres's lexer:
//! statements that differ only in their comments (trace ids appended by an ORM) share a plan,
//! and a long comment costs the parser nothing. The scan itself lives in [`scan`].

mod scan;

use scan::{is_ident_cont, Scanner};

/// What kind of constant a literal was, for callers that care (`5.0` vs `'5.0'`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiteralKind {
    /// An integer or numeric constant, possibly with a unary minus folded in.
    Number,
    /// A string constant: `'..'`, `E'..'` or `$tag$..$tag$`.
    String,
}

#[derive(Clone, Copy, Debug)]
struct Span {
    /// Bytes of the literal in the original text.
    src: (usize, usize),
    /// Bytes of its value in `NormalizeBuf::values`.
    value: (usize, usize),
    kind: LiteralKind,
}

/// Reusable output of [`normalize`]: keep one per session so that, once its buffers have grown
/// to the size of the session's statements, normalizing allocates nothing.
#[derive(Debug, Default)]
pub struct NormalizeBuf {
    text: String,
    /// The values of all literals, back to back (strings unescaped, numbers as written).
    values: Vec<u8>,
    literals: Vec<Span>,
    /// Terminated comments, as byte ranges of the original text: each is one space in the
    /// normalized text (as it is to Postgres's lexer), so statements that differ only in their
    /// comments share a plan and a long comment costs the parser nothing.
    comments: Vec<(usize, usize)>,
    params_before: usize,
    /// The normalized text would be longer than the bound [`normalize_within`] was given:
    /// the scan stopped, and the text and literals are incomplete.
    too_long: bool,
}

impl NormalizeBuf {
    pub fn new() -> NormalizeBuf {
        NormalizeBuf::default()
    }

    /// The normalized text of the last [`normalize`] call.
    pub fn normalized(&self) -> &str {
        &self.text
    }

    /// The highest `$n` parameter that was already in the text (0 when none): literal `i` is
    /// placeholder `$(params_before + i + 1)`.
    pub fn params_before(&self) -> usize {
        self.params_before
    }

    /// Whether the last [`normalize_within`] stopped at its bound (nothing else of this
    /// buffer may then be used).
    pub fn too_long(&self) -> bool {
        self.too_long
    }

    /// Number of literals replaced.
    pub fn literal_count(&self) -> usize {
        self.literals.len()
    }

    /// The value of literal `i` (0-based, in text order).
    pub fn literal(&self, i: usize) -> Option<&str> {
        let span = self.literals.get(i)?;
        // Every value was checked to be UTF-8 when it was recorded.
        std::str::from_utf8(&self.values[span.value.0..span.value.1]).ok()
    }

    /// The kind of literal `i`.
    pub fn literal_kind(&self, i: usize) -> Option<LiteralKind> {
        self.literals.get(i).map(|s| s.kind)
    }

    /// Where literal `i` sits in the original text, as a byte range.
    pub fn literal_source(&self, i: usize) -> Option<std::ops::Range<usize>> {
        self.literals.get(i).map(|s| s.src.0..s.src.1)
    }

    /// Frees what grew beyond `keep` bytes for one long statement.
    pub fn trim(&mut self, keep: usize) {
        if self.text.capacity() > keep {
            self.text = String::new();
        }
        if self.values.capacity() > keep {
            self.values = Vec::new();
        }
        if self.literals.capacity() * std::mem::size_of::<Span>() > keep {
            self.literals = Vec::new();
        }
        if self.comments.capacity() * std::mem::size_of::<(usize, usize)>() > keep {
            self.comments = Vec::new();
        }
    }

    fn clear(&mut self) {
        self.text.clear();
        self.values.clear();
        self.literals.clear();
        self.comments.clear();
        self.params_before = 0;
        self.too_long = false;
    }
}

/// Normalizes `sql` into `buf` and returns the number of parameters already in the text (the
/// highest `$n`). Never fails: text Postgres would reject is passed through as well as it can
/// be, and parsing reports the error.
pub fn normalize(sql: &str, buf: &mut NormalizeBuf) -> usize {
    normalize_within(sql, buf, usize::MAX)
}

/// [`normalize`], but stops as soon as the normalized text would be longer than `limit` bytes
/// ([`NormalizeBuf::too_long`]): a statement of millions of literals then costs neither their
/// spans nor its text (the planner refuses it without parsing).
pub fn normalize_within(sql: &str, buf: &mut NormalizeBuf, limit: usize) -> usize {
    buf.clear();
    let mut scanner = Scanner::new(sql, &mut *buf, limit);
    scanner.run();
    if buf.too_long {
        return buf.params_before;
    }
    // Numbering depends on the highest `$n`, which may come after the first literal, so the
    // text is assembled after the scan from the recorded spans (a copy, not a second scan).
    // A literal glued to a word (`int8'5'`, `'a'b`) gets a space on that side: `int8$1` or
    // `$1b` would read as one identifier or as junk after the parameter, not as two tokens.
    let glued = |at: Option<&u8>| at.is_some_and(|&c| is_ident_cont(c));
    let mut copied = 0;
    let mut comment = 0;
    for (n, lit) in buf.literals.iter().enumerate() {
        push_code(
            &mut buf.text,
            sql,
            copied..lit.src.0,
            &buf.comments,
            &mut comment,
        );
        if glued(buf.text.as_bytes().last()) {
            buf.text.push(' ');
        }
        // `$n` without `fmt`'s machinery: this runs for every literal of every statement.
        buf.text.push('$');
        buf.text
            .push_str(itoa::Buffer::new().format(buf.params_before + n + 1));
        if glued(sql.as_bytes().get(lit.src.1)) {
            buf.text.push(' ');
        }
        copied = lit.src.1;
    }
    push_code(
        &mut buf.text,
        sql,
        copied..sql.len(),
        &buf.comments,
        &mut comment,
    );
    buf.too_long = buf.text.len() > limit;
    buf.params_before
}

/// Appends `sql[range]` (code between two literals) with each of its comments as one space;
/// `next` is the first comment not yet passed.
fn push_code(
    text: &mut String,
    sql: &str,
    range: std::ops::Range<usize>,
    comments: &[(usize, usize)],
    next: &mut usize,
) {
    let mut at = range.start;
    while let Some(&(start, end)) = comments.get(*next).filter(|c| c.0 < range.end) {
        text.push_str(&sql[at..start]);
        text.push(' ');
        at = end;
        *next += 1;
    }
    text.push_str(&sql[at..range.end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(sql: &str) -> (String, Vec<String>, usize) {
        let mut buf = NormalizeBuf::new();
        let before = normalize(sql, &mut buf);
        let lits = (0..buf.literal_count())
            .map(|i| buf.literal(i).unwrap_or("<bad>").to_string())
            .collect();
        (buf.normalized().to_string(), lits, before)
    }

    fn check(sql: &str, text: &str, lits: &[&str]) {
        let (t, l, _) = norm(sql);
        assert_eq!(t, text, "text of {sql:?}");
        assert_eq!(l, lits, "literals of {sql:?}");
    }

    #[test]
    fn replaces_numbers_and_strings() {
        check(
            "SELECT * FROM kv WHERE id = 42 AND name = 'bob'",
            "SELECT * FROM kv WHERE id = $1 AND name = $2",
            &["42", "bob"],
        );
        check(
            "SELECT 1.5, .5, 1e5, 2.5E-3, 7.",
            "SELECT $1, $2, $3, $4, $5",
            &["1.5", ".5", "1e5", "2.5E-3", "7."],
        );
    }

    #[test]
    fn numbering_continues_after_existing_params() {
        let (t, l, before) = norm("SELECT $2, 'a', $1 FROM t WHERE x = 3");
        assert_eq!(t, "SELECT $2, $3, $1 FROM t WHERE x = $4");
        assert_eq!(l, ["a", "3"]);
        assert_eq!(before, 2);
        assert_eq!(norm("SELECT $1").2, 1);
        assert_eq!(norm("SELECT 1").2, 0);
    }

    #[test]
    fn unary_minus_is_folded_but_subtraction_is_not() {
        check(
            "SELECT a-1, a - 1, a -1",
            "SELECT a-$1, a - $2, a -$3",
            &["1", "1", "1"],
        );
        check("WHERE id = -5", "WHERE id = $1", &["-5"]);
        check("WHERE id=-5", "WHERE id=$1", &["-5"]);
        check("WHERE id IN (-1,-2)", "WHERE id IN ($1,$2)", &["-1", "-2"]);
        check("SELECT -1", "SELECT $1", &["-1"]);
        check(
            "SELECT (x)-1, f(x)-2",
            "SELECT (x)-$1, f(x)-$2",
            &["1", "2"],
        );
        check("SELECT 2 - -1", "SELECT $1 - $2", &["2", "-1"]);
        check("SELECT t.and -1", "SELECT t.and -$1", &["1"]);
        // `@-` is one operator: the minus belongs to it.
        check("SELECT x @-1", "SELECT x @-$1", &["1"]);
        // `-1::text` is -(1::text): the minus stays.
        check("SELECT -1::text", "SELECT -$1::text", &["1"]);
        check("WHERE id = - 5", "WHERE id = - $1", &["5"]);
    }

    #[test]
    fn leaves_identifiers_params_and_junk_alone() {
        check(
            "SELECT t1.c2, x$1, \"col 3\" FROM t2",
            "SELECT t1.c2, x$1, \"col 3\" FROM t2",
            &[],
        );
        check("SELECT $1, $12", "SELECT $1, $12", &[]);
        check(
            "SELECT 0x1F, 1_000, 12abc",
            "SELECT 0x1F, 1_000, 12abc",
            &[],
        );
        check("SELECT 1e", "SELECT 1e", &[]);
        check("SELECT 1..2", "SELECT $1..$2", &["1", "2"]);
    }

    #[test]
    fn strings_with_tricky_contents() {
        check("SELECT 'it''s'", "SELECT $1", &["it's"]);
        check(
            "SELECT '-- not a comment; $1 /* */'",
            "SELECT $1",
            &["-- not a comment; $1 /* */"],
        );
        check("SELECT 'a\\'", "SELECT $1", &["a\\"]);
        check("SELECT ''", "SELECT $1", &[""]);
        check("SELECT 'ünïcødé'", "SELECT $1", &["ünïcødé"]);
        let (_, _, before) = norm("SELECT '$9'");
        assert_eq!(before, 0, "a $n inside a string is not a parameter");
    }

    #[test]
    fn e_strings_unescape() {
        check(r"SELECT E'a\'b\\c\nd'", "SELECT $1", &["a'b\\c\nd"]);
        check(
            r"SELECT e'\x41\101\u00e9\U0001F600'",
            "SELECT $1",
            &["AAé😀"],
        );
        check(r"SELECT E'\ud83d\ude00'", "SELECT $1", &["😀"]);
        check(r"SELECT E'it''s \q'", "SELECT $1", &["it's q"]);
        // Invalid UTF-8 from a byte escape: left in the text for Postgres to judge.
        check(r"SELECT E'\xff'", r"SELECT E'\xff'", &[]);
        // An identifier ending in e is not an E-string prefix.
        check("SELECT some'x'", "SELECT some $1", &["x"]);
    }

    #[test]
    fn dollar_quotes() {
        check("SELECT $$it's $1$$", "SELECT $1", &["it's $1"]);
        check(
            "SELECT $fn$ $$ inner $$ $fn$, 2",
            "SELECT $1, $2",
            &[" $$ inner $$ ", "2"],
        );
        check("SELECT $a$x$a$$b$y$b$", "SELECT $1 $2", &["x", "y"]);
        // Unterminated: left alone.
        check("SELECT $q$ oops", "SELECT $q$ oops", &[]);
    }

    #[test]
    fn special_strings_are_left_alone() {
        check(
            "SELECT B'101', X'1F', N'abc', U&'d\\0061t'",
            "SELECT B'101', X'1F', N'abc', U&'d\\0061t'",
            &[],
        );
    }

    #[test]
    fn a_bound_stops_the_scan_before_the_text_passes_it() {
        let list: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
        let sql = format!("SELECT * FROM kv WHERE id IN ({})", list.join(","));
        let mut buf = NormalizeBuf::new();
        normalize_within(&sql, &mut buf, 1000);
        assert!(buf.too_long());
        // Stopped early: about 1000 bytes' worth of literals were recorded, not 10,000.
        assert!(buf.literal_count() < 400, "{}", buf.literal_count());
        // Under the bound, the same as without one; exactly at its length, not too long.
        let mut free = NormalizeBuf::new();
        normalize(&sql, &mut free);
        assert!(!free.too_long());
        normalize_within(&sql, &mut buf, free.normalized().len());
        assert!(!buf.too_long());
        assert_eq!(buf.normalized(), free.normalized());
        assert_eq!(buf.literal_count(), 10_000);
        normalize_within(&sql, &mut buf, free.normalized().len() - 1);
        assert!(buf.too_long());
        // Millions of comments stop it too (each is one space), before their spans pile up;
        // a text just under the bound with comments in it is not refused.
        let comments = format!("SELECT 1 {}", "--\n".repeat(10_000));
        normalize_within(&comments, &mut buf, 1000);
        assert!(
            buf.too_long() && buf.comments.len() <= 1001,
            "{}",
            buf.comments.len()
        );
        let few = format!("SELECT 1 {}", "/* c */ ".repeat(50));
        normalize(&few, &mut free);
        normalize_within(&few, &mut buf, free.normalized().len());
        assert!(!buf.too_long());
        assert_eq!(buf.normalized(), free.normalized());
        // A long literal is not counted: it becomes `$1`.
        let long = format!("SELECT '{}'", "x".repeat(5000));
        normalize_within(&long, &mut buf, 100);
        assert!(!buf.too_long());
        assert_eq!(buf.normalized(), "SELECT $1");
    }

    #[test]
    fn skips_comments_and_quoted_identifiers() {
        // Each terminated comment is one space: what it holds is neither code nor a literal.
        check(
            "SELECT /* 1 /* nested 2 */ 3 */ 4 -- 5 'x\nFROM \"t'1\" WHERE \"a\"\"b\" = 6",
            "SELECT   $1  \nFROM \"t'1\" WHERE \"a\"\"b\" = $2",
            &["4", "6"],
        );
        // Unterminated: left for Postgres to report.
        check(
            "SELECT 1 /* unterminated 2",
            "SELECT $1 /* unterminated 2",
            &["1"],
        );
        check("SELECT 1--2", "SELECT $1 ", &["1"]);
        check("SELECT/**/1", "SELECT $1", &["1"]);
    }

    #[test]
    fn statements_that_differ_only_in_comments_normalize_alike() {
        let (a, _, _) = norm("SELECT v FROM kv WHERE id = 1 /* traceparent='00-ab-01' */");
        let (b, _, _) = norm("SELECT v FROM kv WHERE id = 2 /* traceparent='00-cd-01' */");
        assert_eq!(a, b);
        // A long comment costs the normalized text one byte.
        let long = format!("SELECT 1 /* {} */", "x".repeat(100_000));
        let mut buf = NormalizeBuf::new();
        normalize_within(&long, &mut buf, 1000);
        assert!(!buf.too_long());
        assert_eq!(buf.normalized(), "SELECT $1  ");
    }

    /// Found by fuzzing: a literal glued to a word became part of it (`int8'5'` normalized to
    /// the identifier `int8$1`, so the key was lost and a keyed UPDATE was planned for every
    /// shard).
    #[test]
    fn literals_glued_to_words_stay_tokens_of_their_own() {
        check("SELECT int8'5'", "SELECT int8 $1", &["5"]);
        check("WHERE id = int8'5'", "WHERE id = int8 $1", &["5"]);
        check("SELECT 'a'b", "SELECT $1 b", &["a"]);
        check("SELECT 'a'5", "SELECT $1 $2", &["a", "5"]);
        check("SELECT $1'a'", "SELECT $1 $2", &["a"]);
        let mut buf = NormalizeBuf::new();
        normalize("SELECT date'2020-01-01', x FROM t WHERE a=1", &mut buf);
        let text = buf.normalized().to_string();
        let mut again = NormalizeBuf::new();
        assert_eq!(normalize(&text, &mut again), 2, "{text}");
    }

    #[test]
    fn typed_literals_and_casts() {
        check(
            "SELECT DATE '2020-01-01', '1'::int",
            "SELECT DATE $1, $2::int",
            &["2020-01-01", "1"],
        );
    }

    #[test]
    fn unterminated_string_is_left_as_is() {
        check("SELECT 1, 'abc", "SELECT $1, 'abc", &["1"]);
        check("SELECT E'abc\\", "SELECT E'abc\\", &[]);
    }

    #[test]
    fn multi_statement_numbering_is_global() {
        check("SELECT 1; SELECT 'a'", "SELECT $1; SELECT $2", &["1", "a"]);
    }

    #[test]
    fn buffer_is_reused() {
        let mut buf = NormalizeBuf::new();
        normalize(
            "SELECT 'aaaaaaaaaaaaaaaaaaaaa', 123456789 FROM kv WHERE id = 1",
            &mut buf,
        );
        let caps = (
            buf.text.capacity(),
            buf.values.capacity(),
            buf.literals.capacity(),
        );
        normalize("SELECT 'b', 2 FROM kv WHERE id = 3", &mut buf);
        assert_eq!(
            caps,
            (
                buf.text.capacity(),
                buf.values.capacity(),
                buf.literals.capacity()
            )
        );
        assert_eq!(buf.literal(2), Some("3"));
        assert_eq!(buf.literal(3), None);
        assert_eq!(buf.literal_kind(0), Some(LiteralKind::String));
        assert_eq!(buf.literal_source(1), Some(12..13));
    }
}
