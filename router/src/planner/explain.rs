//! `EXPLAIN statement` (and `EXPLAIN (ROUTE)`): where the plain statement would run decides
//! where its plan is made; a statement on several shards is explained on each (its plans
//! labelled by shard), and what `ANALYZE` would run without its all-or-nothing commit (a write
//! on several shards, a write of a reference table, a write that keeps lookup rows) is refused.

use super::{Merge, Route};

/// `EXPLAIN` of a statement that routes as `inner`. `EXPLAIN (ROUTE)` is the router's own: it
/// answers where the statement would go. A plain `EXPLAIN` of a statement on one shard runs
/// there; of one on several shards, on each of them, every shard's plan under a line naming the
/// shard (plans are never merged or sorted as if they were rows). `EXPLAIN ANALYZE` runs the
/// statement, so for a write on several shards it is refused: each shard would apply its part
/// without the all-or-nothing commit.
pub(super) fn explain(
    inner: Route,
    analyze: bool,
    options: Option<&[sqlparser::ast::UtilityOption]>,
) -> Route {
    let option = |name: &str| {
        options
            .unwrap_or_default()
            .iter()
            .any(|o| o.name.value.eq_ignore_ascii_case(name))
    };
    if option("route") {
        return Route::ExplainRoute(Box::new(inner));
    }
    let analyze = analyze || option("analyze");
    let writes = |merge: &Merge| {
        matches!(
            merge,
            Merge::Write | Merge::SplitRows | Merge::SplitUnnest { .. }
        )
    };
    let refuse_write = || {
        Route::Unroutable {
        message: "EXPLAIN ANALYZE runs the statement, and a write on several shards would then be applied on each without the all-or-nothing commit: EXPLAIN it without ANALYZE, or on one shard with /* shard: RANGE */".into(),
    }
    };
    match inner {
        Route::Scatter { table, .. } => Route::Scatter {
            table,
            merge: Merge::Explain,
        },
        Route::ScatterWrite { .. } if analyze => refuse_write(),
        Route::ScatterWrite { table, .. } => Route::Scatter {
            table,
            merge: Merge::Explain,
        },
        Route::Keyed {
            spread: Some(m), ..
        } if analyze && writes(&m) => refuse_write(),
        Route::Keyed {
            table,
            key,
            key_type,
            keys,
            spread: Some(_),
        } => Route::Keyed {
            table,
            key,
            key_type,
            keys,
            spread: Some(Merge::Explain),
        },
        Route::CopyIn(_) => Route::Unroutable {
            message: "EXPLAIN of COPY is not a thing Postgres does".into(),
        },
        // A reference table's write plans alike on every shard; run on one, it would make
        // that shard's copy differ.
        Route::Replicated { .. } if analyze => refuse_write(),
        Route::Replicated { .. } => Route::Any,
        // A write that keeps lookup rows runs as more than the client's statement.
        Route::WithLookups { .. } | Route::DeletesLookups { .. } | Route::UpdatesLookups { .. }
            if analyze =>
        {
            Route::Unroutable {
                message: "EXPLAIN ANALYZE of a write that changes lookup columns would run it without its lookup rows: EXPLAIN it without ANALYZE".into(),
            }
        }
        Route::WithLookups { route, .. }
        | Route::DeletesLookups { route, .. }
        | Route::UpdatesLookups { route, .. } => explain(*route, false, None),
        // Planned, not run: where the rows are is the lookup row's business.
        Route::Lookup { without, .. } => explain(*without, analyze, options),
        other => other,
    }
}
