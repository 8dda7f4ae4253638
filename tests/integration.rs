//! Every integration test of hookd, in one test binary.
//!
//! Each file beside this one is one area (its doc comment says what it covers); they are
//! modules of this one crate rather than a binary each, so the test kit (`common`) and the
//! code every test instantiates from hookd, axum and sqlx compile and link once instead of
//! once per file (29 binaries of ~470 MB each filled a CI machine's disk). nextest still
//! runs every test in a process of its own, so tests share nothing they did not before.
//!
//! Run one area with a filter on the module path, e.g. `cargo nextest run -E
//! 'test(/^dispatch::/)'`, or by name: `cargo nextest run dispatch::`.

mod common;

mod api_crash;
mod api_limits;
mod apply;
mod architecture;
mod auth;
mod browser;
mod cancellation;
mod chaos;
mod clients;
mod consumers;
mod contract;
mod controller;
mod controller_process;
mod crd;
mod crypto;
mod customers;
mod dev;
mod dispatch;
mod dispatch_crash;
mod event_types;
mod first_hour;
mod hardening;
mod inbound;
mod ingest;
mod manifests;
mod operational;
mod ordering;
mod outbound;
mod partitions;
mod pooler;
mod rate_limits;
mod receiver;
mod retention;
mod scale;
mod security;
mod smoke;
mod telemetry;
mod trace_context;
