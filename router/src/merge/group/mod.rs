//! Grouping merge: combines the per-shard results of a `GROUP BY` / aggregate query.
//!
//! Each shard runs the query with its own grouping and sends one row per group it saw, the
//! same group possibly on several shards. [`GroupMerge`] folds those rows by group key and
//! combines the partial aggregates: counts and sums add up, min/max take the extreme, and
//! `avg` is computed from a `sum(x), count(x)` pair exactly as Postgres's final function does.
//! Results keep each shard column's format; `numeric` is exact in text and in binary (what
//! drivers such as tokio-postgres ask for), and `avg(x)` is sent in its `sum(x)`'s format.
//! Without any group key it is a plain aggregate, which always yields exactly one row.
//!
//! Group keys must be types whose equal values have equal bytes (integers, bool, text, uuid,
//! dates), since groups are matched by bytes; `numeric` and floats are refused because e.g.
//! `1.0` and `1.00` (or `0` and `-0`) are one group but print differently.

use std::collections::HashMap;

use super::arith::{self, ArithOp, Operand};
use super::numeric::Numeric;
use super::row::{self, Column};
use super::value::{self, Kind};
use super::variance::{self, Dispersion};

mod plan;
use super::{check_sortable, compare_rows, float, MergeError, SortKey};
use plan::{arith_oid, check_group_key, plan_agg, plan_arith, plan_avg, plan_dispersion, Plan};

/// An aggregate whose per-shard partial results combine into the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggOp {
    Count,
    Sum,
    Min,
    Max,
}

/// One output (client) column, in terms of the shards' columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// A group key: the shard column, passed through.
    Key(usize),
    /// The aggregate `op` whose per-shard value is in `column`.
    Agg { op: AggOp, column: usize },
    /// `avg(x)`, from the shards' `sum(x)` and `count(x)` columns.
    Avg { sum: usize, count: usize },
    /// `stddev(x)`, `variance(x)` and kin, from the shards' `count(x)`, `sum(x)` and
    /// `sum(x::numeric * x::numeric)` columns ([`super::variance`]).
    Dispersion {
        kind: Dispersion,
        count: usize,
        sum: usize,
        squares: usize,
    },
    /// `count(DISTINCT x)`: the shards group by `x` too and send its values in `column`; the
    /// router counts the distinct ones of each group.
    CountDistinct { column: usize },
    /// `agg1 op agg2` of two mergeable aggregates ([`super::arith`]).
    Arith {
        op: ArithOp,
        left: (AggOp, usize),
        right: (AggOp, usize),
    },
}

/// The running value of one output column in one group.
#[derive(Debug, Clone)]
enum Acc {
    Key,
    Int(Option<i128>),
    Numeric(Option<Numeric>),
    F64(Option<f64>),
    F32(Option<f32>),
    Extreme(Option<Vec<u8>>),
    Avg {
        sum: Option<Numeric>,
        count: i128,
    },
    AvgF64 {
        sum: Option<f64>,
        count: i128,
    },
    Dispersion {
        sum: Option<Numeric>,
        count: i128,
        squares: Option<Numeric>,
    },
    /// The distinct non-NULL values seen (normalized as group keys are).
    Distinct(hashbrown::HashSet<Vec<u8>>),
    /// The two operands' accumulators.
    Arith(Box<(Acc, Acc)>),
}

/// A group: its key values as first seen, and one accumulator per output column.
#[derive(Debug, Clone)]
struct Group {
    /// `None` when they equal the group's index key (all but trimmed `bpchar` keys): a key is
    /// then kept once, not twice, which halves the memory of wide keys.
    keys: Option<Vec<Option<Vec<u8>>>>,
    accs: Vec<Acc>,
}

/// What one group costs besides its key and value bytes: the group, its accumulators, the
/// index entry and the vectors' headers, rounded up (an estimate for the memory limits).
const GROUP_OVERHEAD: usize = 160;

/// Merges the shards' grouped rows; see the module documentation.
#[derive(Debug)]
pub struct GroupMerge {
    plans: Vec<Plan>,
    shard_columns: Vec<Column>,
    text_bytewise: bool,
    /// Group index by normalized key (bpchar without trailing spaces).
    index: HashMap<Vec<Option<Vec<u8>>>, usize>,
    groups: Vec<Group>,
    /// The bytes held so far (an estimate: keys, kept values and a cost per group).
    held: usize,
}

const OVERFLOW_BIGINT: &str = "bigint out of range";
const OVERFLOW_FLOAT: &str = "value out of range: overflow";

impl GroupMerge {
    /// `out`: the client's columns in order; `shard_columns`: the shards' RowDescription.
    /// `text_bytewise`: the database collation is C, so text min/max and sorting work by bytes.
    /// Fails when some column cannot be merged exactly.
    pub fn new(
        out: Vec<Out>,
        shard_columns: Vec<Column>,
        text_bytewise: bool,
    ) -> Result<GroupMerge, MergeError> {
        let col = |i: usize| {
            shard_columns.get(i).ok_or(MergeError::from(
                "an output column refers to a missing shard column",
            ))
        };
        let mut plans = Vec::with_capacity(out.len());
        for o in &out {
            let plan = match *o {
                Out::Key(i) => {
                    check_group_key(col(i)?)?;
                    Plan::Key(i)
                }
                Out::Agg { op, column } => plan_agg(op, column, col(column)?, text_bytewise)?,
                Out::Avg { sum, count } => plan_avg(sum, col(sum)?, count, col(count)?)?,
                Out::Dispersion {
                    kind,
                    count,
                    sum,
                    squares,
                } => plan_dispersion(
                    kind,
                    [count, sum, squares],
                    [col(count)?, col(sum)?, col(squares)?],
                )?,
                Out::Arith { op, left, right } => plan_arith(
                    op,
                    plan_agg(left.0, left.1, col(left.1)?, text_bytewise)?,
                    plan_agg(right.0, right.1, col(right.1)?, text_bytewise)?,
                )?,
                Out::CountDistinct { column } => {
                    // Distinct by bytes is distinct by value only where group keys are.
                    check_group_key(col(column)?)?;
                    Plan::CountDistinct(column)
                }
            };
            plans.push(plan);
        }
        Ok(GroupMerge {
            plans,
            shard_columns,
            text_bytewise,
            index: HashMap::new(),
            groups: Vec::new(),
            held: 0,
        })
    }

    /// Whether some column sums or averages floats (see [`Plan::sums_floats`]).
    pub fn sums_floats(&self) -> bool {
        self.plans.iter().any(Plan::sums_floats)
    }

    /// How many groups are held so far.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// The bytes held so far (an estimate, for `limits.max_merge_bytes`).
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Folds one shard DataRow body into its group.
    pub fn fold(&mut self, data_row_body: &[u8]) -> Result<(), MergeError> {
        let fields = row::fields(data_row_body)?;
        if fields.len() != self.shard_columns.len() {
            return Err("a DataRow does not match its RowDescription".into());
        }
        let mut norm = Vec::new();
        for plan in &self.plans {
            if let Plan::Key(i) = *plan {
                norm.push(fields[i].map(|v| self.normalize_key(i, v).to_vec()));
            }
        }
        let g = match self.index.get(&norm) {
            Some(&g) => g,
            None => {
                let originals = self.plans.iter().filter_map(|p| match *p {
                    Plan::Key(i) => Some(fields[i]),
                    _ => None,
                });
                let same = originals.clone().zip(&norm).all(|(o, n)| o == n.as_deref());
                let keys = (!same).then(|| originals.map(|v| v.map(<[u8]>::to_vec)).collect());
                let key_bytes: usize = norm
                    .iter()
                    .map(|k| k.as_ref().map_or(8, |k| k.len() + 24))
                    .sum();
                self.held += GROUP_OVERHEAD
                    + self.plans.len() * std::mem::size_of::<Acc>()
                    + if same { key_bytes } else { 2 * key_bytes };
                self.new_group(keys);
                self.index.insert(norm, self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        let cols = &self.shard_columns;
        let group = &mut self.groups[g];
        for (plan, acc) in self.plans.iter().zip(group.accs.iter_mut()) {
            self.held += accumulate(*plan, acc, &fields, cols)?;
        }
        Ok(())
    }

    /// Whether an output column is computed by the router from several shard columns (and so
    /// needs a name of its own).
    fn computed(p: &Plan) -> bool {
        matches!(
            p,
            Plan::AvgNumeric { .. }
                | Plan::AvgFloat8 { .. }
                | Plan::Dispersion { .. }
                | Plan::CountDistinct(_)
                | Plan::Arith { .. }
        )
    }

    /// The client's RowDescription body. `avg_names` names the `Avg` columns in output order
    /// (e.g. `avg`, or the alias the client gave).
    pub fn row_description(&self, avg_names: &[&[u8]]) -> Result<Vec<u8>, MergeError> {
        let avgs = self.plans.iter().filter(|p| Self::computed(p)).count();
        if avgs != avg_names.len() {
            return Err("one name is needed per computed column".into());
        }
        let mut cols = self.output_columns();
        let mut names = avg_names.iter();
        for (c, p) in cols.iter_mut().zip(&self.plans) {
            if Self::computed(p) {
                if let Some(name) = names.next() {
                    c.name = name.to_vec();
                }
            }
        }
        Ok(row::row_description_body(&cols))
    }

    /// Appends the merged rows to `out` as whole DataRow frames (tag, length, body), sorted by
    /// `keys` (in terms of output columns) when given, else in first-seen order. Returns the
    /// number of rows.
    pub fn finish(self, keys: &[SortKey], out: &mut Vec<u8>) -> Result<u64, MergeError> {
        let rows = self.finish_rows(keys)?;
        for r in &rows {
            row::write_data_row_frame(r, out);
        }
        Ok(rows.len() as u64)
    }

    /// The merged DataRow bodies, sorted as [`GroupMerge::finish`] sorts them. Each group is
    /// freed as its row is made, so the groups and their rows are not held twice.
    pub fn finish_rows(mut self, keys: &[SortKey]) -> Result<Vec<Vec<u8>>, MergeError> {
        let out_cols = self.output_columns();
        check_sortable(keys, &out_cols, self.text_bytewise)?;
        let plain_aggregate = !self.plans.iter().any(|p| matches!(p, Plan::Key(_)));
        if plain_aggregate && self.groups.is_empty() {
            // No shard row at all: still one row, of zero counts and NULLs.
            self.new_group(Some(Vec::new()));
        }
        // The keys kept only in the index go back to their groups.
        let mut index_keys: Vec<Option<Vec<Option<Vec<u8>>>>> = vec![None; self.groups.len()];
        for (k, g) in std::mem::take(&mut self.index) {
            if let Some(slot) = index_keys.get_mut(g) {
                *slot = Some(k);
            }
        }
        let groups = std::mem::take(&mut self.groups);
        let mut rows = Vec::with_capacity(groups.len());
        for (g, index_key) in groups.into_iter().zip(index_keys) {
            let keys = g.keys.as_deref().or(index_key.as_deref()).unwrap_or(&[]);
            rows.push(self.output_row(keys, &g.accs)?);
        }
        if !keys.is_empty() {
            let mut failure = None;
            rows.sort_by(|a, b| {
                compare_rows(a, b, keys, &out_cols).unwrap_or_else(|e| {
                    failure.get_or_insert(e);
                    std::cmp::Ordering::Equal
                })
            });
            if let Some(e) = failure {
                return Err(e);
            }
        }
        Ok(rows)
    }

    fn normalize_key<'a>(&self, column: usize, v: &'a [u8]) -> &'a [u8] {
        match self.shard_columns.get(column).map(|c| Kind::of(c.type_oid)) {
            Some(Some(Kind::Text { bpchar: true })) => value::trim_spaces(v),
            _ => v,
        }
    }

    fn new_group(&mut self, keys: Option<Vec<Option<Vec<u8>>>>) {
        let accs = self.plans.iter().map(|p| new_acc(*p)).collect();
        self.groups.push(Group { keys, accs });
    }

    fn output_columns(&self) -> Vec<Column> {
        self.plans
            .iter()
            .map(|p| match *p {
                Plan::Key(i)
                | Plan::Count(i)
                | Plan::SumInt(i)
                | Plan::SumNumeric(i)
                | Plan::SumFloat8(i)
                | Plan::SumFloat4(i)
                | Plan::Extreme { column: i, .. } => self.shard_columns[i].clone(),
                Plan::AvgNumeric { sum, .. } => {
                    Column::new(b"avg", 1700, self.shard_columns[sum].binary)
                }
                Plan::AvgFloat8 { sum, .. } => {
                    Column::new(b"avg", 701, self.shard_columns[sum].binary)
                }
                Plan::Dispersion { squares, .. } => {
                    Column::new(b"stddev", 1700, self.shard_columns[squares].binary)
                }
                Plan::CountDistinct(i) => Column::new(b"count", 20, self.shard_columns[i].binary),
                Plan::Arith { left, kind, .. } => Column::new(
                    b"?column?",
                    arith_oid(kind),
                    self.shard_columns[left.column()].binary,
                ),
            })
            .collect()
    }

    /// The merged value of one operand of an `Arith` column.
    fn operand(&self, side: plan::Side, acc: &Acc) -> Result<Option<Operand>, MergeError> {
        let binary = self.shard_columns[side.column()].binary;
        Ok(match (side.plan(), acc) {
            (_, Acc::Int(v)) => v.map(|v| Operand::Int(v, Kind::Int8)),
            (_, Acc::Numeric(v)) => v.clone().map(Operand::Numeric),
            (Plan::Extreme { kind, .. }, Acc::Extreme(v)) => match (v, kind) {
                (None, _) => None,
                (Some(v), Kind::Numeric) => Some(Operand::Numeric(value::numeric(binary, v)?)),
                (Some(v), kind) => Some(Operand::Int(value::int(kind, binary, v)? as i128, kind)),
            },
            _ => return Err("internal error: aggregate state mismatch".into()),
        })
    }

    fn output_row(&self, keys: &[Option<Vec<u8>>], accs: &[Acc]) -> Result<Vec<u8>, MergeError> {
        let mut keys = keys.iter();
        let mut values: Vec<Option<Vec<u8>>> = Vec::with_capacity(self.plans.len());
        for (plan, acc) in self.plans.iter().zip(accs) {
            let binary = |i: usize| self.shard_columns[i].binary;
            let v = match (*plan, acc) {
                (Plan::Key(_), _) => keys.next().cloned().flatten(),
                (
                    Plan::Arith {
                        op,
                        left,
                        right,
                        kind,
                    },
                    Acc::Arith(accs),
                ) => {
                    let binary = binary(left.column());
                    let l = self.operand(left, &accs.0)?;
                    let r = self.operand(right, &accs.1)?;
                    match (l, r) {
                        (Some(l), Some(r)) => {
                            Some(operand_bytes(arith::apply(op, l, r, kind)?, binary)?)
                        }
                        _ => None,
                    }
                }
                (Plan::CountDistinct(i), Acc::Distinct(seen)) => {
                    let n = seen.len() as i64;
                    Some(if binary(i) {
                        n.to_be_bytes().to_vec()
                    } else {
                        n.to_string().into_bytes()
                    })
                }
                (Plan::Count(i) | Plan::SumInt(i), Acc::Int(v)) => match v {
                    None => None,
                    Some(v) => {
                        let v = i64::try_from(*v).map_err(|_| MergeError::from(OVERFLOW_BIGINT))?;
                        Some(if binary(i) {
                            v.to_be_bytes().to_vec()
                        } else {
                            v.to_string().into_bytes()
                        })
                    }
                },
                (Plan::SumNumeric(i), Acc::Numeric(v)) => match v {
                    Some(n) => Some(numeric_bytes(n, binary(i))?),
                    None => None,
                },
                (Plan::SumFloat8(i), Acc::F64(v)) => v.map(|v| f64_bytes(v, binary(i))),
                (Plan::SumFloat4(i), Acc::F32(v)) => v.map(|v| {
                    if binary(i) {
                        v.to_bits().to_be_bytes().to_vec()
                    } else {
                        float::format_f32(v).into_bytes()
                    }
                }),
                (Plan::Extreme { .. }, Acc::Extreme(v)) => v.clone(),
                (Plan::AvgNumeric { sum: i, .. }, Acc::Avg { sum, count }) => {
                    match avg_numeric(sum.as_ref(), *count)? {
                        Some(avg) => Some(numeric_bytes(&avg, binary(i))?),
                        None => None,
                    }
                }
                (
                    Plan::Dispersion { kind, squares, .. },
                    Acc::Dispersion {
                        sum,
                        count,
                        squares: sq,
                    },
                ) => match variance::finish(kind, *count, sum.as_ref(), sq.as_ref())? {
                    Some(v) => Some(numeric_bytes(&v, binary(squares))?),
                    None => None,
                },
                (Plan::AvgFloat8 { sum, .. }, Acc::AvgF64 { sum: s, count }) => {
                    match (s, *count) {
                        (_, 0) => None,
                        (None, _) => return Err(SUM_NULL_COUNT.into()),
                        // float8_avg: Sx / N, without overflow checks.
                        (Some(s), n) => Some(f64_bytes(s / n as f64, binary(sum))),
                    }
                }
                _ => return Err("internal error: aggregate state mismatch".into()),
            };
            values.push(v);
        }
        let refs: Vec<Option<&[u8]>> = values.iter().map(|v| v.as_deref()).collect();
        Ok(row::data_row_body(&refs))
    }
}

/// A group's accumulator for one output column, before any row.
fn new_acc(p: Plan) -> Acc {
    match p {
        Plan::Key(_) => Acc::Key,
        Plan::Count(_) => Acc::Int(Some(0)),
        Plan::SumInt(_) => Acc::Int(None),
        Plan::SumNumeric(_) => Acc::Numeric(None),
        Plan::SumFloat8(_) => Acc::F64(None),
        Plan::SumFloat4(_) => Acc::F32(None),
        Plan::Extreme { .. } => Acc::Extreme(None),
        Plan::AvgNumeric { .. } => Acc::Avg {
            sum: None,
            count: 0,
        },
        Plan::AvgFloat8 { .. } => Acc::AvgF64 {
            sum: None,
            count: 0,
        },
        Plan::Dispersion { .. } => Acc::Dispersion {
            sum: None,
            count: 0,
            squares: None,
        },
        Plan::CountDistinct(_) => Acc::Distinct(Default::default()),
        Plan::Arith { left, right, .. } => {
            Acc::Arith(Box::new((new_acc(left.plan()), new_acc(right.plan()))))
        }
    }
}

const SUM_NULL_COUNT: &str = "a shard sent a NULL sum with a non-zero count";

fn avg_numeric(sum: Option<&Numeric>, count: i128) -> Result<Option<Numeric>, MergeError> {
    if count == 0 {
        return Ok(None);
    }
    let sum = sum.ok_or(SUM_NULL_COUNT)?;
    let count = u64::try_from(count).map_err(|_| MergeError::from(OVERFLOW_BIGINT))?;
    Ok(Some(sum.div_count(count)?))
}

/// An arithmetic result as its type sends it.
fn operand_bytes(v: Operand, binary: bool) -> Result<Vec<u8>, MergeError> {
    match v {
        Operand::Numeric(n) => numeric_bytes(&n, binary),
        Operand::Int(v, kind) if binary => Ok(match kind {
            Kind::Int2 => (v as i16).to_be_bytes().to_vec(),
            Kind::Int4 => (v as i32).to_be_bytes().to_vec(),
            _ => (v as i64).to_be_bytes().to_vec(),
        }),
        Operand::Int(v, _) => Ok(v.to_string().into_bytes()),
    }
}

fn numeric_bytes(n: &Numeric, binary: bool) -> Result<Vec<u8>, MergeError> {
    if binary {
        n.to_binary()
    } else {
        Ok(n.to_text().into_bytes())
    }
}

fn f64_bytes(v: f64, binary: bool) -> Vec<u8> {
    if binary {
        v.to_bits().to_be_bytes().to_vec()
    } else {
        float::format_f64(v).into_bytes()
    }
}

/// Adds one shard row's value(s) into an accumulator.
fn accumulate(
    plan: Plan,
    acc: &mut Acc,
    fields: &[Option<&[u8]>],
    cols: &[Column],
) -> Result<usize, MergeError> {
    // The bytes a kept value grew by (only min/max keep bytes of their own).
    let mut grew = 0;
    let kind_of = |i: usize| Kind::of(cols[i].type_oid).unwrap_or(Kind::Int8);
    match (plan, acc) {
        (Plan::Key(_), _) => {}
        (Plan::Count(i) | Plan::SumInt(i), Acc::Int(total)) => {
            if let Some(v) = fields[i] {
                let v = value::int(Kind::Int8, cols[i].binary, v)? as i128;
                *total = Some(total.unwrap_or(0) + v);
            }
        }
        (Plan::SumNumeric(i), Acc::Numeric(total)) => {
            if let Some(v) = fields[i] {
                add_numeric(total, value::numeric(cols[i].binary, v)?);
            }
        }
        (Plan::SumFloat8(i), Acc::F64(total)) => {
            if let Some(v) = fields[i] {
                add_f64(total, value::float(Kind::Float8, cols[i].binary, v)?)?;
            }
        }
        (Plan::SumFloat4(i), Acc::F32(total)) => {
            if let Some(v) = fields[i] {
                let v = value::float(Kind::Float4, cols[i].binary, v)? as f32;
                *total = Some(match *total {
                    Some(t) => {
                        let s = t + v;
                        if s.is_infinite() && t.is_finite() && v.is_finite() {
                            return Err(OVERFLOW_FLOAT.into());
                        }
                        s
                    }
                    None => v,
                });
            }
        }
        (Plan::Extreme { column, kind, max }, Acc::Extreme(best)) => {
            if let Some(v) = fields[column] {
                let better = match best {
                    None => true,
                    Some(b) => {
                        let ord = value::compare(kind, cols[column].binary, v, b)?;
                        if max {
                            ord.is_gt()
                        } else {
                            ord.is_lt()
                        }
                    }
                };
                if better {
                    grew = v.len().saturating_sub(best.as_ref().map_or(0, Vec::len));
                    *best = Some(v.to_vec());
                }
            }
        }
        (
            Plan::AvgNumeric {
                sum,
                count,
                sum_kind,
            },
            Acc::Avg { sum: s, count: n },
        ) => {
            *n += count_value(fields[count], &cols[count])?;
            if let Some(v) = fields[sum] {
                add_numeric(s, sum_value(sum_kind, cols[sum].binary, v)?);
            }
        }
        (
            Plan::Dispersion {
                count,
                sum,
                squares,
                sum_kind,
                ..
            },
            Acc::Dispersion {
                sum: s,
                count: n,
                squares: sq,
            },
        ) => {
            *n += count_value(fields[count], &cols[count])?;
            if let Some(v) = fields[sum] {
                add_numeric(s, sum_value(sum_kind, cols[sum].binary, v)?);
            }
            if let Some(v) = fields[squares] {
                add_numeric(sq, value::numeric(cols[squares].binary, v)?);
            }
        }
        (Plan::Arith { left, right, .. }, Acc::Arith(accs)) => {
            let (l, r) = &mut **accs;
            grew += accumulate(left.plan(), l, fields, cols)?;
            grew += accumulate(right.plan(), r, fields, cols)?;
        }
        (Plan::CountDistinct(i), Acc::Distinct(seen)) => {
            if let Some(v) = fields[i] {
                let v = match Kind::of(cols[i].type_oid) {
                    Some(Kind::Text { bpchar: true }) => value::trim_spaces(v),
                    _ => v,
                };
                if seen.insert(v.to_vec()) {
                    grew = v.len() + 32;
                }
            }
        }
        (Plan::AvgFloat8 { sum, count }, Acc::AvgF64 { sum: s, count: n }) => {
            *n += count_value(fields[count], &cols[count])?;
            if let Some(v) = fields[sum] {
                add_f64(s, value::float(kind_of(sum), cols[sum].binary, v)?)?;
            }
        }
        _ => return Err("internal error: aggregate state mismatch".into()),
    }
    Ok(grew)
}

/// `total + v` in numeric (`v` alone when there is no total yet).
fn add_numeric(total: &mut Option<Numeric>, v: Numeric) {
    *total = Some(match total.take() {
        Some(t) => t.add(&v),
        None => v,
    });
}

/// `total + v` as `float8pl` adds: an infinite sum of finite values is an overflow error.
fn add_f64(total: &mut Option<f64>, v: f64) -> Result<(), MergeError> {
    *total = Some(match *total {
        Some(t) => {
            let s = t + v;
            if s.is_infinite() && t.is_finite() && v.is_finite() {
                return Err(OVERFLOW_FLOAT.into());
            }
            s
        }
        None => v,
    });
    Ok(())
}

/// A shard's `sum(x)` of integers (bigint) or of numeric, as numeric.
fn sum_value(kind: Kind, binary: bool, v: &[u8]) -> Result<Numeric, MergeError> {
    Ok(match kind {
        Kind::Int8 => Numeric::from_i128(value::int(Kind::Int8, binary, v)? as i128),
        _ => value::numeric(binary, v)?,
    })
}

fn count_value(v: Option<&[u8]>, col: &Column) -> Result<i128, MergeError> {
    let v = v.ok_or("a shard sent a NULL count")?;
    Ok(value::int(Kind::Int8, col.binary, v)? as i128)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::row::{data_row_body, fields};

    fn text_col(name: &str, oid: u32) -> Column {
        Column::new(name.as_bytes(), oid, false)
    }

    fn row(values: &[Option<&str>]) -> Vec<u8> {
        let v: Vec<Option<&[u8]>> = values.iter().map(|v| v.map(str::as_bytes)).collect();
        data_row_body(&v)
    }

    /// The DataRow frames in `out` as text fields.
    fn rows(out: &[u8]) -> Vec<Vec<Option<String>>> {
        let mut rest = out;
        let mut result = Vec::new();
        while !rest.is_empty() {
            assert_eq!(rest[0], b'D');
            let len = i32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            let body = &rest[5..1 + len];
            let f = fields(body).unwrap();
            result.push(
                f.iter()
                    .map(|v| v.map(|v| String::from_utf8(v.to_vec()).unwrap()))
                    .collect(),
            );
            rest = &rest[1 + len..];
        }
        result
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn count_distinct_counts_each_value_once_over_every_shard() {
        // Shards grouped by (g, x); bpchar values equal but for trailing spaces are one value.
        let cols = vec![text_col("g", 25), text_col("x", 1042)];
        let out = vec![Out::Key(0), Out::CountDistinct { column: 1 }];
        let mut m = GroupMerge::new(out, cols, true).unwrap();
        for r in [
            [Some("a"), Some("x")],
            [Some("a"), Some("y")],
            [Some("b"), None],
            [Some("a"), Some("x  ")],
            [Some("b"), Some("z")],
            [Some("c"), None],
        ] {
            m.fold(&row(&r)).unwrap();
        }
        let mut buf = Vec::new();
        m.finish(&[], &mut buf).unwrap();
        assert_eq!(
            rows(&buf),
            vec![
                vec![s("a"), s("2")],
                vec![s("b"), s("1")],
                vec![s("c"), s("0")]
            ]
        );
        // Floats and numerics are not distinct by their bytes (1.0 and 1.00): refused.
        let numeric = vec![text_col("x", 1700)];
        assert!(GroupMerge::new(vec![Out::CountDistinct { column: 0 }], numeric, true).is_err());
    }

    #[test]
    fn groups_combine_across_shards() {
        // Shards answer: SELECT k, count(*), sum(x), min(x), max(x), sum(n), count(n) GROUP BY k
        let cols = vec![
            text_col("k", 23),
            text_col("count", 20),
            text_col("sum", 20),
            text_col("min", 23),
            text_col("max", 23),
            text_col("sum", 1700),
            text_col("count", 20),
        ];
        let out = vec![
            Out::Key(0),
            Out::Agg {
                op: AggOp::Count,
                column: 1,
            },
            Out::Agg {
                op: AggOp::Sum,
                column: 2,
            },
            Out::Agg {
                op: AggOp::Min,
                column: 3,
            },
            Out::Agg {
                op: AggOp::Max,
                column: 4,
            },
            Out::Avg { sum: 5, count: 6 },
        ];
        let mut m = GroupMerge::new(out, cols, false).unwrap();
        for r in [
            row(&[
                Some("1"),
                Some("2"),
                Some("10"),
                Some("3"),
                Some("7"),
                Some("1.5"),
                Some("2"),
            ]),
            row(&[Some("2"), Some("1"), None, None, None, None, Some("0")]),
            row(&[
                None,
                Some("1"),
                Some("-4"),
                Some("-4"),
                Some("-4"),
                Some("1"),
                Some("1"),
            ]),
            row(&[
                Some("1"),
                Some("3"),
                Some("5"),
                Some("-1"),
                Some("2"),
                Some("1.00"),
                Some("1"),
            ]),
        ] {
            m.fold(&r).unwrap();
        }
        let desc = m.row_description(&[b"a"]).unwrap();
        let rd = crate::merge::row::columns(&desc).unwrap();
        assert_eq!(rd[5].name, b"a");
        assert_eq!(rd[5].type_oid, 1700);
        let key = SortKey {
            column: 0,
            descending: false,
            nulls_first: false,
        };
        let mut buf = Vec::new();
        assert_eq!(m.finish(&[key], &mut buf).unwrap(), 3);
        assert_eq!(
            rows(&buf),
            vec![
                vec![
                    s("1"),
                    s("5"),
                    s("15"),
                    s("-1"),
                    s("7"),
                    s("0.83333333333333333333")
                ],
                vec![s("2"), s("1"), None, None, None, None],
                vec![
                    None,
                    s("1"),
                    s("-4"),
                    s("-4"),
                    s("-4"),
                    s("1.00000000000000000000")
                ],
            ]
        );
    }

    #[test]
    fn plain_aggregate_is_one_row_even_without_rows() {
        let cols = vec![
            text_col("count", 20),
            text_col("sum", 1700),
            text_col("max", 25),
        ];
        let out = vec![
            Out::Agg {
                op: AggOp::Count,
                column: 0,
            },
            Out::Agg {
                op: AggOp::Sum,
                column: 1,
            },
            Out::Agg {
                op: AggOp::Max,
                column: 2,
            },
        ];
        let m = GroupMerge::new(out.clone(), cols.clone(), true).unwrap();
        let mut buf = Vec::new();
        assert_eq!(m.finish(&[], &mut buf).unwrap(), 1);
        assert_eq!(rows(&buf), vec![vec![s("0"), None, None]]);

        let mut m = GroupMerge::new(out, cols, true).unwrap();
        m.fold(&row(&[Some("0"), None, None])).unwrap();
        m.fold(&row(&[Some("2"), Some("0.10"), Some("b")])).unwrap();
        m.fold(&row(&[Some("1"), Some("-0.1"), Some("B")])).unwrap();
        let mut buf = Vec::new();
        m.finish(&[], &mut buf).unwrap();
        assert_eq!(rows(&buf), vec![vec![s("3"), s("0.00"), s("b")]]);
    }

    #[test]
    fn bigint_overflow_is_an_error() {
        let cols = vec![text_col("sum", 20)];
        let out = vec![Out::Agg {
            op: AggOp::Sum,
            column: 0,
        }];
        let mut m = GroupMerge::new(out, cols, false).unwrap();
        m.fold(&row(&[Some("9223372036854775807")])).unwrap();
        m.fold(&row(&[Some("1")])).unwrap();
        let err = m.finish(&[], &mut Vec::new()).unwrap_err();
        assert_eq!(err.message(), "bigint out of range");
    }

    #[test]
    fn float_sums_and_overflow() {
        let cols = vec![Column::new(b"sum", 701, true), text_col("count", 20)];
        let out = vec![
            Out::Agg {
                op: AggOp::Sum,
                column: 0,
            },
            Out::Avg { sum: 0, count: 1 },
        ];
        let mut m = GroupMerge::new(out.clone(), cols.clone(), false).unwrap();
        let f = |v: f64, n: &str| {
            let b = v.to_be_bytes();
            data_row_body(&[Some(&b), Some(n.as_bytes())])
        };
        m.fold(&f(1.5, "2")).unwrap();
        m.fold(&f(2.0, "2")).unwrap();
        let mut buf = Vec::new();
        m.finish(&[], &mut buf).unwrap();
        let body = &buf[5..];
        let fs = fields(body).unwrap();
        assert_eq!(fs[0], Some(&3.5f64.to_be_bytes()[..]));
        assert_eq!(fs[1], Some(&0.875f64.to_be_bytes()[..]));

        let mut m = GroupMerge::new(out, cols, false).unwrap();
        m.fold(&f(f64::MAX, "1")).unwrap();
        assert!(m.fold(&f(f64::MAX, "1")).is_err());
    }

    #[test]
    fn binary_numeric_sum_min_max_avg() {
        // Shards answer: SELECT sum(n), min(n), max(n), sum(n), count(n), sum(i), count(i)
        // in binary, where n is numeric and i an int4 (whose sum is a bigint).
        let cols = vec![
            Column::new(b"sum", 1700, true),
            Column::new(b"min", 1700, true),
            Column::new(b"max", 1700, true),
            Column::new(b"sum", 1700, true),
            Column::new(b"count", 20, true),
            Column::new(b"sum", 20, true),
            Column::new(b"count", 20, true),
        ];
        let agg = |op, column| Out::Agg { op, column };
        let out = vec![
            agg(AggOp::Sum, 0),
            agg(AggOp::Min, 1),
            agg(AggOp::Max, 2),
            Out::Avg { sum: 3, count: 4 },
            Out::Avg { sum: 5, count: 6 },
        ];
        let mut m = GroupMerge::new(out, cols, false).unwrap();
        let num = |s: &str| Numeric::parse(s.as_bytes()).unwrap().to_binary().unwrap();
        let int8 = |v: i64| v.to_be_bytes().to_vec();
        for (sum, min, max, count, isum, icount) in [
            ("1.50", "0.5", "1.00", 2, 3, 2),
            ("-0.5", "-0.5", "-0.5", 1, -1, 1),
        ] {
            let (s, lo, hi) = (num(sum), num(min), num(max));
            let (n, is, ic) = (int8(count), int8(isum), int8(icount));
            let fields: [Option<&[u8]>; 7] = [
                Some(&s),
                Some(&lo),
                Some(&hi),
                Some(&s),
                Some(&n),
                Some(&is),
                Some(&ic),
            ];
            m.fold(&data_row_body(&fields)).unwrap();
        }
        let desc = m.row_description(&[b"avg", b"avg"]).unwrap();
        let rd = crate::merge::row::columns(&desc).unwrap();
        assert!(rd[3].binary && rd[3].type_oid == 1700);
        assert!(rd[4].binary && rd[4].type_oid == 1700);
        let mut buf = Vec::new();
        m.finish(&[], &mut buf).unwrap();
        let f = fields(&buf[5..]).unwrap();
        let text = |v: Option<&[u8]>| Numeric::from_binary(v.unwrap()).unwrap().to_text();
        assert_eq!(f[0].map(<[u8]>::to_vec), Some(num("1.00")));
        assert_eq!(text(f[1]), "-0.5");
        assert_eq!(text(f[2]), "1.00");
        assert_eq!(
            f[3].map(<[u8]>::to_vec),
            Some(num("0.33333333333333333333"))
        );
        assert_eq!(text(f[4]), "0.66666666666666666667");
        // A malformed binary numeric is an error, not a panic.
        let bad: [Option<&[u8]>; 7] = [Some(&[0, 1]), None, None, None, None, None, None];
        assert!(binary_sum_fold_fails(&bad));
    }

    fn binary_sum_fold_fails(fields: &[Option<&[u8]>]) -> bool {
        let cols = vec![Column::new(b"sum", 1700, true); fields.len()];
        let out = vec![Out::Agg {
            op: AggOp::Sum,
            column: 0,
        }];
        let mut m = GroupMerge::new(out, cols, false).unwrap();
        m.fold(&data_row_body(fields)).is_err()
    }

    #[test]
    fn keys_group_nulls_together_and_bpchar_without_padding() {
        let cols = vec![text_col("k", 1042), text_col("count", 20)];
        let out = vec![
            Out::Key(0),
            Out::Agg {
                op: AggOp::Count,
                column: 1,
            },
        ];
        let mut m = GroupMerge::new(out, cols, false).unwrap();
        for r in [
            row(&[Some("a  "), Some("1")]),
            row(&[Some("a"), Some("2")]),
            row(&[None, Some("3")]),
            row(&[None, Some("4")]),
        ] {
            m.fold(&r).unwrap();
        }
        let mut buf = Vec::new();
        assert_eq!(m.finish(&[], &mut buf).unwrap(), 2);
        assert_eq!(rows(&buf), vec![vec![s("a  "), s("3")], vec![None, s("7")]]);
    }

    #[test]
    fn what_is_refused() {
        let numeric = vec![text_col("k", 1700)];
        assert!(GroupMerge::new(vec![Out::Key(0)], numeric, false).is_err());
        let float = vec![text_col("k", 701)];
        assert!(GroupMerge::new(vec![Out::Key(0)], float, false).is_err());
        let binary_numeric = vec![Column::new(b"k", 1700, true)];
        assert!(GroupMerge::new(vec![Out::Key(0)], binary_numeric, false).is_err());
        let sum = Out::Agg {
            op: AggOp::Sum,
            column: 0,
        };
        let text = vec![text_col("m", 25)];
        let max = Out::Agg {
            op: AggOp::Max,
            column: 0,
        };
        assert!(GroupMerge::new(vec![max], text, false).is_err());
        let real = vec![text_col("sum", 700), text_col("count", 20)];
        assert!(GroupMerge::new(vec![Out::Avg { sum: 0, count: 1 }], real, false).is_err());
        let interval = vec![text_col("sum", 1186)];
        assert!(GroupMerge::new(vec![sum.clone()], interval, false).is_err());
        assert!(GroupMerge::new(vec![Out::Key(3)], vec![], false).is_err());
        // A malformed row is an error, not a panic.
        let mut m = GroupMerge::new(vec![sum], vec![text_col("sum", 20)], false).unwrap();
        assert!(m.fold(&row(&[Some("12x")])).is_err());
        assert!(m.fold(&[0, 1, 0]).is_err());
        assert!(m.fold(&row(&[Some("1"), Some("2")])).is_err());
    }
}
