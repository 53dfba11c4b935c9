//! The values a plan points at: keys and LIMITs, read from the Bind message's parameters (text
//! or binary format) or from the literals normalization took out of the statement's text.

use shardmap::{Key, KeyType, ShardMap};

use crate::errors;
use crate::planner::{keys, KeySource};
use crate::protocol::frontend::{Bind, Format};
use crate::protocol::reply::SqlError;

/// The literal values a plan's `$n` placeholders beyond the client's own parameters stand for.
pub trait Literals {
    fn literal(&self, i: usize) -> Option<&str>;
}

impl Literals for crate::planner::PlanRef<'_> {
    fn literal(&self, i: usize) -> Option<&str> {
        crate::planner::PlanRef::literal(self, i)
    }
}

impl Literals for Vec<Box<str>> {
    fn literal(&self, i: usize) -> Option<&str> {
        self.get(i).map(|s| &**s)
    }
}

/// Where a statement's values come from: the client's Bind (extended protocol, or SQL
/// `EXECUTE`), and the literals of its text. `params_before` is how many `$n` the client's own
/// text had (texts that differ only in literals share one plan, so this belongs to the text).
#[derive(Clone, Copy)]
pub struct Params<'a> {
    pub bind: Option<&'a Bind<'a>>,
    pub params_before: usize,
    pub literals: &'a dyn Literals,
}

impl<'a> Params<'a> {
    /// Where the value of a scalar source is, and in which format; `None` when it is NULL.
    pub(super) fn raw(
        &self,
        source: &'a KeySource,
    ) -> Result<Option<(Format, &'a [u8])>, SqlError> {
        match source {
            KeySource::Literal(text) => Ok(Some((Format::Text, text.as_bytes()))),
            KeySource::Param(i) if *i < self.params_before => {
                let Some(b) = self.bind else {
                    return Err(SqlError::new(
                        errors::PROTOCOL_VIOLATION,
                        format!(
                            "the statement needs parameter ${} but no parameters were bound",
                            i + 1
                        ),
                    ));
                };
                match b.param(*i) {
                    None => Err(SqlError::new(
                        errors::PROTOCOL_VIOLATION,
                        format!(
                            "bind message supplies {} parameters, but the statement needs ${}",
                            b.param_count,
                            i + 1
                        ),
                    )),
                    Some((_, None)) => Ok(None),
                    Some((format, Some(v))) => Ok(Some((format, v))),
                }
            }
            KeySource::Param(i) => match self.literals.literal(i - self.params_before) {
                Some(text) => Ok(Some((Format::Text, text.as_bytes()))),
                None => Err(SqlError::new(
                    errors::INTERNAL_ERROR,
                    format!("internal: literal ${} of a cached plan is missing", i + 1),
                )),
            },
            KeySource::Array(_) => Err(SqlError::new(
                errors::INTERNAL_ERROR,
                "internal: an array of keys where one key was expected",
            )),
        }
    }

    /// Whether some text value of the statement (a literal of its text, or a Bind parameter:
    /// a text parameter's binary format is its text too) is one that `test` picks.
    pub(super) fn any_text(&self, test: impl Fn(&str) -> bool) -> bool {
        let literal = (0..)
            .map_while(|i| self.literals.literal(i))
            .any(|l| test(l.trim_matches('\'')));
        let bound = self.bind.is_some_and(|b| {
            (0..b.param_count).any(|i| match b.param(i) {
                Some((_, Some(v))) => std::str::from_utf8(v).is_ok_and(&test),
                _ => false,
            })
        });
        literal || bound
    }

    /// The key a source stands for; `None` when it is NULL.
    pub fn key(
        &self,
        source: &'a KeySource,
        key_type: KeyType,
    ) -> Result<Option<Key<'a>>, SqlError> {
        match self.raw(source)? {
            None => Ok(None),
            Some((format, v)) => key_of(key_type, format, v).map(Some),
        }
    }

    /// The shard of each key in an array value (`key = ANY($1)`); NULL elements, which match
    /// nothing, are left out.
    pub fn array_shards(
        &self,
        inner: &'a KeySource,
        key_type: KeyType,
        map: &ShardMap,
        shards: &mut Vec<usize>,
    ) -> Result<(), SqlError> {
        let bad_array = |e: String| SqlError::new(errors::INVALID_TEXT_REPRESENTATION, e);
        match self.raw(inner)? {
            None => {}
            Some((Format::Binary, v)) => {
                let array = postgres_protocol::types::array_from_sql(v)
                    .map_err(|e| bad_array(format!("malformed binary array: {e}")))?;
                if !keys::element_type_fits(key_type, array.element_type()) {
                    return Err(SqlError::new(
                        errors::INVALID_BINARY_REPRESENTATION,
                        format!(
                            "the array of keys is sent as elements of type OID {}, which is not a {key_type}",
                            array.element_type()
                        ),
                    ));
                }
                let mut values = array.values();
                while let Some(e) = fallible_iterator::FallibleIterator::next(&mut values)
                    .map_err(|e| bad_array(format!("malformed binary array: {e}")))?
                {
                    if let Some(e) = e {
                        let key = keys::key_from_binary(key_type, e).map_err(bad_key)?;
                        shards.push(map.shard_for_key(&key));
                    }
                }
            }
            Some((Format::Text, v)) => {
                for e in keys::array_elements_text(utf8(v)?)
                    .map_err(bad_array)?
                    .into_iter()
                    .flatten()
                {
                    let key = keys::key_from_text(key_type, &e).map_err(bad_key)?;
                    shards.push(map.shard_for_key(&key));
                }
            }
        }
        Ok(())
    }

    /// Each element of an array value of keys (`source`): its key as an SQL literal and its
    /// keyspace ID (`None` for a NULL element; none for a NULL array).
    pub fn array_keys(
        &self,
        source: &'a KeySource,
        key_type: KeyType,
    ) -> Result<Vec<Option<(String, shardmap::KeyspaceId)>>, SqlError> {
        let bad_array = |e: String| SqlError::new(errors::INVALID_TEXT_REPRESENTATION, e);
        let Some((format, v)) = self.raw(source)? else {
            return Ok(Vec::new());
        };
        let elements = crate::planner::arrays::Elements::parse(format, v).map_err(bad_array)?;
        if format == Format::Binary && !keys::element_type_fits(key_type, elements.elem_oid()) {
            return Err(SqlError::new(
                errors::INVALID_BINARY_REPRESENTATION,
                format!(
                    "the array is sent as elements of type OID {}, which is not a {key_type}",
                    elements.elem_oid()
                ),
            ));
        }
        (0..elements.len())
            .map(|i| {
                let Some(bytes) = elements.value(i) else {
                    return Ok(None);
                };
                let key = match format {
                    Format::Binary => keys::key_from_binary(key_type, &bytes),
                    Format::Text => keys::key_from_text(key_type, utf8(&bytes)?),
                }
                .map_err(bad_key)?;
                Ok(Some((key.sql_literal(), key.keyspace_id())))
            })
            .collect()
    }

    /// A LIMIT's (or OFFSET's) value; `None` for `LIMIT NULL` (no limit, as in Postgres).
    pub fn count(&self, source: &'a KeySource) -> Result<Option<u64>, SqlError> {
        let bad = || {
            SqlError::new(
                errors::INVALID_TEXT_REPRESENTATION,
                "LIMIT must be a non-negative integer",
            )
        };
        let text = match self.raw(source) {
            Ok(None) => return Ok(None),
            Ok(Some((Format::Binary, v))) => {
                let n = match *v {
                    [a, b, c, d, e, f, g, h] => i64::from_be_bytes([a, b, c, d, e, f, g, h]),
                    [a, b, c, d] => i64::from(i32::from_be_bytes([a, b, c, d])),
                    [a, b] => i64::from(i16::from_be_bytes([a, b])),
                    _ => return Err(bad()),
                };
                return u64::try_from(n).map(Some).map_err(|_| bad());
            }
            Ok(Some((Format::Text, v))) => std::str::from_utf8(v).map_err(|_| bad())?,
            Err(_) => return Err(bad()),
        };
        text.trim().parse::<u64>().map(Some).map_err(|_| bad())
    }
}

/// The key a value in `format` stands for.
pub(super) fn key_of(key_type: KeyType, format: Format, v: &[u8]) -> Result<Key<'_>, SqlError> {
    match format {
        Format::Binary => keys::key_from_binary(key_type, v).map_err(bad_key),
        Format::Text => keys::key_from_text(key_type, utf8(v)?).map_err(bad_key),
    }
}

fn bad_key(e: keys::KeyValueError) -> SqlError {
    SqlError::new(errors::INVALID_TEXT_REPRESENTATION, e.to_string())
}

fn utf8(v: &[u8]) -> Result<&str, SqlError> {
    std::str::from_utf8(v).map_err(|_| {
        SqlError::new(
            errors::INVALID_TEXT_REPRESENTATION,
            "a key parameter is not valid UTF-8",
        )
    })
}
