//! The HTTP side port (`[http] listen`): `GET /metrics` (Prometheus text), `GET /health` (200
//! while the process serves), `GET /ready` (200 once every shard has answered, 503 before and
//! while draining). It runs on the main thread's runtime, away from the workers, and stays up
//! through a drain so a load balancer sees `/ready` turn 503.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::routing::snapshot;
use crate::routing::Router;
use crate::stats::exposition;

/// Connections served at once.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send its request's head.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds the side port (so a bad address fails the start at once).
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| format!("cannot listen for HTTP on {addr}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot listen for HTTP on {addr}: {e}"))?;
    Ok(listener)
}

/// Serves HTTP requests until the process exits.
pub async fn serve(listener: std::net::TcpListener, shared: Arc<Router>) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot use the HTTP listener: {e}");
            return;
        }
    };
    // Scrapers and load balancers need a handful; more is someone else's problem, and each
    // one holds a file descriptor the client port needs too.
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("HTTP accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("HTTP: {MAX_CONNECTIONS} connections open already; closing a new one");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(answer(&shared, &req).await) }
            });
            // Without a timer hyper applies no header timeout: a client that never finishes
            // its request would hold the connection for good.
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("HTTP connection: {e}");
            }
        });
    }
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

async fn answer(shared: &Router, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET is served\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            exposition::render(snapshot::snapshot(shared).await),
        ),
        "/health" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/ready" => {
            if shared.is_ready() {
                text(StatusCode::OK, PLAIN, "ready\n".into())
            } else {
                let why = match shared.lifecycle.phase() {
                    crate::routing::Phase::Serving => "not every shard has answered yet",
                    _ => "draining",
                };
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, format!("{why}\n"))
            }
        }
        other => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            format!("no {other} here; try /metrics, /health or /ready\n"),
        ),
    }
}
