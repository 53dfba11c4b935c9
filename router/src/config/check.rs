//! Collecting a config file's problems, each with its line, and the checks shared by many
//! settings (counts, timeouts, switches that 0 turns off).

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use shardmap::Problem;
use toml::Spanned;

use super::{Config, ConfigError};

/// Collects problems, with the line of each.
pub(super) struct Checker<'a> {
    pub(super) text: &'a str,
    pub(super) problems: Vec<Problem>,
}

impl Checker<'_> {
    /// 1-based line of the start of `span`.
    pub(super) fn line(&self, span: Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    pub(super) fn add(&mut self, line: usize, message: impl Into<String>) {
        self.problems.push(Problem {
            line,
            message: message.into(),
        });
    }

    /// An integer setting of at least `min`, or `default` when absent.
    pub(super) fn count(
        &mut self,
        v: &Option<Spanned<i64>>,
        name: &str,
        default: usize,
        min: usize,
    ) -> usize {
        let Some(v) = v else { return default };
        match usize::try_from(*v.get_ref()) {
            Ok(n) if n >= min => n,
            _ => {
                let line = self.line(v.span());
                self.add(
                    line,
                    format!("{name} is {}; it must be {min} or more", v.get_ref()),
                );
                default
            }
        }
    }

    /// A millisecond setting that must be more than 0.
    pub(super) fn timeout(
        &mut self,
        v: &Option<Spanned<i64>>,
        name: &str,
        default_ms: u64,
    ) -> Duration {
        let Some(v) = v else {
            return Duration::from_millis(default_ms);
        };
        match u64::try_from(*v.get_ref()) {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                let line = self.line(v.span());
                self.add(
                    line,
                    format!(
                        "{name} is {}; it must be more than 0 milliseconds",
                        v.get_ref()
                    ),
                );
                Duration::from_millis(default_ms)
            }
        }
    }

    /// A millisecond setting where 0 switches the feature off.
    pub(super) fn optional_ms(
        &mut self,
        v: &Option<Spanned<i64>>,
        name: &str,
        default_ms: u64,
    ) -> Option<Duration> {
        let ms = match v {
            None => default_ms,
            Some(v) => match u64::try_from(*v.get_ref()) {
                Ok(ms) => ms,
                Err(_) => {
                    let line = self.line(v.span());
                    self.add(
                        line,
                        format!(
                            "{name} is {}; it must be 0 (off) or a number of milliseconds",
                            v.get_ref()
                        ),
                    );
                    default_ms
                }
            },
        };
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    pub(super) fn finish(
        mut self,
        origin: &Path,
        config: Option<Config>,
    ) -> Result<Config, ConfigError> {
        match config {
            Some(config) if self.problems.is_empty() => Ok(config),
            _ => {
                // Problems without a line (missing settings) first, then in file order.
                self.problems.sort_by_key(|p| p.line);
                Err(ConfigError {
                    origin: origin.display().to_string(),
                    problems: self.problems,
                })
            }
        }
    }
}
