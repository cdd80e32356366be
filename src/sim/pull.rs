//! `POST /api/pull` on a simulated node, as Ollama pulls (ollama/ollama `server/images.go`
//! `PullModel`, `server/download.go`): `pulling manifest`, then each layer in turn with
//! `{"status": "pulling <digest[7:19]>", "digest", "total", "completed"}` every 60 ms (Ollama's
//! progress ticker), `verifying sha256 digest`, `writing manifest`, `success`. `completed` is
//! left out while 0 (`omitempty`).
//!
//! A layer already on disk is reported whole at once (Ollama's cache hit). A client that goes
//! away mid-pull stops the download, as in Ollama, where the pull runs under the request's
//! context: the bytes fetched so far are kept and the next pull resumes from them. The node
//! counts pulls streaming, completed and abandoned, and the bytes fetched (`/_sim/stats`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::catalog::{self, Origin};
use super::ollama::error;
use super::{Pace, Shared};

/// Ollama's progress ticker (`blobDownload.Wait`).
const TICK: Duration = Duration::from_millis(60);

/// One line of the pull, sent `after` the previous one; `layer` is the progress it reports.
struct Step {
    after: Duration,
    line: Value,
    layer: Option<(String, u64)>,
}

pub(super) async fn pull(s: Arc<Shared>, body: &Bytes) -> Response {
    let req = serde_json::from_slice::<Value>(body).ok();
    let model =
        req.as_ref().and_then(|v| v.get("model").or_else(|| v.get("name")).and_then(Value::as_str).map(str::to_string));
    let Some(model) = model else { return error(StatusCode::BAD_REQUEST, "model is required") };
    let stream = req.as_ref().and_then(|v| v.get("stream")).and_then(Value::as_bool).unwrap_or(true);
    let (pace, pull_ms, mut failure) = {
        let f = s.faults();
        (Pace::of(&s.spec, &f), f.pull_ms.unwrap_or(s.spec.pull_ms), f.fail_pulls.clone())
    };
    let known =
        |r: &Vec<String>| r.iter().any(|m| crate::config::normalize_model(m) == crate::config::normalize_model(&model));
    if s.spec.registry.as_ref().is_some_and(|r| !known(r)) {
        failure.get_or_insert_with(|| "pull model manifest: file does not exist".into());
    }
    if let Some(e) = failure {
        if !stream {
            return error(StatusCode::INTERNAL_SERVER_ERROR, &e);
        }
        let body = format!("{}\n{}\n", json!({"status": "pulling manifest"}), json!({ "error": e }));
        return (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    }
    // A pull always brings the registry's current revision.
    let origin = Origin::current(&crate::config::normalize_model(&model));
    let whole = if pull_ms > 0 { Duration::from_millis(pull_ms) } else { pace.per_token * 11 };
    let steps = plan(&s, &origin, whole);
    if !stream {
        tokio::time::sleep(steps.iter().map(|st| st.after).sum()).await;
        for st in &steps {
            record(&s, st);
        }
        s.add_model(&model);
        return axum::Json(json!({"status": "success"})).into_response();
    }
    let running = Running::new(Arc::clone(&s));
    let state = (VecDeque::from(steps), running, model);
    let body = futures_util::stream::unfold(state, |(mut steps, mut running, model)| async move {
        let step = steps.pop_front()?;
        tokio::time::sleep(step.after).await;
        record(&running.s, &step);
        if step.line["status"] == "success" {
            running.s.add_model(&model);
            running.succeeded();
        }
        let line = Bytes::from(format!("{}\n", step.line));
        Some((Ok::<_, Infallible>(line), (steps, running, model)))
    });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    r
}

/// Every line of a pull of `origin` taking `whole` for the bytes still missing, with when.
fn plan(s: &Shared, origin: &Origin, whole: Duration) -> Vec<Step> {
    let layers = catalog::layers(origin);
    let held = s.layers.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let missing: u64 = layers.iter().map(|l| l.size - held.get(&l.digest).copied().unwrap_or(0).min(l.size)).sum();
    let mut steps = vec![Step { after: Duration::ZERO, line: json!({"status": "pulling manifest"}), layer: None }];
    for l in layers {
        let start = held.get(&l.digest).copied().unwrap_or(0).min(l.size);
        let progress = |completed: u64| {
            let mut line =
                json!({"status": format!("pulling {}", &l.digest[7..19]), "digest": l.digest, "total": l.size});
            if completed > 0 {
                line["completed"] = json!(completed);
            }
            line
        };
        if start == l.size {
            steps.push(Step { after: Duration::ZERO, line: progress(l.size), layer: Some((l.digest.clone(), l.size)) });
            continue;
        }
        let share = if missing == 0 { 0.0 } else { (l.size - start) as f64 / missing as f64 };
        let takes = whole.mul_f64(share);
        let ticks = (takes.as_nanos() / TICK.as_nanos()).clamp(1, 10_000) as u64;
        steps.push(Step { after: Duration::ZERO, line: progress(start), layer: None });
        for k in 1..=ticks {
            let completed = start + (l.size - start) * k / ticks;
            let after = takes / ticks as u32;
            steps.push(Step { after, line: progress(completed), layer: Some((l.digest.clone(), completed)) });
        }
    }
    for status in ["verifying sha256 digest", "writing manifest", "success"] {
        steps.push(Step { after: Duration::ZERO, line: json!({ "status": status }), layer: None });
    }
    steps
}

/// The bytes a step reports as fetched are on disk now.
fn record(s: &Shared, step: &Step) {
    let Some((digest, completed)) = &step.layer else { return };
    let mut layers = s.layers.lock().unwrap_or_else(|p| p.into_inner());
    let had = layers.get(digest).copied().unwrap_or(0);
    if *completed > had {
        s.pulled_bytes.fetch_add(completed - had, Ordering::AcqRel);
        layers.insert(digest.clone(), *completed);
    }
}

/// A streaming pull, counted while it runs; dropped before `success`, it was abandoned.
struct Running {
    s: Arc<Shared>,
    done: bool,
}

impl Running {
    fn new(s: Arc<Shared>) -> Self {
        s.pulling.fetch_add(1, Ordering::AcqRel);
        Self { s, done: false }
    }

    fn succeeded(&mut self) {
        self.done = true;
        self.s.pulls_completed.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.s.pulling.fetch_sub(1, Ordering::AcqRel);
        if !self.done {
            self.s.pulls_cancelled.fetch_add(1, Ordering::AcqRel);
            tracing::debug!(addr = %self.s.addr, "pull abandoned by the client; the part fetched is kept");
        }
    }
}
