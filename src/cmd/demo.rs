//! `corral demo`: the zero-setup way to try Corral. A broker on loopback in front of simulated
//! nodes and a simulated cloud provider, with its own request store; prints the URLs and a few
//! commands to try, then runs until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use corral::config::Config;
use corral::sim::SimNode;
use corral::{Broker, StartOptions};

/// Where the demo keeps its requests unless `--db` says otherwise: beside `corral serve`'s
/// store, never in it.
pub fn default_store() -> PathBuf {
    corral::store::default_path(&corral::config::StoreConfig::default()).with_file_name("corral-demo.db")
}

pub async fn run(port: u16, n: usize, admin_port: u16, db: Option<PathBuf>) -> ExitCode {
    let mut config = Config::default();
    config.listeners[0].addr = SocketAddr::from(([127, 0, 0, 1], port)).to_string();
    config.admin.addr = SocketAddr::from(([127, 0, 0, 1], admin_port)).to_string();
    let db = db.unwrap_or_else(default_store);
    config.store.path = Some(db.display().to_string());
    let (sims, nodes) = match corral::sim::demo_nodes(n).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot start the simulated nodes: {e}");
            return ExitCode::from(1);
        }
    };
    config.nodes = nodes;
    let cloud = match corral::sim::demo_cloud().await {
        Ok((cloud, provider, categories)) => {
            config.providers.push(provider);
            config.categories.extend(categories);
            cloud
        }
        Err(e) => {
            eprintln!("error: cannot start the simulated cloud: {e}");
            return ExitCode::from(1);
        }
    };
    let broker = match Broker::start(config, StartOptions { demo: true, ..super::start_options() }).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, corral::broker::StartError::WeakToken(_)) {
                return ExitCode::from(2);
            }
            eprintln!("hint: pick another port with: corral demo --port 11500");
            return ExitCode::from(1);
        }
    };
    print_intro(&broker, &sims, &cloud);
    super::wait_for_signal().await;
    broker.shutdown().await;
    drop(sims);
    drop(cloud);
    ExitCode::SUCCESS
}

/// What is running where, and commands to try against it.
fn print_intro(broker: &Broker, sims: &[SimNode], cloud: &SimNode) {
    let url = format!("http://{}", broker.proxy_addr());
    println!("Corral demo: {} simulated Ollama nodes behind one endpoint.", sims.len());
    for (node, sim) in broker.config().nodes.iter().zip(sims) {
        println!("  node {:<6} {}  (simulated)", node.name, sim.url());
    }
    println!();
    println!("  Ollama API:  {url}");
    println!("  OpenAI API:  {url}/v1");
    if super::token_from_env() {
        println!("  Admin API:   http://{}  (Authorization: Bearer $CORRAL_ADMIN_TOKEN)", broker.admin_addr());
        println!("  UI:          http://{}/ui/  (sign in with CORRAL_ADMIN_TOKEN)", broker.admin_addr());
    } else {
        println!("  Admin API:   http://{}  (Authorization: Bearer {})", broker.admin_addr(), broker.admin_token());
        println!("  UI:          http://{}/ui/#token={}", broker.admin_addr(), broker.admin_token());
    }
    println!();
    println!("Try:");
    println!("  curl {url}/api/tags");
    println!("  curl {url}/api/chat -d '{{\"model\":\"llama3.2\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'");
    println!("  OLLAMA_HOST={url} ollama run llama3.2   # with the ollama CLI, if you have it");
    println!();
    println!(
        "Cloud fallback: category `public` may fall back to a simulated cloud ({}), `private` never.",
        cloud.url()
    );
    println!("  for n in {}; do curl -s -X POST $n/_sim/down -d '{{\"for_ms\":20000}}'; done   # take every node down for 20 s",
        sims.iter().map(|s| s.url()).collect::<Vec<_>>().join(" "));
    println!("  curl -i -H 'X-Corral-Category: public' {url}/api/chat -d '{{\"model\":\"llama3.2\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'   # X-Corral-Fallback: cloud-sim");
    println!("  curl -i -H 'X-Corral-Category: private' {url}/api/chat -d '{{\"model\":\"llama3.2\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'  # 503 cloud_not_allowed");
    println!();
    println!("Press Ctrl-C to stop.");
}
