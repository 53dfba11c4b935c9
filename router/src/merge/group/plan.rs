//! How each output column of a [`super::GroupMerge`] is computed, decided once from the types
//! of the shard columns it reads: exactly, or refused with the reason.

use super::super::arith::{self, ArithOp};
use super::super::datetime::DateKind;
use super::super::row::Column;
use super::super::value::{self, Kind};
use super::super::variance::Dispersion;
use super::super::MergeError;
use super::AggOp;

/// How an output column is computed, decided once from the shard column types.
#[derive(Debug, Clone, Copy)]
pub(super) enum Plan {
    Key(usize),
    /// Counts: exact, must fit in int8 at the end; 0 when there are no rows.
    Count(usize),
    /// Bigint sums (of int2/int4): like counts, but NULL when there are no values.
    SumInt(usize),
    SumNumeric(usize),
    SumFloat8(usize),
    SumFloat4(usize),
    Extreme {
        column: usize,
        kind: Kind,
        max: bool,
    },
    AvgNumeric {
        sum: usize,
        count: usize,
        sum_kind: Kind,
    },
    AvgFloat8 {
        sum: usize,
        count: usize,
    },
    Dispersion {
        kind: Dispersion,
        count: usize,
        sum: usize,
        squares: usize,
        sum_kind: Kind,
    },
    CountDistinct(usize),
    Arith {
        op: ArithOp,
        left: Side,
        right: Side,
        /// The result's type.
        kind: Kind,
    },
}

impl Plan {
    /// Whether the column adds up float values as the shards printed them: in text those are
    /// the exact values only with `extra_float_digits` above 0 (the default 1).
    pub(super) fn sums_floats(&self) -> bool {
        matches!(
            self,
            Plan::SumFloat8(_) | Plan::SumFloat4(_) | Plan::AvgFloat8 { .. }
        )
    }
}

/// One operand of an `Arith` column: an aggregate whose merged value is an integer or numeric.
#[derive(Debug, Clone, Copy)]
pub(in crate::merge) enum Side {
    Count(usize),
    SumInt(usize),
    SumNumeric(usize),
    Extreme {
        column: usize,
        kind: Kind,
        max: bool,
    },
}

impl Side {
    /// How the operand itself merges.
    pub fn plan(self) -> Plan {
        match self {
            Side::Count(i) => Plan::Count(i),
            Side::SumInt(i) => Plan::SumInt(i),
            Side::SumNumeric(i) => Plan::SumNumeric(i),
            Side::Extreme { column, kind, max } => Plan::Extreme { column, kind, max },
        }
    }

    pub fn column(self) -> usize {
        match self {
            Side::Count(i)
            | Side::SumInt(i)
            | Side::SumNumeric(i)
            | Side::Extreme { column: i, .. } => i,
        }
    }

    fn kind(self) -> Kind {
        match self {
            Side::Count(_) | Side::SumInt(_) => Kind::Int8,
            Side::SumNumeric(_) => Kind::Numeric,
            Side::Extreme { kind, .. } => kind,
        }
    }
}

/// `left op right` of two aggregates' plans: both must merge to integers or numerics.
pub(super) fn plan_arith(op: ArithOp, left: Plan, right: Plan) -> Result<Plan, MergeError> {
    let side = |p: Plan| match p {
        Plan::Count(i) => Ok(Side::Count(i)),
        Plan::SumInt(i) => Ok(Side::SumInt(i)),
        Plan::SumNumeric(i) => Ok(Side::SumNumeric(i)),
        Plan::Extreme { column, kind, max }
            if matches!(kind, Kind::Int2 | Kind::Int4 | Kind::Int8 | Kind::Numeric) =>
        {
            Ok(Side::Extreme { column, kind, max })
        }
        _ => Err(MergeError::from(
            "arithmetic across shards is supported on integer and numeric aggregates only",
        )),
    };
    let (left, right) = (side(left)?, side(right)?);
    let kind = arith::result_kind(left.kind(), right.kind())
        .ok_or("arithmetic across shards is supported on integer and numeric aggregates only")?;
    Ok(Plan::Arith {
        op,
        left,
        right,
        kind,
    })
}

/// The type OID of an arithmetic result.
pub(super) fn arith_oid(kind: Kind) -> u32 {
    match kind {
        Kind::Int2 => 21,
        Kind::Int4 => 23,
        Kind::Int8 => 20,
        _ => 1700,
    }
}

pub(super) fn type_name(col: &Column) -> String {
    format!(
        "column \"{}\" (type OID {})",
        String::from_utf8_lossy(&col.name),
        col.type_oid
    )
}

pub(super) fn check_group_key(col: &Column) -> Result<(), MergeError> {
    match Kind::of(col.type_oid) {
        Some(
            Kind::Int2
            | Kind::Int4
            | Kind::Int8
            | Kind::Oid
            | Kind::Bool
            | Kind::Text { .. }
            | Kind::Uuid
            | Kind::Date(DateKind::Date | DateKind::Timestamp),
        ) => Ok(()),
        // Text timestamptz depends on each session's TimeZone; binary is an absolute instant.
        Some(Kind::Date(DateKind::TimestampTz)) if col.binary => Ok(()),
        Some(Kind::Float4 | Kind::Float8 | Kind::Numeric) => Err(format!(
            "GROUP BY {} across shards: equal values can differ in bytes (1.0 and 1.00)",
            type_name(col)
        )
        .into()),
        _ => Err(format!("GROUP BY {} is not supported across shards", type_name(col)).into()),
    }
}

pub(super) fn plan_agg(
    op: AggOp,
    i: usize,
    col: &Column,
    text_bytewise: bool,
) -> Result<Plan, MergeError> {
    let kind = Kind::of(col.type_oid);
    Ok(match op {
        AggOp::Count if kind == Some(Kind::Int8) => Plan::Count(i),
        AggOp::Count => return Err("count() column is not a bigint".into()),
        AggOp::Sum => match kind {
            // sum(int2/int4) is a bigint; sum(int8) is numeric.
            Some(Kind::Int8) => Plan::SumInt(i),
            Some(Kind::Numeric) => Plan::SumNumeric(i),
            Some(Kind::Float8) => Plan::SumFloat8(i),
            Some(Kind::Float4) => Plan::SumFloat4(i),
            _ => {
                return Err(
                    format!("sum() of {} cannot be merged across shards", type_name(col)).into(),
                )
            }
        },
        AggOp::Min | AggOp::Max => Plan::Extreme {
            column: i,
            kind: value::check_comparable(col, text_bytewise)?,
            max: op == AggOp::Max,
        },
    })
}

pub(super) fn plan_avg(
    sum: usize,
    sum_col: &Column,
    count: usize,
    count_col: &Column,
) -> Result<Plan, MergeError> {
    if Kind::of(count_col.type_oid) != Some(Kind::Int8) {
        return Err("avg(): the count column is not a bigint".into());
    }
    match Kind::of(sum_col.type_oid) {
        // avg of integers and numeric is numeric, sent in the sum column's format.
        Some(sum_kind @ (Kind::Int8 | Kind::Numeric)) => Ok(Plan::AvgNumeric {
            sum,
            count,
            sum_kind,
        }),
        Some(Kind::Float8) => Ok(Plan::AvgFloat8 { sum, count }),
        Some(Kind::Float4) => Err(
            "avg(real) across shards: the shards' real sums lose the precision avg keeps".into(),
        ),
        _ => Err(format!(
            "avg() of {} cannot be merged across shards",
            type_name(sum_col)
        )
        .into()),
    }
}

pub(super) fn plan_dispersion(
    kind: Dispersion,
    [count, sum, squares]: [usize; 3],
    [count_col, sum_col, squares_col]: [&Column; 3],
) -> Result<Plan, MergeError> {
    if Kind::of(count_col.type_oid) != Some(Kind::Int8)
        || Kind::of(squares_col.type_oid) != Some(Kind::Numeric)
    {
        return Err(
            "variance/stddev: the shards' count and sum of squares are not bigint and numeric"
                .into(),
        );
    }
    match Kind::of(sum_col.type_oid) {
        // Of integers (sum: bigint or numeric) and numeric: exact.
        Some(sum_kind @ (Kind::Int8 | Kind::Numeric)) => Ok(Plan::Dispersion {
            kind,
            count,
            sum,
            squares,
            sum_kind,
        }),
        _ => Err(format!(
            "variance and stddev of {} cannot be merged across shards exactly (Postgres computes them in floating point, in an order the shards cannot reproduce)",
            type_name(sum_col)
        )
        .into()),
    }
}
