//! hookd: a Kubernetes-native webhook gateway on the transactional outbox pattern.
//!
//! Components (each with one `run` entry point): [`api`], [`dispatch`], and the
//! endpoint sync core in [`k8s`]. All SQL lives in [`db`].

pub mod api;
pub mod apply;
pub mod auth;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod crypto;
pub mod db;
pub mod dev;
pub mod dispatch;
pub mod domain;
pub mod endpoints;
pub mod inbound;
pub mod k8s;
pub mod metrics;
pub mod notify;
pub mod ops;
pub mod outbound;
pub mod outbox;
pub mod pgtemp;
pub mod receiver;
pub mod rekey;
pub mod retention;
pub mod runtime;
pub mod signing;
pub mod telemetry;
pub mod ui;
