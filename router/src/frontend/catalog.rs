//! What the router learns from a shard's catalog: where each sharded table's key sits among its
//! columns, so that `INSERT INTO kv VALUES (...)` without a column list can be routed. Every
//! shard has the same schema (DDL on sharded tables reaches all of them), so the default shard
//! answers for all. Learned at start and again after each DDL that the router broadcasts.

use std::collections::HashMap;

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::settings::quote_literal;
use crate::protocol::frame::{begin_frame, end_frame, next_frame};
use crate::shared::Shared;

/// Reads the column order of every sharded table and hands the key positions to the planner.
/// A shard that cannot be asked leaves the planner as it was (INSERTs then need a column list).
pub async fn learn_key_positions(shared: &Shared) {
    let shard = shared.map.default_shard();
    let Ok(mut conn) = shared.checkout(shard).await else {
        return;
    };
    let mut positions = HashMap::new();
    for table in shared.map.tables() {
        let name = table.qualified_name();
        // RESET ALL first: a client's search_path on this pooled connection must not decide
        // which table an unqualified name means.
        let sql = format!(
            "RESET ALL; SELECT attname FROM pg_attribute WHERE attrelid = to_regclass({}) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            quote_literal(&name)
        );
        conn.settings_fp = 0;
        match first_column(&mut conn, &sql).await {
            Ok(columns) => {
                if let Some(p) = columns.iter().position(|c| *c == table.key) {
                    positions.insert(name, p);
                }
            }
            Err(e) => {
                tracing::warn!("could not read the column order of {name}: {e}");
                conn.broken = true;
                return;
            }
        }
    }
    tracing::debug!(tables = positions.len(), "learned key positions");
    shared.planner.learn_key_positions(positions);
}

/// The first column of every row of a simple query, as text (empty when it fails).
async fn first_column(
    conn: &mut crate::backend::BackendConn,
    sql: &str,
) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let at = begin_frame(&mut out, b'Q');
    out.extend_from_slice(sql.as_bytes());
    out.push(0);
    end_frame(&mut out, at);
    conn.stream.write_all(&out).await?;
    let mut values = Vec::new();
    loop {
        while let Some(h) = next_frame(&conn.rbuf).map_err(std::io::Error::other)? {
            let body = &conn.rbuf[5..h.total];
            match conn.rbuf[0] {
                b'D' if body.len() >= 6 => {
                    let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                    if let Some(v) = usize::try_from(len).ok().and_then(|n| body.get(6..6 + n)) {
                        values.push(String::from_utf8_lossy(v).into_owned());
                    }
                }
                b'E' => values.clear(),
                b'Z' => {
                    conn.rbuf.advance(h.total);
                    return Ok(values);
                }
                _ => {}
            }
            conn.rbuf.advance(h.total);
        }
        if conn.stream.read_buf(&mut conn.rbuf).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
    }
}
