//! module-manager's load-test harness (`loadtest` binary): named scenarios driving a fleet of
//! real replicas against a real control plane, checkers that fail the run, measurements,
//! baselines measured in the same run, and the reports. See `docs/loadtest.md`.
//!
//! - [`options`]: the command line; [`run`]: one run (a phase, the scenario, the baselines);
//!   [`phase`]: a fleet with its load (setup, finish) and the steps scenarios share;
//!   [`scenario`]: what each scenario does to the fleet;
//! - [`fleet`]: the fleet under test (local processes or a deployed StatefulSet), [`cgroup`];
//! - [`load`]: the load generator and its bookkeeping; [`observe`]: Leases and scrapes over time;
//! - [`checks`]: the checkers; [`measure`]: arithmetic; [`results`]: the figures;
//!   [`report`]: JSON, Markdown and PNG; [`baseline`]: bare apply and helm;
//!   [`manifest_writes`]: bare apply with the fleet's own requests of an install;
//! - [`mttp`]: the burst scenario (time to all Ready, cost per Manifest, idle, cold restart);
//!   [`usage`]: a replica's process tree; [`audit`]: requests per client from the audit log;
//! - [`prometheus`]: a real Prometheus scraping the fleet; the dashboards' panels and the
//!   alerts evaluated on what it saw, and their checkers;
//! - [`remote`]: many remote clusters on a few API servers (the test bed, its proxy, the bare
//!   client per target);
//! - [`hostile`]: innocent Manifests beside one hostile chart's Manifest, arm by arm.

pub mod audit;
pub mod baseline;
pub mod cgroup;
pub mod checks;
pub mod faults;
pub mod fleet;
pub mod gate;
pub mod hostile;
pub mod load;
pub mod manifest_writes;
pub mod measure;
pub mod mttp;
pub mod network;
pub mod observe;
pub mod options;
pub mod phase;
pub mod progress;
pub mod prometheus;
pub mod proxy;
pub mod remote;
pub mod report;
pub mod results;
pub mod run;
pub mod scenario;
pub mod usage;
