//! Typed parsing of every object, with a round-trip check.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------
// Typed parsing with a round-trip check
// ---------------------------------------------------------------------------------------

/// Every difference between what was written and what the type kept.
pub(crate) fn diff(written: &Value, kept: &Value, path: &str) -> Vec<String> {
    match (written, kept) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = Vec::new();
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => out.extend(diff(v, w, &p)),
                    None => out.push(format!("{p}: unknown field, dropped by the type")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added by the type"));
            }
            out
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (x, y))| diff(x, y, &format!("{path}[{i}]")))
            .collect(),
        _ if written == kept => Vec::new(),
        // YAML's 100 and a float field's 100.0 are the same number.
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => Vec::new(),
        _ => vec![format!("{path}: wrote {written}, the type kept {kept}")],
    }
}

pub(crate) fn typed<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<T, String> {
    let t: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&t).map_err(|e| e.to_string())?;
    let diffs = diff(obj, &back, "");
    if diffs.is_empty() {
        Ok(t)
    } else {
        Err(diffs.join("; "))
    }
}

#[derive(Default)]
pub(crate) struct Install {
    pub(crate) namespaces: Vec<Namespace>,
    pub(crate) service_accounts: Vec<ServiceAccount>,
    pub(crate) config_maps: Vec<ConfigMap>,
    pub(crate) secrets: Vec<Secret>,
    pub(crate) services: Vec<Service>,
    pub(crate) deployments: Vec<Deployment>,
    pub(crate) stateful_sets: Vec<StatefulSet>,
    pub(crate) pods: Vec<Pod>,
    pub(crate) pdbs: Vec<PodDisruptionBudget>,
    pub(crate) network_policies: Vec<NetworkPolicy>,
    pub(crate) roles: Vec<Role>,
    pub(crate) cluster_roles: Vec<ClusterRole>,
    pub(crate) role_bindings: Vec<RoleBinding>,
    pub(crate) cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub(crate) crds: Vec<CustomResourceDefinition>,
    pub(crate) dispatchers: Vec<WebhookDispatcher>,
    pub(crate) endpoints: Vec<WebhookEndpoint>,
    /// The Deployments the controller makes from `dispatchers` (`desired_deployment`), so
    /// that their pods are checked like the rendered ones.
    pub(crate) generated: Vec<Deployment>,
}

/// Parses every object into its type; panics listing every object that does not fit.
pub(crate) fn parse_install(objects: &[Value]) -> Install {
    let mut install = Install::default();
    let mut errors = Vec::new();
    for o in objects {
        let (api_version, kind, ns, name) = key_of(o);
        let mut take = |r: Result<(), String>| {
            if let Err(e) = r {
                errors.push(format!("{kind} {ns}/{name}: {e}"));
            }
        };
        macro_rules! push {
            ($field:ident) => {
                take(typed(o).map(|t| install.$field.push(t)))
            };
        }
        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Namespace") => push!(namespaces),
            ("v1", "ServiceAccount") => push!(service_accounts),
            ("v1", "ConfigMap") => push!(config_maps),
            ("v1", "Secret") => push!(secrets),
            ("v1", "Service") => push!(services),
            ("v1", "Pod") => push!(pods),
            ("apps/v1", "Deployment") => push!(deployments),
            ("apps/v1", "StatefulSet") => push!(stateful_sets),
            ("policy/v1", "PodDisruptionBudget") => push!(pdbs),
            ("networking.k8s.io/v1", "NetworkPolicy") => push!(network_policies),
            ("rbac.authorization.k8s.io/v1", "Role") => push!(roles),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => push!(cluster_roles),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => push!(role_bindings),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                push!(cluster_role_bindings)
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => push!(crds),
            ("hookd.dev/v1alpha1", "WebhookDispatcher") => push!(dispatchers),
            ("hookd.dev/v1alpha1", "WebhookEndpoint") => push!(endpoints),
            _ => errors.push(format!(
                "{kind} {ns}/{name}: no type known for {api_version}; add one to parse_install"
            )),
        }
    }
    assert!(
        errors.is_empty(),
        "objects that do not round-trip:\n{}",
        errors.join("\n")
    );
    install.generated = install
        .dispatchers
        .iter()
        .map(|d| {
            hookd::k8s::dispatcher_controller::desired_deployment(
                d,
                "hookd",
                d.spec.replicas.unwrap_or(1),
            )
        })
        .collect();
    install
}
