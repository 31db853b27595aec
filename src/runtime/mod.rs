//! Runtime: what a replica needs before and around its work (the permission preflight).

pub mod preflight;
