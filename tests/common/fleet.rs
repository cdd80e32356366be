//! What the fleet tests share: a `corral serve` process with its URLs, and a bounded poll.
//! A child process runs on the real clock, so `until` does too.

use std::path::Path;
use std::time::Duration;

use super::process::Proc;
use super::TOKEN;

/// A `corral serve --config FILE` with `CORRAL_ADMIN_TOKEN`; its proxy and admin URLs.
pub fn serve(config: &Path) -> (Proc, String, String) {
    let p =
        Proc::spawn_env(&["serve", "--config", config.to_str().unwrap_or_default()], &[("CORRAL_ADMIN_TOKEN", TOKEN)]);
    let proxy = p.url("serving the Ollama API on");
    let admin = p.url("Open the UI").trim_end_matches("/ui/").to_string();
    (p, proxy, admin)
}

/// Poll `check` every 20 ms until it holds; the time it took, or `None` past `within`.
pub async fn until<F, Fut>(within: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while start.elapsed() < within {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
