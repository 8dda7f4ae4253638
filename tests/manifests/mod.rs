//! The install manifests, checked without a cluster.
//!
//! `manifests/` (the base install), `manifests/overlays/dev` and the e2e kustomization are
//! rendered, every object is parsed into its k8s-openapi type (or hookd's CRD types) and
//! must serialize back to exactly what was written (a misspelt or misplaced field is
//! dropped by the type, and so shows up as a difference). Then references between objects
//! must resolve, every container must be locked down, and the RBAC bound to each hookd
//! ServiceAccount must allow exactly the calls the components make.
//!
//! Rendering uses `kubectl kustomize` when kubectl is installed. Without it, `render_files`
//! reads what the kustomizations list itself; that is why they only use `resources`,
//! `images`, `configurations`, `patches` (by path, applied as a JSON merge patch to the
//! object of the same kind and name) and `configMapGenerator` (files, labels, no hash
//! suffix). With kubectl installed both renderings run and must agree, so the fallback
//! cannot silently drift from kustomize.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, Pod, PodSpec, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use hookd::k8s::{WebhookDispatcher, WebhookEndpoint};

const INSTALL_NS: &str = "hookd-system";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

mod image;
mod install;
mod monitoring;
mod policies;
mod rbac;
mod render;
mod round_trip;
mod runbook;
mod workloads;

#[allow(unused_imports)]
use image::*;
#[allow(unused_imports)]
use install::*;
#[allow(unused_imports)]
use monitoring::*;
#[allow(unused_imports)]
use policies::*;
#[allow(unused_imports)]
use rbac::*;
#[allow(unused_imports)]
use render::*;
#[allow(unused_imports)]
use round_trip::*;
#[allow(unused_imports)]
use runbook::*;
#[allow(unused_imports)]
use workloads::*;
