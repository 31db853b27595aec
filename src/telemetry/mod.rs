//! Telemetry: structured logs (JSON by default) through `tracing`, metrics (`metrics.rs`), the
//! count of the operator's own API requests (`requests.rs`), Events (`events.rs`).

pub mod events;
pub mod metrics;
pub mod requests;

use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, with the fields of every enclosing span (component IDs).
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global subscriber. The filter comes from `RUST_LOG` (default `info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .init(),
        LogFormat::Text => builder.init(),
    }
}
