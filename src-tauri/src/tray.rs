//! The tray's look: one of four icons (colour and symbol) and a tooltip with counts, from the
//! nodes' states. Pure, so it is tested without a display.

use corral::node::NodeState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrayState {
    /// Every node that should serve is up.
    Healthy,
    /// Some are down or recovering, some serve.
    Degraded,
    /// None of the nodes that should serve is up.
    Down,
    /// Nothing known yet (no probe answered), or no nodes.
    Unknown,
}

impl TrayState {
    pub fn icon(self) -> &'static [u8] {
        match self {
            Self::Healthy => include_bytes!("../../icons/tray-healthy.png"),
            Self::Degraded => include_bytes!("../../icons/tray-degraded.png"),
            Self::Down => include_bytes!("../../icons/tray-down.png"),
            Self::Unknown => include_bytes!("../../icons/tray-unknown.png"),
        }
    }
}

/// Disabled and draining nodes are the operator's choice: they neither alarm nor reassure.
pub fn state_of(states: &[NodeState]) -> TrayState {
    let serving: Vec<NodeState> =
        states.iter().copied().filter(|s| !matches!(s, NodeState::Disabled | NodeState::Draining)).collect();
    let up = serving.iter().filter(|s| matches!(s, NodeState::Healthy | NodeState::Recovering)).count();
    let down = serving.iter().filter(|s| **s == NodeState::Unhealthy).count();
    let recovering = serving.iter().filter(|s| **s == NodeState::Recovering).count();
    if serving.is_empty() || (up == 0 && down == 0) {
        TrayState::Unknown
    } else if up == 0 {
        TrayState::Down
    } else if down > 0 || recovering > 0 {
        TrayState::Degraded
    } else {
        TrayState::Healthy
    }
}

pub fn tooltip(states: &[NodeState], accepting: bool) -> String {
    let count = |f: fn(&NodeState) -> bool| states.iter().filter(|s| f(s)).count();
    let up = count(|s| matches!(s, NodeState::Healthy | NodeState::Recovering));
    let down = count(|s| *s == NodeState::Unhealthy);
    let other = states.len() - up - down;
    let mut t = format!("Corral: {up} up, {down} down");
    if other > 0 {
        t.push_str(&format!(", {other} unknown or off"));
    }
    if !accepting {
        t.push_str(" (paused)");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeState::*;

    #[test]
    fn the_icon_follows_the_serving_nodes() {
        assert_eq!(state_of(&[]), TrayState::Unknown);
        assert_eq!(state_of(&[Unknown, Unknown]), TrayState::Unknown);
        assert_eq!(state_of(&[Healthy, Healthy, Disabled]), TrayState::Healthy);
        assert_eq!(state_of(&[Healthy, Unhealthy]), TrayState::Degraded);
        assert_eq!(state_of(&[Healthy, Recovering]), TrayState::Degraded);
        assert_eq!(state_of(&[Unhealthy, Unhealthy, Draining]), TrayState::Down);
        assert_eq!(state_of(&[Unhealthy, Unknown]), TrayState::Down);
    }

    #[test]
    fn tooltips_count_and_say_when_paused() {
        assert_eq!(tooltip(&[Healthy, Unhealthy, Disabled], true), "Corral: 1 up, 1 down, 1 unknown or off");
        assert_eq!(tooltip(&[Healthy], false), "Corral: 1 up, 0 down (paused)");
    }

    #[test]
    fn every_icon_is_a_png() {
        for s in [TrayState::Healthy, TrayState::Degraded, TrayState::Down, TrayState::Unknown] {
            assert_eq!(&s.icon()[1..4], b"PNG");
        }
    }
}
