//! A read across shards merged a few rows at a time, for a cursor that spans shards: each
//! shard runs the cursor's query as a cursor of its own, and the router asks the shards for
//! rows (`FETCH FORWARD k`) only as the client's FETCHes need them. Rows are concatenated in
//! shard order, or, for `ORDER BY`, k-way merged as [`super::merged`] merges a read; `OFFSET`
//! and `LIMIT` apply to the merged rows. What the router holds is at most one batch of rows
//! per shard.
//!
//! Sans-IO: [`Stepwise::step`] says which shards it needs rows from, the caller asks them and
//! [`Stepwise::feed`]s their answers.

use std::collections::VecDeque;

use crate::merge::{self, Column, MergeError, SortKey};
use crate::protocol::frame::frames;

/// What the merge can do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The next row (a whole DataRow frame).
    Row(Vec<u8>),
    /// Rows are needed from these shards (indices into the cursor's shards) first.
    Need(Vec<usize>),
    /// No more rows.
    End,
}

pub struct Stepwise {
    rows: Vec<VecDeque<Vec<u8>>>,
    /// The shard said it has no more rows.
    done: Vec<bool>,
    /// `ORDER BY` keys and the columns they refer to; `None`: shard order.
    order: Option<(Vec<SortKey>, Vec<Column>)>,
    /// Merged rows still to skip (`OFFSET`).
    skip: u64,
    /// Merged rows still to give (`LIMIT`).
    left: Option<u64>,
    /// The rows and bytes the shards sent so far, for the size of the next batch.
    fed: (u64, u64),
    /// A row taken and given back ([`Stepwise::unstep`]): the next one out.
    back: Option<Vec<u8>>,
}

/// About how many bytes of rows one shard is asked for at a time, once the rows' size is known.
const BATCH_BYTES: u64 = 256 * 1024;

impl Stepwise {
    pub fn new(
        shards: usize,
        order: Option<(Vec<SortKey>, Vec<Column>)>,
        offset: u64,
        limit: Option<u64>,
    ) -> Stepwise {
        Stepwise {
            rows: vec![VecDeque::new(); shards],
            done: vec![false; shards],
            order,
            skip: offset,
            left: limit,
            fed: (0, 0),
            back: None,
        }
    }

    /// How many rows each shard is asked for when `wanted` more rows are to come out.
    pub fn batch(&self, wanted: u64) -> u64 {
        // A sorted merge needs a row of every shard for each row out; asking a few more than
        // one at a time saves round trips. What the router holds is bounded by rows (100 until
        // their size is known) and by about BATCH_BYTES a shard.
        let least = if self.order.is_some() { 8 } else { 1 };
        let most = match self.fed {
            (rows, bytes) if rows > 0 => (BATCH_BYTES * rows / bytes.max(1)).clamp(1, 1000),
            _ => 100,
        };
        wanted
            .saturating_add(self.skip)
            .min(most)
            .max(least.min(most))
    }

    pub fn step(&mut self) -> Result<Step, MergeError> {
        if let Some(row) = self.back.take() {
            if let Some(left) = &mut self.left {
                *left = left.saturating_sub(1);
            }
            return Ok(Step::Row(row));
        }
        loop {
            if self.left == Some(0) {
                return Ok(Step::End);
            }
            let from = match &self.order {
                Some((keys, columns)) => {
                    let need: Vec<usize> = (0..self.rows.len())
                        .filter(|&i| !self.done[i] && self.rows[i].is_empty())
                        .collect();
                    if !need.is_empty() {
                        return Ok(Step::Need(need));
                    }
                    // The lowest shard among equal keys first, as the merged read does.
                    let mut best: Option<usize> = None;
                    for (i, q) in self.rows.iter().enumerate() {
                        let Some(row) = q.front() else { continue };
                        let better = match best.and_then(|b| self.rows[b].front()) {
                            None => true,
                            Some(current) => {
                                merge::compare_rows(&row[5..], &current[5..], keys, columns)?
                                    .is_lt()
                            }
                        };
                        if better {
                            best = Some(i);
                        }
                    }
                    match best {
                        Some(i) => i,
                        None => return Ok(Step::End),
                    }
                }
                None => {
                    let Some(i) =
                        (0..self.rows.len()).find(|&i| !(self.done[i] && self.rows[i].is_empty()))
                    else {
                        return Ok(Step::End);
                    };
                    if self.rows[i].is_empty() {
                        return Ok(Step::Need(vec![i]));
                    }
                    i
                }
            };
            let Some(row) = self.rows[from].pop_front() else {
                continue;
            };
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            if let Some(left) = &mut self.left {
                *left -= 1;
            }
            return Ok(Step::Row(row));
        }
    }

    /// Gives back the row the last [`Stepwise::step`] returned: it comes out next (to learn
    /// whether any row is left without losing it).
    pub fn unstep(&mut self, row: Vec<u8>) {
        if let Some(left) = &mut self.left {
            *left += 1;
        }
        self.back = Some(row);
    }

    /// Shard `i`'s answer to a FETCH of `asked` rows: its DataRows are buffered, and fewer than
    /// asked means it has no more. `Err` with the shard's ErrorResponse frame.
    pub fn feed(&mut self, i: usize, answer: &[u8], asked: u64) -> Result<(), Vec<u8>> {
        let mut got = 0u64;
        for frame in frames(answer).map_while(Result::ok) {
            match frame[0] {
                b'D' => {
                    self.rows[i].push_back(frame.to_vec());
                    got += 1;
                    self.fed.0 += 1;
                    self.fed.1 += frame.len() as u64;
                }
                b'E' => return Err(frame.to_vec()),
                _ => {}
            }
        }
        if got < asked || got == 0 {
            self.done[i] = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::put_frame;

    /// A DataRow of one text column.
    fn row(v: &str) -> Vec<u8> {
        let mut body = 1i16.to_be_bytes().to_vec();
        body.extend_from_slice(&(v.len() as i32).to_be_bytes());
        body.extend_from_slice(v.as_bytes());
        let mut f = Vec::new();
        put_frame(&mut f, b'D', &body);
        f
    }

    fn answer(vs: &[&str]) -> Vec<u8> {
        vs.iter().flat_map(|v| row(v)).collect()
    }

    /// Runs the merge to the end over shards' rows, answering each Need with `batch` rows.
    fn drain(mut m: Stepwise, shards: &[&[&str]], batch: usize) -> Vec<Vec<u8>> {
        let mut at = vec![0; shards.len()];
        let mut out = Vec::new();
        let mut asks = 0;
        loop {
            match m.step().unwrap() {
                Step::Row(r) => out.push(r),
                Step::End => return out,
                Step::Need(idx) => {
                    asks += 1;
                    assert!(asks < 100, "the merge keeps asking");
                    for i in idx {
                        let end = (at[i] + batch).min(shards[i].len());
                        m.feed(i, &answer(&shards[i][at[i]..end]), batch as u64)
                            .unwrap();
                        at[i] = end;
                    }
                }
            }
        }
    }

    fn int_column() -> Vec<Column> {
        let mut body = 1i16.to_be_bytes().to_vec();
        body.extend_from_slice(b"id\0");
        body.extend_from_slice(&0u32.to_be_bytes());
        body.extend_from_slice(&0i16.to_be_bytes());
        body.extend_from_slice(&20u32.to_be_bytes()); // int8
        body.extend_from_slice(&8i16.to_be_bytes());
        body.extend_from_slice(&(-1i32).to_be_bytes());
        body.extend_from_slice(&0i16.to_be_bytes());
        merge::columns(&body).unwrap()
    }

    #[test]
    fn shard_order_with_offset_and_limit() {
        let shards: [&[&str]; 3] = [&["1", "2", "3"], &[], &["7", "8"]];
        let got = drain(Stepwise::new(3, None, 0, None), &shards, 2);
        assert_eq!(got, ["1", "2", "3", "7", "8"].map(row));
        let got = drain(Stepwise::new(3, None, 2, Some(2)), &shards, 1);
        assert_eq!(got, ["3", "7"].map(row));
    }

    #[test]
    fn sorted_streams_merge_a_batch_at_a_time() {
        let keys = vec![SortKey {
            column: 0,
            descending: false,
            nulls_first: false,
        }];
        let shards: [&[&str]; 3] = [&["1", "4", "9"], &["2", "3", "10", "11"], &["5"]];
        for batch in [1, 2, 5] {
            let m = Stepwise::new(3, Some((keys.clone(), int_column())), 1, Some(6));
            let got = drain(m, &shards, batch);
            assert_eq!(
                got,
                ["2", "3", "4", "5", "9", "10"].map(row),
                "batch {batch}"
            );
        }
    }

    #[test]
    fn a_row_given_back_comes_out_next() {
        let mut m = Stepwise::new(1, None, 0, Some(2));
        assert_eq!(m.step().unwrap(), Step::Need(vec![0]));
        m.feed(0, &answer(&["1", "2", "3"]), 3).unwrap();
        let Step::Row(r) = m.step().unwrap() else {
            panic!("a row")
        };
        m.unstep(r);
        assert_eq!(m.step().unwrap(), Step::Row(row("1")));
        assert_eq!(m.step().unwrap(), Step::Row(row("2")));
        assert_eq!(m.step().unwrap(), Step::End, "the limit holds");
    }

    #[test]
    fn a_shard_error_is_passed_on() {
        let mut m = Stepwise::new(1, None, 0, None);
        let mut e = Vec::new();
        put_frame(&mut e, b'E', b"SERROR\0\0");
        assert_eq!(m.step().unwrap(), Step::Need(vec![0]));
        assert_eq!(m.feed(0, &e, 1), Err(e.clone()));
    }
}
