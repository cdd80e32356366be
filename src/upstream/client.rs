//! The request path's HTTP client: plain-`http` nodes through `h1`'s inline HTTP/1.1 (one
//! keep-alive pool per host and port, `TCP_NODELAY`), `https` nodes through hyper's pooled
//! client with rustls.
//!
//! Why not reqwest, as the probes and the cloud fallback use: on every forwarded request it
//! re-parsed the node's URL into a URI, ran its redirect policy and built its own request
//! type, about a tenth of the broker's CPU per request in a profile (issue 16). A node's
//! redirect is its answer, relayed as it is, never followed: a node that redirects Corral's
//! request elsewhere must not make Corral send the request body there. And `HTTP_PROXY` from
//! the environment does not apply: the cluster's nodes are reached directly, so a sensitive
//! request never passes a proxy nobody configured for it.
//!
//! The answer comes back as a `reqwest::Response` (wrapping hyper's body, no copy), so
//! everything that reads answers reads node and cloud answers alike.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long an idle connection to a node is kept for the next request.
const IDLE: Duration = Duration::from_secs(60);

/// A request for a node: head and whole body (Corral has read the client's body already).
pub type NodeRequest = http::Request<Bytes>;

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up TLS for nodes: {0}")]
pub struct ClientError(#[from] rustls::Error);

pub use super::h1::ExchangeError;

/// The pooled client; cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct NodeClient {
    plain: Arc<super::h1::Pool>,
    tls: hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// Put on every answer before it becomes a `reqwest::Response`, which otherwise parses a
    /// placeholder URL for each one (3% of a forwarded request's instructions, issue 16).
    answered: http::Extensions,
}

/// The URL a node's `reqwest::Response` carries, as reqwest itself gives an answer it did not
/// fetch: nothing reads it.
const ANSWER_URL: &str = "http://no.url.provided.local";

/// The extensions an answer gets: just its URL, parsed once here.
fn answered_extensions() -> http::Extensions {
    use reqwest::ResponseBuilderExt as _;
    let Ok(url) = url::Url::parse(ANSWER_URL) else { return http::Extensions::new() };
    match http::Response::builder().url(url).body(()) {
        Ok(mut proto) => std::mem::take(proto.extensions_mut()),
        Err(_) => http::Extensions::new(),
    }
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient").finish_non_exhaustive()
    }
}

impl NodeClient {
    /// A client whose connects give up after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Result<Self, ClientError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let tls = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .build(https);
        let plain = super::h1::Pool::new(connect_timeout, IDLE);
        Ok(Self { plain, tls, answered: answered_extensions() })
    }

    /// Send `request` and wait for its answer's head.
    ///
    /// An `async move` block rather than an `async fn`: the block uses the request where it
    /// was captured, where an `async fn` would keep a second copy of it in its future.
    #[allow(clippy::manual_async_fn, reason = "an async fn would hold the request twice")]
    pub fn send(
        &self,
        request: NodeRequest,
    ) -> impl std::future::Future<Output = Result<reqwest::Response, ExchangeError>> + '_ {
        async move {
            let mut resp = match request.uri().scheme() == Some(&http::uri::Scheme::HTTP) {
                true => self.plain.send(&request).await?.map(reqwest::Body::wrap),
                false => self.send_tls(request).await?,
            };
            resp.extensions_mut().extend(self.answered.clone());
            Ok(reqwest::Response::from(resp))
        }
    }

    async fn send_tls(&self, request: NodeRequest) -> Result<http::Response<reqwest::Body>, ExchangeError> {
        match self.tls.request(request.map(Full::new)).await {
            Ok(resp) => Ok(resp.map(reqwest::Body::wrap)),
            Err(e) if e.is_connect() => Err(ExchangeError::Connect(super::root_cause(&e))),
            Err(e) => Err(ExchangeError::Failed(super::root_cause(&e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP/1.1 server: answers the first request with `answer`, hands back what it
    /// read.
    async fn one_answer(answer: &'static str) -> (std::net::SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"hello") {
                let n = s.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer.as_bytes()).await.expect("write");
            String::from_utf8_lossy(&got).into_owned()
        });
        (addr, served)
    }

    fn post(addr: std::net::SocketAddr) -> NodeRequest {
        http::Request::post(format!("http://{addr}/api/chat"))
            .header("x-request-id", "r1")
            .body(Bytes::from_static(b"hello"))
            .expect("request")
    }

    #[tokio::test]
    async fn a_request_goes_with_host_length_and_body_and_its_answer_reads_back() {
        let (addr, served) = one_answer("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let client = NodeClient::new(Duration::from_secs(1)).expect("client");
        let resp = client.send(post(addr)).await.expect("answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.url().as_str(),
            "http://no.url.provided.local/",
            "the URL reqwest gives an answer it did not fetch"
        );
        assert_eq!(resp.bytes().await.expect("body"), "ok");
        let request = served.await.expect("server").to_ascii_lowercase();
        assert!(request.starts_with("post /api/chat http/1.1\r\n"), "{request}");
        assert!(request.contains(&format!("host: {addr}\r\n")), "{request}");
        assert!(request.contains("content-length: 5\r\n") && request.contains("x-request-id: r1"), "{request}");
    }

    #[tokio::test]
    async fn a_redirect_is_the_nodes_answer_not_followed() {
        let (addr, _served) =
            one_answer("HTTP/1.1 307 Temporary Redirect\r\nlocation: http://192.0.2.1/\r\ncontent-length: 0\r\n\r\n")
                .await;
        let client = NodeClient::new(Duration::from_secs(1)).expect("client");
        let resp = client.send(post(addr)).await.expect("answer");
        assert_eq!(resp.status(), 307, "relayed, not followed to another host");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connect_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let client = NodeClient::new(Duration::from_secs(1)).expect("client");
        match client.send(post(addr)).await {
            Err(ExchangeError::Connect(why)) => assert!(why.to_lowercase().contains("refused"), "{why}"),
            other => panic!("expected a connect failure, got {other:?}"),
        }
    }
}
