//! `corral sim`: one or more simulated Ollama nodes on consecutive loopback ports, until
//! SIGINT/SIGTERM. Prints one `simulated Ollama node on URL` line per node (tests read it).

use std::process::ExitCode;

use corral::sim::SimSpec;

pub async fn run(port: u16, n: usize, spec: SimSpec) -> ExitCode {
    let nodes = match corral::sim::start_many(n.max(1), port, &spec).await {
        Ok(nodes) => nodes,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}; pick another --port");
            return ExitCode::from(1);
        }
    };
    for node in &nodes {
        println!("simulated Ollama node on {}", node.url());
    }
    super::wait_for_signal().await;
    ExitCode::SUCCESS
}
