//! The desktop's notifications: the same notices as `corral serve --notify` (the policy is
//! `corral::alerts::Alerts`: causes, outage length, dedup, rate limits), plus an "Open node"
//! action on a node's notices where the notification server supports actions (notify-rust on
//! Linux: D-Bus `ActionInvoked`). The action, or a click on the notice (its default action),
//! brings the window up on the Nodes screen with that node's row in view.
//!
//! Without a notification server (headless) a notice is logged and dropped, as before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use corral::alerts::{Alerts, Notice, Urgency};
use corral::telemetry::Event;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The action key: "default" is what a click on the notice itself sends, so one key covers
/// the button and the click.
pub const ACTION: &str = "default";
pub const ACTION_LABEL: &str = "Open node";

/// The node a notice is about, when it is about one (its subject is `node:NAME`).
pub fn node_of(n: &Notice) -> Option<&str> {
    n.subject.strip_prefix("node:").filter(|s| !s.is_empty())
}

/// Show `n`; for a node's notice with actions supported, wait (on this blocking thread) for
/// the action and call `open` with the node's name.
fn deliver(n: &Notice, actions: bool, open: impl FnOnce(String)) -> Result<(), String> {
    let mut note = notify_rust::Notification::new();
    note.appname("Corral").summary(&n.summary).body(&n.body);
    #[cfg(all(unix, not(target_os = "macos")))]
    note.urgency(match n.urgency {
        Urgency::Normal => notify_rust::Urgency::Normal,
        Urgency::Critical => notify_rust::Urgency::Critical,
    });
    let node = node_of(n).filter(|_| actions).map(str::to_string);
    if node.is_some() {
        note.action(ACTION, ACTION_LABEL);
    }
    let handle = note.show().map_err(|e| e.to_string())?;
    #[cfg(all(unix, not(target_os = "macos")))]
    if let Some(node) = node {
        handle.wait_for_action(|action| {
            if action == ACTION {
                open(node);
            }
        });
    }
    #[cfg(not(all(unix, not(target_os = "macos"))))]
    let _ = (handle, node, open);
    Ok(())
}

/// Whether the notification server offers actions (asked once; false when there is none).
fn server_has_actions() -> bool {
    #[cfg(all(unix, not(target_os = "macos")))]
    return notify_rust::get_capabilities().is_ok_and(|c| c.iter().any(|c| c == "actions"));
    #[cfg(not(all(unix, not(target_os = "macos"))))]
    false
}

/// Turn the bus into notifications until `cancel`; `open(node)` runs when a node's notice is
/// acted on. `muted` is read per event.
pub async fn run(
    mut events: broadcast::Receiver<Event>,
    muted: Arc<AtomicBool>,
    cancel: CancellationToken,
    open: Arc<dyn Fn(String) + Send + Sync>,
) {
    let actions = tokio::task::spawn_blocking(server_has_actions).await.unwrap_or(false);
    tracing::info!(actions, "desktop notifications");
    let mut alerts = Alerts::new();
    while let Some(event) = corral::alerts::next_event(&mut events, &cancel).await {
        alerts.set_muted(muted.load(Ordering::Relaxed));
        for notice in alerts.on_event(&event, Instant::now()) {
            tracing::info!(summary = %notice.summary, "desktop notification");
            let open = Arc::clone(&open);
            // A thread of its own: a notice with an action waits there until it is closed.
            let spawned = std::thread::Builder::new().name("corral-notice".into()).spawn(move || {
                if let Err(e) = deliver(&notice, actions, |node| open(node)) {
                    tracing::warn!(summary = %notice.summary, error = %e, "notification not shown");
                }
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the notification thread");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(subject: &str) -> Notice {
        Notice { subject: subject.into(), summary: "s".into(), body: "b".into(), urgency: Urgency::Normal }
    }

    #[test]
    fn only_a_nodes_notice_names_a_node_to_open() {
        assert_eq!(node_of(&notice("node:gpu1")), Some("gpu1"));
        assert_eq!(node_of(&notice("node:")), None);
        assert_eq!(node_of(&notice("failover-storm")), None);
        assert_eq!(node_of(&notice("cloud-fallback")), None);
    }
}
