//! Problems found in a shard map, each pinned to a file and line.
//!
//! Loading reports every problem it finds at once, as `FILE:LINE: sentence`, so an operator
//! fixes a generated or hand-edited map in one pass.

use std::fmt;

/// One problem in a shard map: where it is and, in a plain sentence, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line; 0 when the problem has no place in the file (e.g. it cannot be read).
    pub line: usize,
    pub message: String,
}

/// Every problem found in one shard map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapError {
    /// The file the map came from, or a description such as `<generated>`.
    pub origin: String,
    pub problems: Vec<Problem>,
}

impl MapError {
    pub fn single(origin: &str, line: usize, message: impl Into<String>) -> MapError {
        MapError {
            origin: origin.to_string(),
            problems: vec![Problem {
                line,
                message: message.into(),
            }],
        }
    }
}

/// Writes `problems` of the file `origin` one per line, as `FILE:LINE: sentence` (just
/// `FILE: sentence` without a line): the form every file the project reads reports in.
pub fn write_problems(
    f: &mut fmt::Formatter<'_>,
    origin: &str,
    problems: &[Problem],
) -> fmt::Result {
    for (i, p) in problems.iter().enumerate() {
        if i > 0 {
            writeln!(f)?;
        }
        if p.line > 0 {
            write!(f, "{origin}:{}: {}", p.line, p.message)?;
        } else {
            write!(f, "{origin}: {}", p.message)?;
        }
    }
    Ok(())
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_problems(f, &self.origin, &self.problems)
    }
}

impl std::error::Error for MapError {}

/// Collects problems while a map is checked.
#[derive(Default)]
pub(crate) struct Problems {
    pub list: Vec<Problem>,
    /// Some shards could not be read: coverage checks would only report their absence.
    pub shards_dropped: bool,
}

impl Problems {
    pub fn add(&mut self, line: usize, message: impl Into<String>) {
        self.list.push(Problem {
            line,
            message: message.into(),
        });
    }

    pub fn into_result<T>(mut self, origin: &str, value: T) -> Result<T, MapError> {
        if self.list.is_empty() {
            return Ok(value);
        }
        self.list.sort_by_key(|p| p.line);
        Err(MapError {
            origin: origin.to_string(),
            problems: self.list,
        })
    }
}

/// 1-based line of a byte offset in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
