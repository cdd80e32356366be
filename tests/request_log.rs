//! The request log as the UI and the CLI read it: honest paging through `/admin/requests` (every
//! row once, in order, with the count and the cursor), search by request id, one request's
//! attempts, per-model and per-node summaries from known rows, and `corral history` saying on
//! stderr when `--limit` stopped it.

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use common::{cluster, temp_db};
use corral::store::{count_requests, now_ms, FailedAttempt, Query, RequestRow, Store};
use reqwest::Method;
use serde_json::Value;

fn row(id: &str, started_at: i64) -> RequestRow {
    RequestRow {
        id: id.into(),
        started_at,
        finished_at: Some(started_at + 50),
        endpoint: "/api/chat".into(),
        category: "default".into(),
        origin: "local".into(),
        model: "llama3.2".into(),
        node: Some("n0".into()),
        attempts: 1,
        status: "ok".into(),
        http_status: Some(200),
        total_ms: Some(50),
        ..RequestRow::default()
    }
}

/// Hand `rows` to the store's writer and wait until all of them are in the file.
async fn insert(store: &Store, rows: Vec<RequestRow>) {
    let want = count_requests(store.pool(), &Query::default()).await.expect("count") + rows.len() as i64;
    for r in rows {
        store.finished(r);
    }
    for _ in 0..500 {
        if count_requests(store.pool(), &Query::default()).await.expect("count") >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the writer did not flush {want} rows within 5 s");
}

async fn get(c: &common::Cluster, path: &str) -> (u16, Value) {
    let r = c.admin(Method::GET, path).send().await.expect("admin answers");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

fn ids(page: &Value) -> Vec<String> {
    page["requests"].as_array().expect("requests").iter().map(|r| r["id"].as_str().unwrap_or_default().into()).collect()
}

#[tokio::test]
async fn paging_walks_every_row_once_newest_first_and_says_how_many() {
    let c = cluster(1).start().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let base = now_ms() - 60_000;
    // 250 rows, three to a millisecond, so pages end inside a tie as well as between times.
    let rows: Vec<RequestRow> = (0..250).map(|i| row(&format!("r{i:03}"), base - (i / 3) * 10)).collect();
    let mut expected: Vec<(i64, String)> = rows.iter().map(|r| (r.started_at, r.id.clone())).collect();
    expected.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    insert(&store, rows).await;

    let (status, first) = get(&c, "/admin/requests?limit=100").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        (first["total"].as_i64(), first["more"].as_bool(), first["limit"].as_i64()),
        (Some(250), Some(true), Some(100))
    );
    // Rows written after the first page are newer: they must not shift the pages that follow.
    insert(&store, (0..5).map(|i| row(&format!("late{i}"), now_ms())).collect()).await;
    let mut seen = ids(&first);
    let mut page = first;
    let mut sizes = vec![seen.len()];
    while page["more"] == true {
        let cursor = page["next_before"].as_str().expect("a cursor while there are more").to_string();
        let (status, next) = get(&c, &format!("/admin/requests?limit=100&before={cursor}")).await;
        assert_eq!(status, 200, "{next}");
        sizes.push(ids(&next).len());
        seen.extend(ids(&next));
        page = next;
        assert!(sizes.len() < 10, "paging ends");
    }
    assert_eq!(sizes, [100, 100, 50]);
    assert!(page["next_before"].is_null(), "no cursor on the last page");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 250, "no row twice");
    assert_eq!(seen, expected.into_iter().map(|e| e.1).collect::<Vec<_>>(), "newest first, ties by id");
    let (_, now) = get(&c, "/admin/requests?limit=1").await;
    assert_eq!(now["total"], 255, "the count follows what is there now");

    let (status, bad) = get(&c, "/admin/requests?before=nonsense").await;
    assert_eq!((status, bad["code"].as_str()), (400, Some("bad_query")), "{bad}");
    assert!(bad["error"].as_str().is_some_and(|e| e.contains("before=\"nonsense\"")), "{bad}");
    for limit in ["0", "-1"] {
        let (status, bad) = get(&c, &format!("/admin/requests?limit={limit}")).await;
        assert_eq!((status, bad["code"].as_str()), (400, Some("bad_query")), "limit={limit}: {bad}");
    }
}

#[tokio::test]
async fn filters_narrow_the_count_and_the_rows_together() {
    let c = cluster(1).start().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let now = now_ms();
    let rows = (0..30)
        .map(|i| {
            let mut r = row(&format!("f{i:02}"), now - i * 1000);
            r.node = Some(format!("n{}", i % 3));
            r.model = if i % 2 == 0 { "qwen3:4b".into() } else { "llama3.2".into() };
            if i % 5 == 0 {
                r.status = "error".into();
            }
            r
        })
        .collect();
    insert(&store, rows).await;
    let (_, v) = get(&c, "/admin/requests?node=n1&model=qwen3:4b&limit=2").await;
    // i % 3 == 1 and i even: 4, 10, 16, 22, 28.
    assert_eq!((v["total"].as_i64(), v["more"].as_bool()), (Some(5), Some(true)));
    assert_eq!(ids(&v), ["f04", "f10"]);
    let (_, v) = get(&c, "/admin/requests?status=error&node=").await;
    assert_eq!(v["total"], 6, "an empty filter means any: {v}");
    assert_eq!(v["more"], false);
}

#[tokio::test]
async fn a_request_is_found_by_its_id_or_a_prefix_and_opens_with_its_attempts() {
    let c = cluster(2).policy(corral::config::Policy::RoundRobin).start().await;
    c.learn_models().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    // n0 fails every chat: a request that goes there first fails over to n1.
    c.sims[0].set_faults(corral::sim::Faults::statuses(500, 100));
    let mut failed_over = None;
    for _ in 0..6 {
        let r = c.chat("llama3.2", false).await;
        let attempts = r.headers().get("x-corral-attempts").and_then(|v| v.to_str().ok()).unwrap_or("1").to_string();
        let id = r.headers()["x-corral-request-id"].to_str().expect("id").to_string();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        if attempts == "2" {
            failed_over = Some(id);
            break;
        }
    }
    let id = failed_over.expect("round robin sends one of six chats to n0 first");
    let mut detail = Value::Null;
    for _ in 0..500 {
        let (status, v) = get(&c, &format!("/admin/requests/{id}")).await;
        if status == 200 && v["request"]["status"] != "running" {
            detail = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let attempts = detail["attempts"].as_array().unwrap_or_else(|| panic!("attempts: {detail}"));
    let seen: Vec<(i64, &str)> =
        attempts.iter().map(|a| (a["n"].as_i64().unwrap_or(0), a["node"].as_str().unwrap_or_default())).collect();
    assert_eq!(seen, [(1, "n0"), (2, "n1")], "{detail}");
    assert_ne!(attempts[0]["outcome"], "ok");
    assert!(attempts[0]["detail"].as_str().is_some_and(|d| !d.is_empty()), "the failure says why: {detail}");
    assert_eq!((attempts[1]["outcome"].as_str(), attempts[1]["http_status"].as_i64()), (Some("ok"), Some(200)));
    assert!(attempts[1]["total_ms"].is_i64(), "the answer's timings: {detail}");

    // Rows of our own whose ids share a start, and one whose client id does.
    let mut with_client_id = row("zz-other", now_ms());
    with_client_id.client_request_id = Some("abc-client-7".into());
    with_client_id.failed_attempts =
        vec![FailedAttempt { node: "n1".into(), outcome: "silent".into(), detail: "no first byte in 2 s".into() }];
    with_client_id.attempts = 2;
    insert(&store, vec![row("abc-1", now_ms()), row("abc-2", now_ms()), row("abd-1", now_ms()), with_client_id]).await;
    let (_, v) = get(&c, &format!("/admin/requests?id={id}")).await;
    assert_eq!(ids(&v), std::slice::from_ref(&id), "an exact id finds that request");
    let (_, v) = get(&c, &format!("/admin/requests?id={}", &id[..8])).await;
    assert!(ids(&v).contains(&id), "a prefix of it too");
    let (_, v) = get(&c, "/admin/requests?id=abc").await;
    let mut found = ids(&v);
    found.sort();
    assert_eq!(found, ["abc-1", "abc-2", "zz-other"], "Corral's id or the client's X-Request-Id");
    let (_, v) = get(&c, "/admin/requests?id=a_c").await;
    assert_eq!(v["total"], 0, "`_` is no wildcard: {v}");
    let (status, v) = get(&c, "/admin/requests/zz-other").await;
    assert_eq!(status, 200);
    let outcomes: Vec<&str> =
        v["attempts"].as_array().expect("attempts").iter().filter_map(|a| a["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["silent", "ok"]);
    let (status, v) = get(&c, "/admin/requests/no-such-id").await;
    assert_eq!((status, v["code"].as_str()), (404, Some("not_found")), "{v}");
}

#[tokio::test]
async fn summaries_per_model_and_per_node_are_computed_from_the_rows_in_range() {
    let c = cluster(1).start().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let now = now_ms();
    let mut rows = Vec::new();
    // llama3.2 on n0: ten answers of 100..1000 ms with 5 + i tokens out, 2 in; two on n1 fail.
    for i in 1..=10i64 {
        let mut r = row(&format!("a{i}"), now - i * 1000);
        r.total_ms = Some(i * 100);
        r.prompt_tokens = Some(2);
        r.completion_tokens = Some(5 + i);
        rows.push(r);
    }
    for i in 0..2 {
        let mut r = row(&format!("e{i}"), now - 500);
        r.node = Some("n1".into());
        r.status = "error".into();
        r.total_ms = Some(3000);
        rows.push(r);
    }
    // qwen3 answered by a cloud provider, and a request nothing answered.
    let mut cloud = row("c0", now - 200);
    (cloud.model, cloud.node, cloud.fallback, cloud.total_ms) =
        ("qwen3:4b".into(), None, Some("openai".into()), Some(700));
    let mut refused = row("x0", now - 100);
    (refused.model, refused.node, refused.status, refused.total_ms) =
        ("qwen3:4b".into(), None, "client_error".into(), Some(1));
    // Outside the range: two hours ago. Still running: not ended yet.
    let old = row("old", now - 2 * 3_600_000);
    let mut running = row("run", now - 50);
    (running.status, running.total_ms) = ("running".into(), None);
    rows.extend([cloud, refused, old, running]);
    insert(&store, rows).await;

    let (status, v) = get(&c, "/admin/requests/summary?range=1h&by=model").await;
    assert_eq!(status, 200, "{v}");
    let group = |v: &Value, key: Option<&str>| -> Value {
        v["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .find(|g| g["key"].as_str() == key)
            .cloned()
            .unwrap_or_else(|| panic!("no group {key:?}: {v}"))
    };
    let llama = group(&v, Some("llama3.2"));
    assert_eq!((llama["requests"].as_u64(), llama["errors"].as_u64()), (Some(12), Some(2)));
    // Sorted: 100..1000, 3000, 3000; nearest rank round(0.5 * 11) = 6 -> 700, round(0.95 * 11) = 10 -> 3000.
    assert_eq!((llama["p50_ms"].as_f64(), llama["p95_ms"].as_f64()), (Some(700.0), Some(3000.0)));
    assert_eq!((llama["prompt_tokens"].as_i64(), llama["completion_tokens"].as_i64()), (Some(20), Some(105)));
    let qwen = group(&v, Some("qwen3:4b"));
    assert_eq!(
        (qwen["requests"].as_u64(), qwen["errors"].as_u64(), qwen["client_errors"].as_u64()),
        (Some(2), Some(0), Some(1))
    );
    assert_eq!(v["all"]["requests"], 14, "the old and the running rows are left out: {v}");

    let (_, v) = get(&c, "/admin/requests/summary?range=1h&by=node").await;
    assert_eq!(group(&v, Some("n0"))["requests"], 10);
    let n1 = group(&v, Some("n1"));
    assert_eq!((n1["errors"].as_u64(), n1["p50_ms"].as_f64()), (Some(2), Some(3000.0)));
    assert_eq!(group(&v, Some("cloud:openai"))["p95_ms"], 700.0);
    assert_eq!(group(&v, None)["client_errors"], 1, "a request no node answered has a group of its own");
    let (_, v) = get(&c, "/admin/requests/summary?range=5m&by=node").await;
    assert_eq!(v["all"]["requests"], 14, "everything above is within 5 minutes");
    let (status, v) = get(&c, "/admin/requests/summary?by=category").await;
    assert_eq!(status, 400, "{v}");
}

#[tokio::test]
async fn history_says_on_stderr_when_limit_stopped_it_whatever_the_format() {
    let path = temp_db();
    let config = corral::config::StoreConfig { path: Some(path.display().to_string()), ..Default::default() };
    let (store, tasks) = Store::open(&config, tokio_util::sync::CancellationToken::new()).await.expect("open");
    let _writer = tokio::spawn(tasks.writer);
    let now = now_ms();
    insert(&store, (0..12).map(|i| row(&format!("h{i:02}"), now - i * 1000)).collect()).await;
    let db = path.display().to_string();
    let history = |limit: &str, format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["history", "--db", &db, "--since", "1h", "--limit", limit, "--format", format])
            .env("NO_COLOR", "1")
            .output()
            .expect("corral runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let note = "showing the newest 5 of 12; --limit N for more";
    let (out, err) = history("5", "json");
    let rows: Vec<Value> = serde_json::from_str(&out).expect("stdout is JSON only");
    assert_eq!(rows.len(), 5);
    assert_eq!(rows[0]["id"], "h00", "the newest");
    assert!(err.contains(note), "stderr: {err}");
    let (out, err) = history("5", "csv");
    assert_eq!(out.lines().count(), 6, "a header and five rows, nothing else: {out}");
    assert!(err.contains(note), "stderr: {err}");
    let (out, err) = history("5", "table");
    assert!(out.trim_end().ends_with("5 request(s)"), "{out}");
    assert!(err.contains(note), "stderr: {err}");
    let (out, err) = history("12", "json");
    assert_eq!(serde_json::from_str::<Vec<Value>>(&out).expect("json").len(), 12);
    assert!(!err.contains("showing"), "nothing was left out, so nothing is said: {err}");
}

/// The request path made cheap stays complete (issue 16): 600 requests from 24 clients at once
/// through a real `corral serve` with its shipped defaults (store on, summary line at info), a
/// mix of non-streamed and streamed native chat, a generate stream and `/v1`, each get exactly
/// one row in the store and exactly one `request finished` line, under the id Corral gave it.
#[tokio::test(flavor = "multi_thread")]
async fn under_load_every_request_gets_one_row_and_one_log_line() {
    let db = temp_db();
    let (_sim, mut serve, base) = common::process::serve_before_a_sim(&db, "info");
    let client = reqwest::Client::new();
    let asks = [
        (
            "/api/chat",
            serde_json::json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 4}}),
        ),
        (
            "/api/chat",
            serde_json::json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 4}}),
        ),
        ("/api/generate", serde_json::json!({"model": "llama3.2", "prompt": "hi", "options": {"num_predict": 4}})),
        (
            "/v1/chat/completions",
            serde_json::json!({"model": "llama3.2", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ];
    let clients = (0..24).map(|c| {
        let (client, base, asks) = (client.clone(), base.clone(), asks.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..25 {
                let (path, body) = &asks[(c + i) % asks.len()];
                let r = client.post(format!("{base}{path}")).json(body).send().await.expect("answer");
                assert_eq!(r.status(), 200, "{path}");
                let id = r.headers()["x-corral-request-id"].to_str().expect("id").to_string();
                r.bytes().await.expect("whole body");
                ids.push(id);
            }
            ids
        })
    });
    let mut sent = Vec::new();
    for c in clients {
        sent.extend(c.await.expect("client"));
    }
    let sent_set: HashSet<&String> = sent.iter().collect();
    assert_eq!(sent_set.len(), 600, "600 answers, each with its own id");
    // A clean stop writes what the store and the log writer still hold.
    serve.signal("-TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(0), "the broker stops cleanly");
    let logged: Vec<String> = serve
        .rest_of_output()
        .into_iter()
        .filter(|l| l.contains("request finished"))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")).map(str::to_string))
        .collect();
    let pool = corral::store::open_pool(&db, true).await.expect("open read-only");
    let rows = corral::store::query_requests(&pool, &Query { limit: Some(10_000), ..Default::default() })
        .await
        .expect("query");
    let row_ids: Vec<&String> = rows.iter().map(|r| &r.id).collect();
    assert_eq!(rows.len(), 600, "one row per request");
    assert_eq!(row_ids.iter().copied().collect::<HashSet<_>>(), sent_set, "the rows are the requests answered");
    assert!(rows.iter().all(|r| r.status == "ok" && r.node.as_deref() == Some("n0")), "each row complete");
    assert!(rows.iter().all(|r| r.completion_tokens == Some(4)), "each row has its token count");
    assert_eq!(logged.len(), 600, "one log line per request");
    assert_eq!(logged.iter().collect::<HashSet<_>>(), sent_set, "the lines are the requests answered");
}
