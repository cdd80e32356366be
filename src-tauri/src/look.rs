//! What the tray shows, from the nodes' states and the broker's switches: the icon, the
//! tooltip, the status line and every menu label. Pure (no Tauri, no display), so it is tested
//! as it is and the tray code only copies these strings onto the menu.

use corral::node::NodeState;

/// The cluster as the tray's icon tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Icon {
    /// Every node that should serve is up.
    Healthy,
    /// Some serve, some are down or recovering (or not probed yet).
    Degraded,
    /// None of the nodes that should serve is up.
    Down,
    /// No node should serve: none configured, or every one disabled or draining.
    NoNodes,
    /// The broker is paused (new requests get 503), whatever the nodes do.
    Paused,
}

impl Icon {
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Down => "down",
            Self::NoNodes => "no-nodes",
            Self::Paused => "paused",
        }
    }
}

/// One node as the tray lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub state: NodeState,
    pub in_flight: usize,
}

/// Everything the tray's look depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub nodes: Vec<NodeView>,
    pub accepting: bool,
    pub queued: usize,
    pub muted: bool,
}

/// Disabled and draining nodes are the operator's choice: they neither alarm nor reassure.
pub fn icon_of(snap: &Snapshot) -> Icon {
    if !snap.accepting {
        return Icon::Paused;
    }
    let serving: Vec<NodeState> = snap
        .nodes
        .iter()
        .map(|n| n.state)
        .filter(|s| !matches!(s, NodeState::Disabled | NodeState::Draining))
        .collect();
    let up = serving.iter().filter(|s| **s == NodeState::Healthy).count();
    let usable = serving.iter().filter(|s| matches!(s, NodeState::Healthy | NodeState::Recovering)).count();
    let down = serving.iter().filter(|s| **s == NodeState::Unhealthy).count();
    if serving.is_empty() {
        Icon::NoNodes
    } else if up == serving.len() {
        Icon::Healthy
    } else if usable == 0 && down > 0 {
        Icon::Down
    } else {
        Icon::Degraded
    }
}

fn is_up(s: NodeState) -> bool {
    matches!(s, NodeState::Healthy | NodeState::Recovering)
}

/// "3/3 nodes up · 2 in flight", with the queue when there is one and "paused" when paused.
pub fn status_line(snap: &Snapshot) -> String {
    let up = snap.nodes.iter().filter(|n| is_up(n.state)).count();
    let in_flight: usize = snap.nodes.iter().map(|n| n.in_flight).sum();
    let noun = if snap.nodes.len() == 1 { "node" } else { "nodes" };
    let mut line = format!("{up}/{} {noun} up · {in_flight} in flight", snap.nodes.len());
    if snap.queued > 0 {
        line.push_str(&format!(" · {} queued", snap.queued));
    }
    if !snap.accepting {
        line.push_str(" · paused");
    }
    line
}

pub fn tooltip(snap: &Snapshot) -> String {
    format!("Corral: {}", status_line(snap))
}

/// A node's entry in the Nodes submenu: its name and state; ticked while enabled.
pub fn node_label(n: &NodeView) -> String {
    let state = match n.state {
        NodeState::Healthy => "up",
        NodeState::Recovering => "recovering",
        NodeState::Unhealthy => "down",
        NodeState::Unknown => "checking",
        NodeState::Disabled => "disabled",
        NodeState::Draining => "draining",
    };
    format!("{} ({state})", n.name)
}

pub fn node_enabled(n: &NodeView) -> bool {
    n.state != NodeState::Disabled
}

pub fn pause_label(accepting: bool) -> &'static str {
    if accepting {
        "Pause (new requests get 503)"
    } else {
        "Resume accepting requests"
    }
}

pub fn copy_label(endpoint: &str) -> String {
    format!("Copy endpoint: {endpoint}")
}

/// The Connect submenu: what a client is pointed at, each entry copying its text. By id (the
/// menu event's), label and the text that goes on the clipboard.
pub fn connect_items(endpoint: &str) -> [(&'static str, String, String); 3] {
    [
        ("copy", copy_label(endpoint), endpoint.to_string()),
        ("copy-openai", format!("Copy OpenAI URL: {endpoint}/v1"), format!("{endpoint}/v1")),
        ("copy-env", format!("Copy OLLAMA_HOST={endpoint}"), format!("OLLAMA_HOST={endpoint}")),
    ]
}

pub const CONNECT: &str = "Connect";

pub const OPEN: &str = "Open Corral";
pub const NODES: &str = "Nodes";
pub const NO_NODES: &str = "No nodes configured";
pub const BROWSER: &str = "Open UI in browser";
pub const CONFIG_DIR: &str = "Open config folder";
pub const LOGS_DIR: &str = "Open logs folder";
pub const MUTE: &str = "Mute notifications";
pub const QUIT: &str = "Quit (let requests finish)";

/// The menu's labels top to bottom (a submenu's entries indented by two spaces; separators
/// as "-"), as the tray builds them: the tests' and the inspection file's view of the menu.
pub fn menu_labels(snap: &Snapshot, endpoint: &str) -> Vec<String> {
    let mut out = vec![status_line(snap), "-".into(), OPEN.into(), NODES.into()];
    if snap.nodes.is_empty() {
        out.push(format!("  {NO_NODES}"));
    }
    out.extend(snap.nodes.iter().map(|n| format!("  {}", node_label(n))));
    out.push(CONNECT.into());
    out.extend(connect_items(endpoint).into_iter().map(|(_, label, _)| format!("  {label}")));
    out.extend([BROWSER.into(), CONFIG_DIR.into(), LOGS_DIR.into(), "-".into()]);
    out.extend([pause_label(snap.accepting).into(), MUTE.into(), "-".into(), QUIT.into()]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeState::*;

    fn snap(states: &[NodeState], accepting: bool) -> Snapshot {
        let nodes = states
            .iter()
            .enumerate()
            .map(|(i, s)| NodeView { name: format!("gpu{i}"), state: *s, in_flight: i })
            .collect();
        Snapshot { nodes, accepting, queued: 0, muted: false }
    }

    #[test]
    fn the_icon_follows_the_serving_nodes() {
        assert_eq!(icon_of(&snap(&[], true)), Icon::NoNodes);
        assert_eq!(icon_of(&snap(&[Disabled, Draining], true)), Icon::NoNodes);
        assert_eq!(icon_of(&snap(&[Healthy, Healthy, Disabled], true)), Icon::Healthy);
        assert_eq!(icon_of(&snap(&[Healthy, Unhealthy], true)), Icon::Degraded);
        assert_eq!(icon_of(&snap(&[Healthy, Recovering], true)), Icon::Degraded);
        assert_eq!(icon_of(&snap(&[Unknown, Unknown], true)), Icon::Degraded, "not probed yet");
        assert_eq!(icon_of(&snap(&[Unhealthy, Unhealthy, Draining], true)), Icon::Down);
        assert_eq!(icon_of(&snap(&[Unhealthy, Unknown], true)), Icon::Down);
        assert_eq!(icon_of(&snap(&[Recovering, Unhealthy], true)), Icon::Degraded);
    }

    #[test]
    fn paused_wins_over_every_node_state() {
        for states in [&[Healthy][..], &[Unhealthy], &[], &[Healthy, Unhealthy]] {
            assert_eq!(icon_of(&snap(states, false)), Icon::Paused);
        }
    }

    #[test]
    fn the_status_line_counts_nodes_in_flight_queue_and_pause() {
        assert_eq!(status_line(&snap(&[Healthy, Healthy, Healthy], true)), "3/3 nodes up · 3 in flight");
        assert_eq!(status_line(&snap(&[Unhealthy], true)), "0/1 node up · 0 in flight");
        let mut s = snap(&[Healthy, Unhealthy], false);
        s.queued = 4;
        assert_eq!(status_line(&s), "1/2 nodes up · 1 in flight · 4 queued · paused");
        assert_eq!(tooltip(&s), "Corral: 1/2 nodes up · 1 in flight · 4 queued · paused");
    }

    #[test]
    fn the_menu_lists_every_item_and_each_node_with_its_state() {
        let labels = menu_labels(&snap(&[Healthy, Disabled], true), "http://127.0.0.1:11400");
        assert_eq!(
            labels,
            [
                "1/2 nodes up · 1 in flight",
                "-",
                "Open Corral",
                "Nodes",
                "  gpu0 (up)",
                "  gpu1 (disabled)",
                "Connect",
                "  Copy endpoint: http://127.0.0.1:11400",
                "  Copy OpenAI URL: http://127.0.0.1:11400/v1",
                "  Copy OLLAMA_HOST=http://127.0.0.1:11400",
                "Open UI in browser",
                "Open config folder",
                "Open logs folder",
                "-",
                "Pause (new requests get 503)",
                "Mute notifications",
                "-",
                "Quit (let requests finish)",
            ]
        );
        let paused = menu_labels(&snap(&[], false), "x");
        assert!(paused.contains(&"Resume accepting requests".to_string()));
        assert!(paused.contains(&"  No nodes configured".to_string()));
    }

    #[test]
    fn a_node_is_ticked_unless_disabled() {
        let v = |state| NodeView { name: "a".into(), state, in_flight: 0 };
        assert!(node_enabled(&v(Healthy)) && node_enabled(&v(Draining)) && node_enabled(&v(Unhealthy)));
        assert!(!node_enabled(&v(Disabled)));
        assert_eq!(node_label(&v(Unknown)), "a (checking)");
    }
}
