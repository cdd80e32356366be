//! The capacity task: every [`REBALANCE`], in one transaction under one advisory lock, this
//! broker takes its share of every node's slots by the rule in [`super::capacity`] and
//! publishes what it holds. Lowered shares apply before the commit, raised ones after it, so
//! the brokers' `held` never add up past a node's `max_concurrency`. While the database is
//! away past [`LEASE`], each broker falls back to an even split among the brokers it last saw
//! (the node's own busy answer stays the final word).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::capacity::{apportion, held, outage_share, share, smooth, REBALANCE};
use super::{Fleet, GONE_AFTER};
use crate::node::Node;
use crate::state::Shared;

/// Without a rebalance for this long a broker stops trusting its share (below the 5 s after
/// which the others count it gone and take its slots back).
pub const LEASE: Duration = Duration::from_secs(4);

/// The advisory transaction lock every rebalance takes: "corral" in ASCII, then 2.
const CAPACITY_LOCK: i64 = 0x636f_7272_616c_0002;

const OTHERS_SQL: &str = "SELECT s.node, s.broker, s.demand, s.held FROM node_shares s \
     JOIN brokers b ON b.name = s.broker \
     WHERE s.broker <> $1 AND b.last_seen > now() - make_interval(secs => $2)";

const PUBLISH_SQL: &str = "INSERT INTO node_shares (node, broker, demand, share, held, max_concurrency, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, now()) ON CONFLICT (node, broker) DO UPDATE SET demand = EXCLUDED.demand, \
     share = EXCLUDED.share, held = EXCLUDED.held, max_concurrency = EXCLUDED.max_concurrency, updated_at = now()";

/// Rebalance every [`REBALANCE`] until cancelled; the first round runs at once.
pub async fn run(fleet: Arc<Fleet>, shared: Arc<Shared>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(REBALANCE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut demand: HashMap<String, f64> = HashMap::new();
    let mut last_ok = Instant::now();
    let mut failing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let nodes = shared.registry.all();
        let queued = shared.admission.queued_by_node();
        for n in nodes.iter() {
            let sample = n.in_flight() + queued.get(&n.config.name).copied().unwrap_or(0);
            let d = demand.entry(n.config.name.clone()).or_insert(0.0);
            *d = smooth(*d, sample);
        }
        demand.retain(|name, _| nodes.iter().any(|n| &n.config.name == name));
        match rebalance(&fleet, &nodes, &demand).await {
            Ok(()) => {
                if failing {
                    tracing::info!("capacity shares: the database answers again");
                }
                (last_ok, failing) = (Instant::now(), false);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "capacity shares: cannot rebalance; keeping the last shares for the lease");
                }
                failing = true;
                if last_ok.elapsed() > LEASE {
                    let live = fleet.members().live();
                    for n in nodes.iter() {
                        n.set_fleet_share(outage_share(n.max_concurrency() as u32, live));
                    }
                }
            }
        }
    }
}

/// One rebalance of every node, in one transaction.
async fn rebalance(fleet: &Fleet, nodes: &[Arc<Node>], demand: &HashMap<String, f64>) -> Result<(), sqlx::Error> {
    let mut tx = fleet.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(CAPACITY_LOCK).execute(&mut *tx).await?;
    let rows: Vec<(String, String, f64, i32)> =
        sqlx::query_as(OTHERS_SQL).bind(&fleet.name).bind(GONE_AFTER.as_secs_f64()).fetch_all(&mut *tx).await?;
    let mut raise = Vec::new();
    for node in nodes {
        let name = &node.config.name;
        let max = node.max_concurrency().min(u32::MAX as usize) as u32;
        let mine = demand.get(name).copied().unwrap_or(0.0);
        // Every broker sorts by name, so all compute the same split.
        let mut brokers: Vec<(&str, f64)> = rows.iter().filter(|r| &r.0 == name).map(|r| (r.1.as_str(), r.2)).collect();
        brokers.push((fleet.name.as_str(), mine));
        brokers.sort_by(|a, b| a.0.cmp(b.0));
        let me = brokers.iter().position(|b| b.0 == fleet.name).unwrap_or(0);
        let target = apportion(max, &brokers.iter().map(|b| b.1).collect::<Vec<_>>())[me];
        let others: Vec<u32> = rows.iter().filter(|r| &r.0 == name).map(|r| r.3.max(0) as u32).collect();
        let s = share(max, target, &others);
        // Lower now, before anyone can count on the slots; raise only once published.
        let current = node.fleet_share().unwrap_or(u32::MAX);
        if s < current {
            node.set_fleet_share(s);
        } else if s > current {
            raise.push((Arc::clone(node), s));
        }
        let h = held(node.in_flight(), s);
        sqlx::query(PUBLISH_SQL)
            .bind(name)
            .bind(&fleet.name)
            .bind(mine)
            .bind(s as i32)
            .bind(h.min(i32::MAX as u32) as i32)
            .bind(max.min(i32::MAX as u32) as i32)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    for (node, s) in raise {
        node.set_fleet_share(s);
    }
    Ok(())
}
