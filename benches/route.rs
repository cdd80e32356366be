//! The routing decision with 100 and 1,000 nodes, as a request makes it: `Admission::place_now`
//! (candidates from the per-model index, hold-offs, breakers, free slots, the category's
//! policy, taking the slot; the slot is given back when the guard drops, inside the loop).
//! Beside it, the two steps alone: `candidates`, and each policy's `Router::pick`.
//!
//! The cluster is in a working state, not an empty one: every node serves the model, a third
//! of them have it loaded in VRAM, some run requests, every node has a latency and a speed.
//! Run: cargo bench --bench route

use std::sync::Arc;

use corral::admit::{Admission, Ticket};
use corral::config::{CategoryConfig, NodeConfig, Origin, Policy, QueueConfig};
use corral::node::{InFlight, LoadedModel, NodeTuning, Registry};
use corral::plan::Work;
use corral::route::{candidates, PickCtx, Router};
use corral::speed::Timing;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use tokio::time::Instant;

fn registry(n: usize) -> (Arc<Registry>, Vec<InFlight>) {
    let cfgs: Vec<_> = (0..n)
        .map(|i| NodeConfig {
            name: format!("gpu{i}"),
            url: format!("http://127.0.0.1:{}", 20_000 + i),
            max_concurrency: 64,
            weight: 1 + (i % 3) as u32,
            ..NodeConfig::default()
        })
        .collect();
    let reg = Arc::new(Registry::new(&cfgs, NodeTuning::default()).expect("valid urls"));
    let mut running = Vec::new();
    for (i, n) in reg.all().iter().enumerate() {
        n.record_probe(true, 1, 1);
        n.set_models(["llama3.2:latest".to_string(), format!("m{}:latest", i % 7)]);
        let loaded = if i % 3 == 0 { "llama3.2:latest".to_string() } else { format!("m{}:latest", i % 7) };
        n.set_loaded(vec![LoadedModel { name: loaded, size: 10, size_vram: 10, context_length: None }]);
        n.observe_ttfb(std::time::Duration::from_millis(5 + (i % 17) as u64));
        let second = Some(std::time::Duration::from_secs(1));
        let t = Timing {
            prompt_tokens: Some(900),
            prompt: second,
            eval_tokens: Some(40 + i as u64),
            eval: second,
            load: None,
        };
        n.observe_speed("llama3.2", &t, Instant::now());
        for _ in 0..(i % 4) {
            running.extend(n.try_dispatch(false));
        }
    }
    (reg, running)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let _guard = rt.enter();
    // The bounds: under 1 us per decision at 100 nodes, under 10 us at 1,000.
    for size in [100, 1000] {
        let (reg, _running) = registry(size);
        let admission = Admission::new(Arc::clone(&reg), QueueConfig::default());
        let mut group = c.benchmark_group(format!("route_{size}_nodes"));
        group.bench_function("candidates", |b| b.iter(|| candidates(black_box(&reg), Some("llama3.2"), &[])));
        for policy in Policy::ALL {
            let router = Arc::new(Router::new(&CategoryConfig { policy, ..CategoryConfig::default() }, Some(1)));
            let ticket = Ticket {
                model: Some("llama3.2".into()),
                key: Some("llama3.2:latest".into()),
                session: Some("conversation-42".into()),
                tried: Vec::new(),
                router: Arc::clone(&router),
                priority: 0,
                origin: Origin::Local,
                body_bytes: 200,
                excluded: Vec::new(),
                has_alternative: false,
                work: Work { prompt_tokens: 50, output_tokens: Some(16) },
                arrived: Instant::now(),
            };
            group.bench_function(format!("{}/decision", policy.name()), |b| {
                b.iter(|| admission.place_now(black_box(&ticket)).expect("placed").expect("a free slot"))
            });
            let nodes = candidates(&reg, Some("llama3.2"), &[]).expect("candidates");
            let ctx = PickCtx {
                model: Some("llama3.2"),
                session: Some("conversation-42"),
                now: Instant::now(),
                work: ticket.work,
            };
            group
                .bench_function(format!("{}/pick", policy.name()), |b| b.iter(|| router.pick(black_box(&nodes), &ctx)));
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
