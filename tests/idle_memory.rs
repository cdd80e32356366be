//! A broker that goes quiet after a burst gives the memory the burst freed back to the system
//! (issue 16: "resident memory idle after warm-up"), through a real `corral serve`.

mod common;

/// Anonymous resident memory of process `pid`, in KiB (`RssAnon` in `/proc/<pid>/status`).
fn rss_anon_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the broker runs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in status")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_quiet_after_a_burst_gives_freed_memory_back() {
    let (_sim, serve, base) = common::process::serve_before_a_sim(&common::temp_db(), "warn,corral=debug");
    // The first quiet second after start: what start-up freed goes back first.
    serve.wait_for("freed memory given back");
    let client = reqwest::Client::new();
    // Long prompts, as a RAG client sends: each request's body and its copies are heap.
    let prompt = "lorem ipsum dolor sit amet ".repeat(4096);
    let body = serde_json::json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": prompt}], "options": {"num_predict": 8}});
    let clients = (0..16).map(|_| {
        let (client, base, body) = (client.clone(), base.clone(), body.clone());
        tokio::spawn(async move {
            for _ in 0..40 {
                let r = client.post(format!("{base}/api/chat")).json(&body).send().await.expect("answer");
                assert_eq!(r.status(), 200);
                r.bytes().await.expect("whole body");
            }
        })
    });
    for c in clients {
        c.await.expect("client");
    }
    // The broker tells when it went quiet and how much it gave back (within two seconds: it
    // looks once a second).
    let line = serve.wait_for("freed memory given back");
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {line}"))
    };
    let (before, after) = (field("anon_kib_before="), field("anon_kib_after="));
    assert!(
        after + 128 <= before,
        "resident heap after 640 requests of 110 KB {before} KiB, given back to {after} KiB: {line}"
    );
    // And the process really is that much smaller, as /proc says from outside.
    assert!(rss_anon_kib(serve.child.id()) < before, "{line}");
}
