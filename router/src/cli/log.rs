//! The router's log, set up once at start: text with colours only on a terminal (a file or a
//! pipe gets plain text), or with `[log] format = "json"` one JSON object per line for a
//! fleet's log pipeline, each carrying the router's id (`router_id`) beside the event's own
//! fields (the client's `peer`, the `shard`, where the event has them).

use std::fmt;
use std::io::IsTerminal;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{self, Format, FormatEvent, FormatFields, Json, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber.
pub fn init(filter: EnvFilter, format: LogFormat, router_id: u8) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .fmt_fields(format::JsonFields::new())
            .event_format(WithRouter {
                inner: format::format()
                    .json()
                    .flatten_event(true)
                    .with_target(false),
                router_id,
            })
            .init(),
    }
}

/// JSON lines with `"router_id":N` first.
struct WithRouter {
    inner: Format<Json>,
    router_id: u8,
}

impl<S, N> FormatEvent<S, N> for WithRouter
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // Logging is far from the hot path: one String per line is fine.
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"router_id\":{},{rest}", self.router_id),
            None => writer.write_str(&line),
        }
    }
}
