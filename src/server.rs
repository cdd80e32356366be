//! The HTTP server under every listener: hyper (HTTP/1.1 and h2c) with the protections
//! `axum::serve` leaves out. A client must finish its request headers within
//! `proxy.header_read_timeout_ms` (slowloris: a connection trickling headers would otherwise
//! hold a socket and a task forever), and shutdown is graceful: the listener stops accepting,
//! requests in flight finish, idle keep-alive connections close.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Serve `app` on `listener` until `stop`, then let open requests finish.
pub async fn serve(listener: TcpListener, app: axum::Router, header_read_timeout: Duration, stop: CancellationToken) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    // Many clients multiplex over a few h2c connections: let a connection carry as many
    // requests as the queue can hold, not h2's conservative default.
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(4096);
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Small writes (a token, a chunk terminator) must not wait for Nagle + delayed ACK.
        let _ = tcp.set_nodelay(true);
        let service = app.clone().map_request(|req: Request<Incoming>| req.map(Body::new));
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), TowerToHyperService::new(service));
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
