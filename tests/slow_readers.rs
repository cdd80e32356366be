//! Slow readers never hold a GPU slot (`proxy::readahead`): a client that reads a stream slower
//! than the node produces it gets the rest from Corral's bounded read-ahead buffer, so the
//! node's slot frees when the node finishes, and the next queued request starts then, not when
//! the slow client is done. The record keeps both times.
//!
//! The slow client is a raw socket with a 4 KiB receive buffer that reads nothing after the
//! response head until the second request has been answered. The answer (~29 MB: 200,000
//! tokens) is bigger than every socket buffer on the way, so without read-ahead the node could
//! not finish it and the second request would wait in the queue (`stream_buffer_bytes = 0`
//! makes this test fail: the second request gets 503 after its queue timeout).

mod common;

use std::time::Duration;

use common::{cluster, eventually, Cluster};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKENS: u64 = 200_000;
/// Room for the whole answer (with `0`, read-ahead off, the first test fails: the node never finishes).
const BUF: usize = 64 << 20;

async fn one_slot_cluster(buffer: usize) -> Cluster {
    let c = cluster(1)
        .spec(0, |s| {
            s.tps = 0.0;
            s.ttft = Duration::ZERO;
        })
        .config(move |cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.proxy.stream_buffer_bytes = buffer;
            cfg.proxy.stream_buffer_total_bytes = 2 * buffer.max(1);
            cfg.categories[0].queue_timeout_ms = 15_000;
        })
        .start()
        .await;
    c.learn_models().await;
    c
}

/// Send a streamed chat for `TOKENS` tokens on a socket that barely reads; returns the socket
/// once the response head is in.
async fn stalled_stream(c: &Cluster) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small receive buffer");
    let mut s = socket.connect(c.broker.proxy_addr()).await.expect("connect");
    let body = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "a long story"}],
        "stream": true, "options": {"num_predict": TOKENS}})
    .to_string();
    let head = format!(
        "POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Request-Id: slow-reader\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("send head");
    s.write_all(body.as_bytes()).await.expect("send body");
    let mut first = [0u8; 512];
    let n = s.read(&mut first).await.expect("response head");
    assert!(first[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&first[..n]));
    s
}

/// The slow request's record, once it is finished.
async fn record(c: &Cluster) -> Value {
    for _ in 0..200 {
        let page: Value = c
            .admin(reqwest::Method::GET, "/admin/requests?limit=10")
            .send()
            .await
            .expect("requests")
            .json()
            .await
            .expect("json");
        let rows = page["requests"].as_array().cloned().unwrap_or_default();
        if let Some(r) = rows.into_iter().find(|r| r["client_request_id"] == "slow-reader" && r["status"] != "running")
        {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the slow request was never recorded");
}

/// Read the rest of the chunked NDJSON answer and return its last line.
///
/// The stall is over (the node finished while the client read nothing), so the socket gets a
/// normal receive buffer first: draining 29 MB through a 4 KiB window is ~7,000 window updates,
/// each a wake-up of both ends, which a loaded CI machine once stretched past a minute. A
/// timeout says how far it got and what Corral still held, which tells a stall in the kernel's
/// window from one in the read-ahead.
async fn drain(c: &Cluster, mut s: tokio::net::TcpStream) -> Value {
    socket2::SockRef::from(&s).set_recv_buffer_size(4 << 20).expect("normal receive buffer");
    let mut all = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = s.read(&mut buf).await.expect("read");
            all.extend_from_slice(&buf[..n]);
            if n == 0 || all.ends_with(b"\r\n0\r\n\r\n") {
                break;
            }
        }
    });
    if read.await.is_err() {
        let held = c.broker.shared().read_ahead_use().0;
        panic!(
            "the rest of the answer did not arrive in 60 s: {} bytes read, {held} bytes still in read-ahead",
            all.len()
        );
    }
    let text = String::from_utf8_lossy(&all);
    let last = text.lines().rev().find(|l| l.starts_with('{')).expect("an NDJSON line");
    serde_json::from_str(last).expect("last line is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_reader_frees_the_nodes_slot_when_the_node_finishes() {
    let c = one_slot_cluster(BUF).await;
    let slow = stalled_stream(&c).await;
    // The node finishes its answer into Corral's buffer while the client reads nothing.
    assert!(
        eventually(Duration::from_secs(30), || c.sims[0].completed() == 1).await,
        "the node finished the long answer"
    );
    assert!(eventually(Duration::from_secs(5), || c.node(0).in_flight() == 0).await, "its slot is free");
    let status: Value =
        c.admin(reqwest::Method::GET, "/admin/status").send().await.expect("status").json().await.expect("json");
    let held = status["read_ahead"]["bytes"].as_u64().expect("read_ahead.bytes");
    assert!(held > 8 << 20, "most of the answer waits in the read-ahead buffer: {held} bytes");
    // The next request (queued behind the slow one's slot without read-ahead) runs now.
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // The slow client still gets the whole answer, then the buffer is empty again.
    let last = drain(&c, slow).await;
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["eval_count"], TOKENS, "{last}");
    assert!(
        eventually(Duration::from_secs(5), || c.broker.shared().read_ahead_use().0 == 0).await,
        "buffer given back"
    );
    let row = record(&c).await;
    assert_eq!(row["status"], "ok", "{row}");
    let (node, total) =
        (row["node_done_ms"].as_i64().expect("node_done_ms"), row["total_ms"].as_i64().expect("total_ms"));
    assert!(node < total, "the node was done ({node} ms) before the client ({total} ms)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_with_the_answer_buffered_is_recorded_cancelled_and_frees_the_buffer() {
    let c = one_slot_cluster(BUF).await;
    let slow = stalled_stream(&c).await;
    assert!(eventually(Duration::from_secs(30), || c.sims[0].completed() == 1).await, "the node finished");
    assert!(c.broker.shared().read_ahead_use().0 > 0, "the answer is held for the client");
    drop(slow);
    assert!(
        eventually(Duration::from_secs(5), || c.broker.shared().read_ahead_use().0 == 0).await,
        "buffer given back"
    );
    let row = record(&c).await;
    assert_eq!(row["status"], "cancelled", "the client never had the whole answer: {row}");
    assert!(row["node_done_ms"].as_i64().is_some(), "the node's finish is kept: {row}");
}
