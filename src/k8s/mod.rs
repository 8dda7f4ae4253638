//! Kubernetes: the custom resource types, the endpoint sync core shared by `hookd apply`
//! and the controller, and CRD generation.

pub mod crd;
pub mod sync;

use kube::CustomResourceExt;

pub use crd::{
    WebhookDispatcher, WebhookDispatcherSpec, WebhookDispatcherStatus, WebhookEndpoint,
    WebhookEndpointSpec, WebhookEndpointStatus,
};

/// Every CRD hookd defines, as one multi-document YAML stream (`hookd crd`, `crds/`).
pub fn crds_yaml() -> String {
    let crds = [crd::WebhookEndpoint::crd(), crd::WebhookDispatcher::crd()];
    crds.iter()
        .map(|c| serde_yaml::to_string(c).expect("CRDs serialize to YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}
