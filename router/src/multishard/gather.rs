//! One answer from several shards' answers, when rows are concatenated in shard order: the
//! descriptions of the first shard, every shard's rows (at most `limit`), one command tag with
//! the summed row count, and for COPY TO STDOUT one CopyOutResponse and one CopyDone. Sans-IO:
//! frames in, the client's bytes out.
//!
//! In the extended protocol the client also asked for answers to its batch's messages (Parse,
//! Bind, Describe, Close); [`answer_asked`] gives them in order, with the descriptions the
//! first shard sent.

use crate::protocol::backend::{command_of_tag, rows_in_tag};
use crate::protocol::frame::put_frame;
use crate::protocol::reply;

/// Answers to a batch's messages, in order: `P` Parse, `S` Describe statement, `B` Bind, `D`
/// Describe portal, `C` Close; the descriptions are those a shard sent.
pub fn answer_asked(out: &mut Vec<u8>, asked: &[u8], statement_desc: &[u8], portal_desc: &[u8]) {
    for &k in asked {
        match k {
            b'P' => reply::parse_complete(out),
            b'S' => out.extend_from_slice(statement_desc),
            b'B' => reply::bind_complete(out),
            b'D' => out.extend_from_slice(portal_desc),
            b'C' => reply::close_complete(out),
            _ => {}
        }
    }
}

/// What one frame meant.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    More,
    /// The shard's ReadyForQuery: its answer is complete.
    Done,
    /// The shard's ErrorResponse, forwarded: the answer ends here.
    Failed,
}

/// Concatenated answers.
pub struct Concat<'a> {
    /// The extended batch's messages to answer (empty for a simple query).
    asked: &'a [u8],
    /// A line naming each shard, sent as a row before that shard's rows (`EXPLAIN`).
    labels: Option<&'a [String]>,
    /// The shard whose rows come now, and whether its label went out.
    labelled: Option<usize>,
    limit: Option<u64>,
    statement_desc: Vec<u8>,
    portal_desc: Vec<u8>,
    descriptions: usize,
    answered: bool,
    rows: u64,
    /// The shards' command (`SELECT`, `UPDATE`, ...) and the sum of their row counts.
    command: Option<String>,
    /// The command tag ends in a count.
    counted: bool,
    tagged: u64,
    copy_out: bool,
    /// The shards hold the same rows (a write of a reference table): the first shard answers,
    /// the others' command tags must equal its tags ([`Concat::replicas`]).
    replicas: Option<Replicas>,
    /// The client's statement has this many parameters; the shards' has more, the router's
    /// own after them ([`Concat::showing_params`]).
    params_shown: Option<usize>,
}

/// The first shard's command tags, and how many of the current shard's were checked against them.
#[derive(Default)]
struct Replicas {
    tags: Vec<Vec<u8>>,
    shard: usize,
    checked: usize,
}

impl<'a> Concat<'a> {
    pub fn new(asked: &'a [u8], limit: Option<u64>) -> Concat<'a> {
        Concat {
            asked,
            labels: None,
            labelled: None,
            limit,
            statement_desc: Vec::new(),
            portal_desc: Vec::new(),
            descriptions: 0,
            answered: asked.is_empty(),
            rows: 0,
            command: None,
            counted: false,
            tagged: 0,
            copy_out: false,
            replicas: None,
            params_shown: None,
        }
    }

    /// The same statement on shards that hold the same rows: the client gets the first shard's
    /// answer, and a shard whose command tags differ from it (its copy of the table differs)
    /// ends the answer with an error, so that the write is rolled back everywhere.
    pub fn replicas(mut self) -> Concat<'a> {
        self.replicas = Some(Replicas::default());
        self
    }

    /// A frame of a shard after the first, in replicas mode.
    fn replica_frame(&mut self, shard: usize, frame: &[u8], out: &mut Vec<u8>) -> Option<Seen> {
        let r = self.replicas.as_mut()?;
        if shard == 0 {
            if frame[0] == b'C' {
                r.tags.push(frame[5..].to_vec());
            }
            return None;
        }
        if r.shard != shard {
            r.shard = shard;
            r.checked = 0;
        }
        let differs = match frame[0] {
            b'E' => return None,
            b'C' => {
                let same = r.tags.get(r.checked).is_some_and(|t| t[..] == frame[5..]);
                r.checked += 1;
                !same
            }
            b'Z' => r.checked != r.tags.len(),
            _ => return Some(Seen::More),
        };
        if differs {
            crate::protocol::reply::SqlError::new(
                crate::errors::INTERNAL_ERROR,
                "the shards' copies of this reference table differ: the same write changed a different number of rows on one shard than on the first, so it was not applied anywhere",
            )
            .with_hint("compare the table on every shard and make the copies equal again")
            .write(out);
            return Some(Seen::Failed);
        }
        (frame[0] == b'Z')
            .then_some(Seen::Done)
            .or(Some(Seen::More))
    }

    /// Describes the statement with only its first `n` parameters: the shards run it with
    /// more, which the router binds itself (the second stage of a read in two stages).
    pub fn showing_params(mut self, n: usize) -> Concat<'a> {
        self.params_shown = Some(n);
        self
    }

    /// Each shard's rows come under a one-column row `labels[shard]`.
    pub fn with_labels(mut self, labels: &'a [String]) -> Concat<'a> {
        self.labels = Some(labels);
        self
    }

    fn answer(&mut self, out: &mut Vec<u8>) {
        if !self.answered {
            answer_asked(out, self.asked, &self.statement_desc, &self.portal_desc);
            self.answered = true;
        }
    }

    /// One reply frame of shard number `shard` (in the order the shards answer; the first
    /// describes the rows).
    pub fn frame(&mut self, shard: usize, frame: &[u8], out: &mut Vec<u8>) -> Seen {
        if let Some(seen) = self.replica_frame(shard, frame, out) {
            return seen;
        }
        let extended = !self.asked.is_empty();
        let first = shard == 0;
        match frame[0] {
            b'E' => {
                out.extend_from_slice(frame);
                return Seen::Failed;
            }
            b't' if extended && first => match self.params_shown {
                Some(n) => reply::parameter_description(
                    &mut self.statement_desc,
                    frame[7..].chunks_exact(4).take(n),
                ),
                None => self.statement_desc.extend_from_slice(frame),
            },
            b'T' | b'n' if extended && first => {
                if self.descriptions == 0 {
                    self.statement_desc.extend_from_slice(frame);
                } else {
                    self.portal_desc.extend_from_slice(frame);
                }
                self.descriptions += 1;
            }
            b'T' if !extended && first => out.extend_from_slice(frame),
            b'D' => {
                self.answer(out);
                if let Some(label) = self.labels.and_then(|l| l.get(shard)) {
                    if self.labelled != Some(shard) {
                        self.labelled = Some(shard);
                        reply::text_data_row(out, &[Some(label)]);
                        self.rows += 1;
                    }
                }
                if self.limit.is_none_or(|l| self.rows < l) {
                    out.extend_from_slice(frame);
                    self.rows += 1;
                }
            }
            b'C' => {
                let body = &frame[5..];
                self.tagged += rows_in_tag(body);
                if self.command.is_none() {
                    let text = body.strip_suffix(b"\0").unwrap_or(body);
                    self.counted = text.rsplit(|&b| b == b' ').next().is_some_and(|n| {
                        !n.is_empty() && n.iter().all(u8::is_ascii_digit) && n.len() < text.len()
                    });
                    self.command = Some(if self.counted {
                        command_of_tag(body)
                    } else {
                        String::from_utf8_lossy(text).into_owned()
                    });
                }
            }
            // COPY ... TO STDOUT: one CopyOutResponse, every shard's data, one CopyDone.
            b'H' => {
                self.answer(out);
                if first {
                    out.extend_from_slice(frame);
                    self.copy_out = true;
                }
            }
            b'd' => out.extend_from_slice(frame),
            b'Z' => {
                // The first shard has described everything by now.
                self.answer(out);
                return Seen::Done;
            }
            _ => {}
        }
        Seen::More
    }

    /// The end of the answer (without ReadyForQuery): CopyDone, and the command tag. A read's
    /// count is what the client got (a LIMIT may have cut the rows); a write's is the sum.
    pub fn finish(mut self, out: &mut Vec<u8>) {
        self.answer(out);
        if self.copy_out {
            put_frame(out, b'c', &[]);
        }
        match self.command.as_deref() {
            None | Some("SELECT") => reply::command_complete(out, &format!("SELECT {}", self.rows)),
            // A tag without a count (EXPLAIN): as the shards sent it.
            Some(command) if !self.counted => reply::command_complete(out, command),
            Some(command) => reply::command_complete(out, &format!("{command} {}", self.tagged)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::frames;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_frame(&mut v, tag, body);
        v
    }

    fn tags(out: &[u8]) -> String {
        frames(out).map(|f| f.unwrap()[0] as char).collect()
    }

    #[test]
    fn rows_of_every_shard_one_description_one_tag() {
        let mut c = Concat::new(&[], Some(3));
        let mut out = Vec::new();
        for shard in [0, 1] {
            for f in [
                frame(b'T', b"desc"),
                frame(b'D', b"r"),
                frame(b'D', b"r"),
                frame(b'C', b"SELECT 2\0"),
            ] {
                assert_eq!(c.frame(shard, &f, &mut out), Seen::More);
            }
            assert_eq!(c.frame(shard, &frame(b'Z', b"I"), &mut out), Seen::Done);
        }
        c.finish(&mut out);
        assert_eq!(tags(&out), "TDDDC", "one description, the limit of 3 rows");
        assert!(out.ends_with(b"SELECT 3\0"));
    }

    #[test]
    fn extended_answers_come_in_order_with_the_first_shards_descriptions() {
        let mut c = Concat::new(b"PSBD", None);
        let mut out = Vec::new();
        for f in [
            frame(b't', b"\0\0"),
            frame(b'T', b"desc"),
            frame(b'T', b"desc"),
            frame(b'D', b"r"),
            frame(b'C', b"UPDATE 1\0"),
        ] {
            c.frame(0, &f, &mut out);
        }
        c.frame(0, &frame(b'Z', b"I"), &mut out);
        c.frame(1, &frame(b'C', b"UPDATE 4\0"), &mut out);
        c.finish(&mut out);
        assert_eq!(tags(&out), "1tT2TDC");
        assert!(out.ends_with(b"UPDATE 5\0"), "write counts are summed");
    }

    #[test]
    fn explained_plans_come_under_a_line_naming_their_shard() {
        let labels = ["shard -80".to_string(), "shard 80-".to_string()];
        let mut c = Concat::new(&[], None).with_labels(&labels);
        let mut out = Vec::new();
        for shard in [0, 1] {
            for f in [frame(b'T', b"desc"), frame(b'D', b"\0\x01\0\0\0\x04plan")] {
                c.frame(shard, &f, &mut out);
            }
            c.frame(shard, &frame(b'C', b"EXPLAIN\0"), &mut out);
            c.frame(shard, &frame(b'Z', b"I"), &mut out);
        }
        c.finish(&mut out);
        assert_eq!(tags(&out), "TDDDDC");
        assert!(out.ends_with(b"EXPLAIN\0"), "EXPLAIN's tag has no count");
        let rows: Vec<&[u8]> = frames(&out)
            .map(|f| f.unwrap())
            .filter(|f| f[0] == b'D')
            .collect();
        assert!(rows[0].ends_with(b"shard -80") && rows[2].ends_with(b"shard 80-"));
        assert!(rows[1].ends_with(b"plan"));
    }

    #[test]
    fn an_error_ends_the_answer() {
        let mut c = Concat::new(&[], None);
        let mut out = Vec::new();
        assert_eq!(c.frame(0, &frame(b'E', b"x"), &mut out), Seen::Failed);
        assert_eq!(tags(&out), "E");
    }
}
