//! The shutdown signal: SIGTERM (Kubernetes) or SIGINT (a terminal).

/// Completes on SIGTERM or SIGINT.
pub async fn signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
