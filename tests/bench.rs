//! `corral bench` against sims: counts and error rates are what the nodes did.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corral::bench::{run, Plan};
use corral::sim::{Faults, SimNode, SimSpec};

fn plan(concurrency: Vec<usize>, requests: usize) -> Plan {
    Plan {
        concurrency,
        requests,
        max_duration: Duration::from_secs(30),
        model: "llama3.2".into(),
        stream: false,
        prompt_words: 8,
        num_predict: 5,
        timeout: Duration::from_secs(10),
    }
}

#[tokio::test]
async fn counts_requests_tokens_and_errors() {
    let sim = SimNode::start(SimSpec::default()).await.expect("sim");
    sim.set_faults(Faults::statuses(500, 5));
    let done = Arc::new(AtomicUsize::new(0));
    let d = Arc::clone(&done);
    let steps = run(
        &plan(vec![1, 4], 20),
        ("sim", &sim.url()),
        None,
        Arc::new(move || {
            d.fetch_add(1, Ordering::Relaxed);
        }),
        &|_, _| {},
    )
    .await;
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].requests, 20);
    assert_eq!(steps[0].errors, 5, "the five scripted 500s");
    assert!((steps[0].error_rate - 0.25).abs() < 1e-9);
    assert_eq!(steps[1].errors, 0);
    assert!((steps[1].tokens_per_s / steps[1].rps - 5.0).abs() < 1e-6, "num_predict 5 tokens per answer");
    assert_eq!(done.load(Ordering::Relaxed), 40, "progress saw every request");
    assert_eq!(sim.inference_count(), 40);
}

#[tokio::test]
async fn comparison_runs_both_targets_interleaved_with_ratios() {
    let a = SimNode::start(SimSpec::default()).await.expect("sim");
    let b = SimNode::start(SimSpec::default()).await.expect("sim");
    let steps = run(&plan(vec![2], 10), ("a", &a.url()), Some(("b", &b.url())), Arc::new(|| {}), &|_, _| {}).await;
    assert_eq!(steps.iter().map(|s| s.target.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
    assert_eq!(a.inference_count(), 10);
    assert_eq!(b.inference_count(), 10);
    let md = corral::bench::markdown(&steps);
    assert!(md.contains("Ratios a / b"), "{md}");
}
