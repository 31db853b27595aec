//! module-manager's load-test harness (`loadtest` binary): named scenarios driving a fleet of
//! real replicas against a real control plane, checkers that fail the run, measurements,
//! baselines measured in the same run, and the reports. See `docs/loadtest.md`.

pub mod measure;
pub mod report;
pub mod results;
