//! A node's `max_concurrency` as a fleet-wide limit: the rule each broker applies to take its
//! share of a node's slots (issue 18, item 4).
//!
//! Every rebalance (every [`REBALANCE`]), under one lock in one transaction, a broker reads the
//! other live brokers' rows for the node (their smoothed demand and what they `held`), and
//! takes `share = min(target, max - sum(others' held))`, where `target` is its part of `max`
//! in proportion to demand ([`apportion`]). It publishes `held = max(in_flight, share)`.
//! Invariant: the sum of every broker's `held` never exceeds `max`, and a broker's in-flight
//! requests never exceed its published `held`; so two brokers never send the node more than
//! its limit together, even while shares move. Hand-over: a broker whose share falls lowers
//! its local share *before* it publishes (its in-flight then only drains), and one whose share
//! rises raises it locally only *after* the commit. A gone broker's rows are left out of the
//! sum, so its share returns to the pool. The node's own "server busy" answer stays the final
//! word. Pure logic here; nothing on the request path reads the database.

use std::time::Duration;

/// How often each broker rebalances its shares.
pub const REBALANCE: Duration = Duration::from_millis(500);

/// How much of the newest demand sample enters the smoothed demand per rebalance.
pub const SMOOTHING: f64 = 0.5;

/// The smoothed demand after one more sample (in flight + queued for the node).
pub fn smooth(previous: f64, sample: usize) -> f64 {
    previous * (1.0 - SMOOTHING) + sample as f64 * SMOOTHING
}

/// Below this smoothed demand (half a request on average) a broker counts as idle: its
/// reserved slot goes back to the busy ones within a few rebalances of its last request.
pub const BUSY: f64 = 0.5;

/// Split `max` slots among brokers by demand: each broker with demand gets one slot first
/// (while there are slots), the rest go by D'Hondt (largest `demand / (slots + 1)`) up to
/// what a broker can use (`ceil(demand)`); what nobody can use is spread evenly, so a request
/// arriving at an idle broker starts without waiting for the next rebalance. Ties go to the
/// earlier broker in `demands` (callers sort by name, so every broker computes the same split).
pub fn apportion(max: u32, demands: &[f64]) -> Vec<u32> {
    let n = demands.len();
    let mut out = vec![0u32; n];
    if n == 0 {
        return out;
    }
    let mut left = max;
    let mut order: Vec<usize> = (0..n).filter(|&i| demands[i] >= BUSY).collect();
    order.sort_by(|&a, &b| demands[b].total_cmp(&demands[a]).then(a.cmp(&b)));
    for &i in &order {
        if left == 0 {
            break;
        }
        out[i] = 1;
        left -= 1;
    }
    while left > 0 {
        let next = order.iter().copied().filter(|&i| f64::from(out[i]) < demands[i].ceil()).max_by(|&a, &b| {
            let (qa, qb) = (demands[a] / f64::from(out[a] + 1), demands[b] / f64::from(out[b] + 1));
            qa.total_cmp(&qb).then(b.cmp(&a))
        });
        let Some(i) = next else { break };
        out[i] += 1;
        left -= 1;
    }
    let mut i = 0;
    while left > 0 {
        out[i % n] += 1;
        left -= 1;
        i += 1;
    }
    out
}

/// This broker's share: its `target`, within what the others' `held` leaves of `max`.
pub fn share(max: u32, target: u32, others_held: &[u32]) -> u32 {
    let taken: u64 = others_held.iter().map(|h| u64::from(*h)).sum();
    target.min(u64::from(max).saturating_sub(taken) as u32)
}

/// What a broker publishes as holding: its share, or more while requests above it drain.
pub fn held(in_flight: usize, share: u32) -> u32 {
    (in_flight.min(u32::MAX as usize) as u32).max(share)
}

/// The share a broker uses when it has not reached the database for longer than its lease:
/// an even split among the brokers it last saw live (at least one slot). Approximate by
/// design: serving on matters more than the exact limit, and the node's busy answer is final.
pub fn outage_share(max: u32, live_brokers: usize) -> u32 {
    (max / live_brokers.max(1) as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_splits_the_slots_and_an_idle_brokers_share_flows_to_a_busy_one() {
        assert_eq!(apportion(4, &[20.0, 20.0]), [2, 2], "equal demand, equal shares");
        assert_eq!(apportion(4, &[20.0, 0.0]), [4, 0], "the idle broker's share goes to the busy one");
        assert_eq!(apportion(4, &[20.0, 1.0]), [3, 1], "one waiting request is never starved");
        assert_eq!(apportion(4, &[0.0, 0.0]), [2, 2], "nobody busy: an even split, ready to start");
        assert_eq!(apportion(4, &[1.0, 0.0]), [3, 1], "slots nobody can use are spread");
        assert_eq!(apportion(2, &[5.0, 5.0, 5.0]), [1, 1, 0], "fewer slots than brokers");
        assert_eq!(apportion(0, &[3.0]), [0]);
    }

    #[test]
    fn shares_never_add_up_past_the_limit_while_they_move() {
        // Four brokers take turns rebalancing with changing demand; each publishes `held`.
        let max = 4;
        let mut held_by = [0u32; 4];
        let mut in_flight = [0usize; 4];
        for round in 0..2_000u64 {
            let b = (round % 4) as usize;
            let demands: Vec<f64> = (0..4).map(|i| ((round * 7 + i as u64 * 13) % 11) as f64).collect();
            let target = apportion(max, &demands)[b];
            let others: Vec<u32> = (0..4).filter(|&i| i != b).map(|i| held_by[i]).collect();
            let s = share(max, target, &others);
            // Requests drain, then fill up to the share.
            in_flight[b] = in_flight[b].saturating_sub((round % 3) as usize).max(s as usize);
            held_by[b] = held(in_flight[b], s);
            assert!(in_flight[b] <= held_by[b] as usize, "in flight within what is published");
            assert!(held_by.iter().sum::<u32>() <= max, "round {round}: {held_by:?} past {max}");
        }
    }

    #[test]
    fn a_lowered_share_holds_its_draining_requests_until_they_end() {
        assert_eq!(held(3, 1), 3, "three still running under a share of one");
        assert_eq!(share(4, 2, &[3]), 1, "the other broker takes only what is free");
        assert_eq!(share(4, 2, &[1]), 2);
        assert_eq!(outage_share(4, 2), 2);
        assert_eq!(outage_share(1, 3), 1, "at least one slot");
    }
}
