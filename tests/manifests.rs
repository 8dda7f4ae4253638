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

// ---------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------

fn yaml_stream(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{origin}: not YAML: {e}"))
        })
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `kubectl kustomize dir`, or None when kubectl is not installed. A kustomization kubectl
/// refuses fails the test rather than falling back.
fn kubectl_kustomize(dir: &Path) -> Option<Vec<Value>> {
    let out = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("running kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(yaml_stream(
        &String::from_utf8(out.stdout).unwrap(),
        &dir.display().to_string(),
    ))
}

/// The fallback renderer: what the kustomization in `dir` lists, with the few
/// transformations the manifests use. Returns the objects and the image field specs that
/// `configurations` declared (kustomize applies those in every kustomization built on it).
fn render_files(dir: &Path) -> (Vec<Value>, Vec<FieldSpec>) {
    let k = &yaml_stream(
        &read(&dir.join("kustomization.yaml")),
        &dir.display().to_string(),
    )[0];
    const UNDERSTOOD: [&str; 7] = [
        "apiVersion",
        "kind",
        "resources",
        "images",
        "configurations",
        "patches",
        "configMapGenerator",
    ];
    for key in k.as_object().unwrap().keys() {
        assert!(
            UNDERSTOOD.contains(&key.as_str()),
            "{}: the fallback renderer does not understand `{key}`; keep kustomizations simple (see the top of tests/manifests.rs)",
            dir.display()
        );
    }
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let mut objects = Vec::new();
    let mut image_specs = Vec::new();
    for r in strings(&k["resources"]) {
        let p = dir.join(&r);
        if p.is_dir() {
            let (o, specs) = render_files(&p);
            objects.extend(o);
            image_specs.extend(specs);
        } else {
            objects.extend(yaml_stream(&read(&p), &p.display().to_string()));
        }
    }
    for c in strings(&k["configurations"]) {
        let conf = &yaml_stream(&read(&dir.join(&c)), &c)[0];
        for spec in conf["images"].as_array().into_iter().flatten() {
            image_specs.push(FieldSpec {
                path: spec["path"].as_str().unwrap().to_string(),
                kind: spec["kind"].as_str().map(str::to_string),
            });
        }
    }
    for g in k["configMapGenerator"].as_array().into_iter().flatten() {
        assert_eq!(
            g["options"]["disableNameSuffixHash"],
            Value::Bool(true),
            "{}: generated ConfigMaps must disable the name hash suffix",
            dir.display()
        );
        let mut data = serde_json::Map::new();
        for f in strings(&g["files"]) {
            let (key, path) = f.split_once('=').unwrap_or((&f, &f));
            let key = Path::new(key).file_name().unwrap().to_str().unwrap();
            data.insert(key.into(), Value::String(read(&dir.join(path))));
        }
        let mut metadata = serde_json::json!({"name": g["name"]});
        if !g["namespace"].is_null() {
            metadata["namespace"] = g["namespace"].clone();
        }
        if !g["options"]["labels"].is_null() {
            metadata["labels"] = g["options"]["labels"].clone();
        }
        objects.push(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data,
        }));
    }
    for p in k["patches"].as_array().into_iter().flatten() {
        let path = p["path"].as_str().expect("patches are given by path only");
        let patch = &yaml_stream(&read(&dir.join(path)), path)[0];
        let targets: Vec<&mut Value> = objects
            .iter_mut()
            .filter(|o| same_object(o, patch))
            .collect();
        assert_eq!(targets.len(), 1, "{path} must patch exactly one object");
        for t in targets {
            merge_patch(t, patch);
        }
    }
    for image in k["images"].as_array().into_iter().flatten() {
        let defaults = [
            "spec/containers[]/image",
            "spec/initContainers[]/image",
            "spec/template/spec/containers[]/image",
            "spec/template/spec/initContainers[]/image",
        ]
        .map(|p| FieldSpec {
            path: p.into(),
            kind: None,
        });
        for o in objects.iter_mut() {
            let kind = o["kind"].as_str().unwrap_or_default().to_string();
            for spec in defaults.iter().chain(image_specs.iter()) {
                if spec.kind.as_deref().is_none_or(|k| k == kind) {
                    let segments: Vec<&str> = spec.path.split('/').collect();
                    visit_strings(o, &segments, &mut |s| retag(s, image));
                }
            }
        }
    }
    (objects, image_specs)
}

#[derive(Debug, Clone)]
struct FieldSpec {
    path: String,
    kind: Option<String>,
}

fn key_of(o: &Value) -> (String, String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&o["apiVersion"]),
        s(&o["kind"]),
        s(&o["metadata"]["namespace"]),
        s(&o["metadata"]["name"]),
    )
}

fn same_object(a: &Value, b: &Value) -> bool {
    key_of(a) == key_of(b)
}

/// RFC 7386, which is what kustomize does for a patch of a custom resource.
fn merge_patch(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// Applies `f` to every string at `path` (`a/b[]/c`: `b` is a list, each element visited).
fn visit_strings(v: &mut Value, path: &[&str], f: &mut dyn FnMut(&mut String)) {
    let Some((head, rest)) = path.split_first() else {
        if let Value::String(s) = v {
            f(s);
        }
        return;
    };
    let (field, is_list) = match head.strip_suffix("[]") {
        Some(f) => (f, true),
        None => (*head, false),
    };
    let Some(next) = v.get_mut(field) else { return };
    if is_list {
        for item in next.as_array_mut().into_iter().flatten() {
            visit_strings(item, rest, f);
        }
    } else {
        visit_strings(next, rest, f);
    }
}

/// kustomize's `images:` entry applied to one image reference, if its name matches.
fn retag(reference: &mut String, image: &Value) {
    let name = image["name"].as_str().unwrap();
    let rest = match reference.strip_prefix(name) {
        Some(r) if r.is_empty() || r.starts_with(':') || r.starts_with('@') => r.to_string(),
        _ => return,
    };
    let new_name = image["newName"].as_str().unwrap_or(name);
    let suffix = if let Some(d) = image["digest"].as_str() {
        format!("@{d}")
    } else if let Some(t) = image["newTag"].as_str() {
        format!(":{t}")
    } else {
        rest
    };
    *reference = format!("{new_name}{suffix}");
}

/// Renders `dir` (relative to the repository); with kubectl, also checks the fallback
/// renders the same objects.
fn render(dir: &str) -> Vec<Value> {
    let path = repo(dir);
    let (fallback, _) = render_files(&path);
    let Some(rendered) = kubectl_kustomize(&path) else {
        eprintln!("kubectl not found: {dir} rendered by the fallback reader");
        return fallback;
    };
    let index = |objs: &[Value]| -> BTreeMap<_, Value> {
        objs.iter().map(|o| (key_of(o), o.clone())).collect()
    };
    let (want, got) = (index(&rendered), index(&fallback));
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{dir}: the fallback renderer lists other objects than kubectl kustomize"
    );
    for (k, v) in &want {
        let diffs = diff(v, &got[k], "");
        assert!(
            diffs.is_empty(),
            "{dir}: the fallback renderer differs from kubectl kustomize on {k:?}: {diffs:?}"
        );
    }
    assert_eq!(rendered.len(), want.len(), "{dir}: duplicate objects");
    rendered
}

// ---------------------------------------------------------------------------------------
// Typed parsing with a round-trip check
// ---------------------------------------------------------------------------------------

/// Every difference between what was written and what the type kept.
fn diff(written: &Value, kept: &Value, path: &str) -> Vec<String> {
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

fn typed<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<T, String> {
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
struct Install {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    config_maps: Vec<ConfigMap>,
    secrets: Vec<Secret>,
    services: Vec<Service>,
    deployments: Vec<Deployment>,
    stateful_sets: Vec<StatefulSet>,
    pods: Vec<Pod>,
    pdbs: Vec<PodDisruptionBudget>,
    roles: Vec<Role>,
    cluster_roles: Vec<ClusterRole>,
    role_bindings: Vec<RoleBinding>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    crds: Vec<CustomResourceDefinition>,
    dispatchers: Vec<WebhookDispatcher>,
    endpoints: Vec<WebhookEndpoint>,
}

/// Parses every object into its type; panics listing every object that does not fit.
fn parse_install(objects: &[Value]) -> Install {
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
    install
}

// ---------------------------------------------------------------------------------------
// Workloads, references and security
// ---------------------------------------------------------------------------------------

struct Workload<'a> {
    what: String,
    ns: String,
    labels: BTreeMap<String, String>,
    selector: Option<&'a LabelSelector>,
    spec: &'a PodSpec,
    claim_templates: Vec<String>,
}

impl Install {
    fn workloads(&self) -> Vec<Workload<'_>> {
        let mut out = Vec::new();
        for d in &self.deployments {
            let s = d.spec.as_ref().expect("Deployment spec");
            out.push(Workload {
                what: format!(
                    "Deployment {}/{}",
                    d.namespace().unwrap_or_default(),
                    d.name_any()
                ),
                ns: d.namespace().unwrap_or_default(),
                labels: s
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default(),
                selector: Some(&s.selector),
                spec: s.template.spec.as_ref().expect("pod spec"),
                claim_templates: vec![],
            });
        }
        for st in &self.stateful_sets {
            let s = st.spec.as_ref().expect("StatefulSet spec");
            out.push(Workload {
                what: format!(
                    "StatefulSet {}/{}",
                    st.namespace().unwrap_or_default(),
                    st.name_any()
                ),
                ns: st.namespace().unwrap_or_default(),
                labels: s
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default(),
                selector: Some(&s.selector),
                spec: s.template.spec.as_ref().expect("pod spec"),
                claim_templates: s
                    .volume_claim_templates
                    .iter()
                    .flatten()
                    .map(|c| c.name_any())
                    .collect(),
            });
        }
        for p in &self.pods {
            out.push(Workload {
                what: format!("Pod {}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                ns: p.namespace().unwrap_or_default(),
                labels: p.labels().clone(),
                selector: None,
                spec: p.spec.as_ref().expect("pod spec"),
                claim_templates: vec![],
            });
        }
        out
    }

    fn secret_keys(&self, ns: &str, name: &str) -> Option<BTreeSet<String>> {
        self.secrets
            .iter()
            .find(|s| s.namespace().as_deref() == Some(ns) && s.name_any() == name)
            .map(|s| {
                let mut keys: BTreeSet<String> =
                    s.data.iter().flatten().map(|(k, _)| k.clone()).collect();
                keys.extend(s.string_data.iter().flatten().map(|(k, _)| k.clone()));
                keys
            })
    }

    fn config_map_keys(&self, ns: &str, name: &str) -> Option<BTreeSet<String>> {
        self.config_maps
            .iter()
            .find(|c| c.namespace().as_deref() == Some(ns) && c.name_any() == name)
            .map(|c| c.data.iter().flatten().map(|(k, _)| k.clone()).collect())
    }

    fn has_service_account(&self, ns: &str, name: &str) -> bool {
        name == "default"
            || self
                .service_accounts
                .iter()
                .any(|s| s.namespace().as_deref() == Some(ns) && s.name_any() == name)
    }

    fn deployment(&self, name: &str) -> &Deployment {
        self.deployments
            .iter()
            .find(|d| d.name_any() == name)
            .unwrap_or_else(|| panic!("Deployment {name} is rendered"))
    }
}

/// Secrets the install expects its user to create (the base ships no secret values):
/// (namespace, name, keys).
type External<'a> = &'a [(&'a str, &'a str, &'a [&'a str])];

const USER_SECRETS: External<'static> = &[
    (INSTALL_NS, "hookd-database", &["url"]),
    (INSTALL_NS, "hookd-encryption", &["key"]),
];

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn match_labels(s: Option<&LabelSelector>) -> BTreeMap<String, String> {
    assert!(
        s.is_none_or(|s| s.match_expressions.is_none()),
        "selectors use matchLabels only"
    );
    s.and_then(|s| s.match_labels.clone()).unwrap_or_default()
}

/// Every reference between objects, checked; returns one message per broken one.
fn broken_references(install: &Install, external: External<'_>) -> Vec<String> {
    let mut errs = Vec::new();
    let secret_has = |ns: &str, name: &str, key: Option<&str>| -> bool {
        if let Some(keys) = install.secret_keys(ns, name) {
            return key.is_none_or(|k| keys.contains(k));
        }
        external
            .iter()
            .any(|(n, s, keys)| *n == ns && *s == name && key.is_none_or(|k| keys.contains(&k)))
    };
    let namespaces: BTreeSet<String> = install.namespaces.iter().map(|n| n.name_any()).collect();

    // Every namespaced object says where it goes, and that namespace is installed too.
    let mut namespaced: Vec<(String, Option<String>)> = Vec::new();
    macro_rules! ns_of {
        ($($field:ident),*) => {$(
            for o in &install.$field {
                namespaced.push((format!("{} {}", std::any::type_name_of_val(o).rsplit("::").next().unwrap(), o.name_any()), o.namespace()));
            }
        )*};
    }
    ns_of!(
        service_accounts,
        config_maps,
        secrets,
        services,
        deployments,
        stateful_sets,
        pods,
        pdbs,
        roles,
        role_bindings,
        dispatchers,
        endpoints
    );
    for (what, ns) in namespaced {
        match ns {
            None => errs.push(format!("{what}: no metadata.namespace")),
            Some(ns) if !namespaces.contains(&ns) => {
                errs.push(format!("{what}: namespace {ns} is not part of the install"))
            }
            _ => {}
        }
    }

    let workloads = install.workloads();
    for w in &workloads {
        let spec = w.spec;
        if let Some(sa) = &spec.service_account_name
            && !install.has_service_account(&w.ns, sa)
        {
            errs.push(format!("{}: ServiceAccount {sa} does not exist", w.what));
        }
        let selector = match_labels(w.selector);
        if w.selector.is_some() && !selects(&selector, &w.labels) {
            errs.push(format!(
                "{}: selector {selector:?} does not match its pod labels",
                w.what
            ));
        }
        let volumes: BTreeSet<String> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.clone())
            .chain(w.claim_templates.iter().cloned())
            .collect();
        for v in spec.volumes.iter().flatten() {
            if let Some(s) = &v.secret {
                let name = s.secret_name.as_deref().unwrap_or_default();
                if !s.optional.unwrap_or(false) && !secret_has(&w.ns, name, None) {
                    errs.push(format!(
                        "{}: volume {} mounts missing Secret {name}",
                        w.what, v.name
                    ));
                }
                for item in s.items.iter().flatten() {
                    if !secret_has(&w.ns, name, Some(&item.key)) {
                        errs.push(format!(
                            "{}: volume {}: Secret {name} has no key {}",
                            w.what, v.name, item.key
                        ));
                    }
                }
            }
            if let Some(c) = &v.config_map
                && !c.optional.unwrap_or(false)
                && install.config_map_keys(&w.ns, &c.name).is_none()
            {
                errs.push(format!(
                    "{}: volume {} mounts missing ConfigMap {}",
                    w.what, v.name, c.name
                ));
            }
            if let Some(c) = &v.persistent_volume_claim {
                errs.push(format!(
                    "{}: volume {} names PVC {}, which the install does not create",
                    w.what, v.name, c.claim_name
                ));
            }
        }
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let what = format!("{} container {}", w.what, c.name);
            for m in c.volume_mounts.iter().flatten() {
                if !volumes.contains(&m.name) {
                    errs.push(format!("{what}: mounts unknown volume {}", m.name));
                }
            }
            for e in c.env.iter().flatten() {
                let Some(from) = &e.value_from else { continue };
                if let Some(r) = &from.secret_key_ref
                    && !r.optional.unwrap_or(false)
                    && !secret_has(&w.ns, &r.name, Some(&r.key))
                {
                    errs.push(format!(
                        "{what}: env {} needs key {} of Secret {}, which does not exist",
                        e.name, r.key, r.name
                    ));
                }
                if let Some(r) = &from.config_map_key_ref {
                    let ok = install
                        .config_map_keys(&w.ns, &r.name)
                        .is_some_and(|k| k.contains(&r.key));
                    if !r.optional.unwrap_or(false) && !ok {
                        errs.push(format!(
                            "{what}: env {} needs key {} of ConfigMap {}, which does not exist",
                            e.name, r.key, r.name
                        ));
                    }
                }
            }
            for f in c.env_from.iter().flatten() {
                if let Some(r) = &f.config_map_ref
                    && !r.optional.unwrap_or(false)
                    && install.config_map_keys(&w.ns, &r.name).is_none()
                {
                    errs.push(format!(
                        "{what}: envFrom ConfigMap {} does not exist",
                        r.name
                    ));
                }
                if let Some(r) = &f.secret_ref
                    && !r.optional.unwrap_or(false)
                    && !secret_has(&w.ns, &r.name, None)
                {
                    errs.push(format!("{what}: envFrom Secret {} does not exist", r.name));
                }
            }
            let ports: BTreeSet<&str> = c
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.name.as_deref())
                .collect();
            for (probe, p) in [
                ("liveness", &c.liveness_probe),
                ("readiness", &c.readiness_probe),
                ("startup", &c.startup_probe),
            ] {
                if let Some(IntOrString::String(port)) = p
                    .as_ref()
                    .and_then(|p| p.http_get.as_ref())
                    .map(|h| &h.port)
                    && !ports.contains(port.as_str())
                {
                    errs.push(format!(
                        "{what}: {probe} probe port {port} is not a named container port"
                    ));
                }
            }
        }
    }

    // Services and PodDisruptionBudgets select pods that exist, on ports those pods have.
    for s in &install.services {
        let ns = s.namespace().unwrap_or_default();
        let spec = s.spec.as_ref().expect("Service spec");
        let selector = spec.selector.clone().unwrap_or_default();
        let selected: Vec<&Workload> = workloads
            .iter()
            .filter(|w| w.ns == ns && selects(&selector, &w.labels))
            .collect();
        if selected.is_empty() {
            errs.push(format!("Service {ns}/{}: selects no pods", s.name_any()));
        }
        for p in spec.ports.iter().flatten() {
            let target = p.target_port.clone().unwrap_or(IntOrString::Int(p.port));
            let found = selected.iter().all(|w| {
                w.spec
                    .containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .any(|cp| match &target {
                        IntOrString::Int(n) => cp.container_port == *n,
                        IntOrString::String(name) => cp.name.as_deref() == Some(name.as_str()),
                    })
            });
            if !found {
                errs.push(format!(
                    "Service {ns}/{}: targetPort {target:?} is not a port of the selected pods",
                    s.name_any()
                ));
            }
        }
    }
    for st in &install.stateful_sets {
        let service = &st.spec.as_ref().unwrap().service_name;
        let ns = st.namespace().unwrap_or_default();
        if let Some(name) = service
            && !install
                .services
                .iter()
                .any(|s| s.namespace().as_deref() == Some(ns.as_str()) && &s.name_any() == name)
        {
            errs.push(format!(
                "StatefulSet {ns}/{}: serviceName {name} does not exist",
                st.name_any()
            ));
        }
    }
    for p in &install.pdbs {
        let ns = p.namespace().unwrap_or_default();
        let selector = match_labels(p.spec.as_ref().and_then(|s| s.selector.as_ref()));
        if !workloads
            .iter()
            .any(|w| w.ns == ns && selects(&selector, &w.labels))
        {
            errs.push(format!(
                "PodDisruptionBudget {ns}/{}: selects no pods",
                p.name_any()
            ));
        }
    }

    // Bindings name roles and ServiceAccounts that exist.
    let role_exists = |kind: &str, name: &str, ns: Option<&str>| match kind {
        "ClusterRole" => install.cluster_roles.iter().any(|r| r.name_any() == name),
        "Role" => install
            .roles
            .iter()
            .any(|r| r.name_any() == name && r.namespace().as_deref() == ns),
        _ => false,
    };
    let bindings = install
        .role_bindings
        .iter()
        .map(|b| {
            (
                format!(
                    "RoleBinding {}/{}",
                    b.namespace().unwrap_or_default(),
                    b.name_any()
                ),
                b.namespace(),
                &b.role_ref,
                &b.subjects,
            )
        })
        .chain(install.cluster_role_bindings.iter().map(|b| {
            (
                format!("ClusterRoleBinding {}", b.name_any()),
                None,
                &b.role_ref,
                &b.subjects,
            )
        }));
    for (what, ns, role_ref, subjects) in bindings {
        if !role_exists(&role_ref.kind, &role_ref.name, ns.as_deref()) {
            errs.push(format!(
                "{what}: {} {} does not exist",
                role_ref.kind, role_ref.name
            ));
        }
        for s in subjects.iter().flatten() {
            match (s.kind.as_str(), s.namespace.as_deref()) {
                ("ServiceAccount", Some(sns)) if install.has_service_account(sns, &s.name) => {}
                ("ServiceAccount", _) => errs.push(format!(
                    "{what}: ServiceAccount {:?}/{} does not exist",
                    s.namespace, s.name
                )),
                (kind, _) => errs.push(format!(
                    "{what}: binds a {kind}; hookd binds ServiceAccounts only"
                )),
            }
        }
    }

    // hookd's own references.
    for d in &install.dispatchers {
        let ns = d.namespace().unwrap_or_default();
        let what = format!("WebhookDispatcher {ns}/{}", d.name_any());
        let db = &d.spec.database_secret_ref;
        if !secret_has(&ns, &db.name, Some(&db.key)) {
            errs.push(format!(
                "{what}: database Secret {} key {} does not exist",
                db.name, db.key
            ));
        }
        let (enc_name, enc_key) = d
            .spec
            .encryption_key_secret_ref
            .as_ref()
            .map_or(("hookd-encryption", "key"), |r| {
                (r.name.as_str(), r.key.as_str())
            });
        if !secret_has(&ns, enc_name, Some(enc_key)) {
            errs.push(format!(
                "{what}: encryption key Secret {enc_name} key {enc_key} does not exist"
            ));
        }
        let sa = d
            .spec
            .service_account_name
            .as_deref()
            .unwrap_or("hookd-dispatcher");
        if !install.has_service_account(&ns, sa) {
            errs.push(format!("{what}: ServiceAccount {sa} does not exist"));
        }
        if let Err(e) = d.validate_cel() {
            errs.push(format!("{what}: refused by the CRD's CEL rules: {e}"));
        }
    }
    for e in &install.endpoints {
        let ns = e.namespace().unwrap_or_default();
        let r = &e.spec.secret_ref;
        if !secret_has(&ns, &r.name, Some(&r.key)) {
            errs.push(format!(
                "WebhookEndpoint {ns}/{}: Secret {} key {} does not exist",
                e.name_any(),
                r.name,
                r.key
            ));
        }
        if let Err(err) = e.validate_cel() {
            errs.push(format!(
                "WebhookEndpoint {ns}/{}: refused by the CRD's CEL rules: {err}",
                e.name_any()
            ));
        }
    }
    errs
}

/// The restricted Pod Security Standard, plus a read-only root filesystem, for every
/// container.
fn insecure_containers(install: &Install) -> Vec<String> {
    let mut errs = Vec::new();
    for w in install.workloads() {
        let pod = w.spec.security_context.as_ref();
        for c in w
            .spec
            .containers
            .iter()
            .chain(w.spec.init_containers.iter().flatten())
        {
            let what = format!("{} container {}", w.what, c.name);
            let sc = c.security_context.as_ref();
            let non_root = sc
                .and_then(|s| s.run_as_non_root)
                .or(pod.and_then(|p| p.run_as_non_root));
            let uid = sc
                .and_then(|s| s.run_as_user)
                .or(pod.and_then(|p| p.run_as_user));
            let seccomp = sc
                .and_then(|s| s.seccomp_profile.as_ref())
                .or(pod.and_then(|p| p.seccomp_profile.as_ref()))
                .map(|p| p.type_.as_str());
            if non_root != Some(true) {
                errs.push(format!("{what}: runAsNonRoot is not true"));
            }
            if uid.is_none_or(|u| u == 0) {
                errs.push(format!("{what}: no numeric non-root runAsUser"));
            }
            if seccomp != Some("RuntimeDefault") {
                errs.push(format!("{what}: seccomp profile is not RuntimeDefault"));
            }
            if sc.and_then(|s| s.read_only_root_filesystem) != Some(true) {
                errs.push(format!("{what}: root filesystem is not read-only"));
            }
            if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
                errs.push(format!("{what}: allowPrivilegeEscalation is not false"));
            }
            let drops_all = sc
                .and_then(|s| s.capabilities.as_ref())
                .and_then(|c| c.drop.as_ref())
                .is_some_and(|d| d.iter().any(|x| x == "ALL"));
            let adds = sc
                .and_then(|s| s.capabilities.as_ref())
                .and_then(|c| c.add.as_ref())
                .is_some_and(|a| !a.is_empty());
            if !drops_all || adds {
                errs.push(format!("{what}: capabilities must drop ALL and add none"));
            }
            if sc.and_then(|s| s.privileged) == Some(true) {
                errs.push(format!("{what}: privileged"));
            }
            if c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_none_or(|l| !l.contains_key("memory"))
            {
                errs.push(format!("{what}: no memory limit"));
            }
        }
    }
    errs
}

// ---------------------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------------------

/// Where a call applies: in every namespace (or to a cluster-scoped resource), or in one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Cluster,
    Namespace(&'static str),
}

/// One kind of call a component makes to the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    scope: Scope,
}

const fn access(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    scope: Scope,
) -> Access {
    Access {
        verb,
        group,
        resource,
        scope,
    }
}

fn expand(
    verbs: &[&'static str],
    group: &'static str,
    resource: &'static str,
    scope: Scope,
) -> Vec<Access> {
    verbs
        .iter()
        .map(|v| access(v, group, resource, scope))
        .collect()
}

/// The calls `hookd controller` makes: the controller's own list, which its tests check
/// every request against.
fn controller_required_access() -> Vec<Access> {
    hookd::k8s::REQUIRED_ACCESS
        .iter()
        .flat_map(|a| {
            let scope = if a.cluster_wide {
                Scope::Cluster
            } else {
                Scope::Namespace(INSTALL_NS)
            };
            expand(a.verbs, a.group, a.resource, scope)
        })
        .collect()
}

/// The calls `hookd api` makes: TokenReviews of producers' projected tokens.
fn api_required_access() -> Vec<Access> {
    expand(
        &["create"],
        "authentication.k8s.io",
        "tokenreviews",
        Scope::Cluster,
    )
}

/// Rules that apply to ServiceAccount `ns/name`, with the namespace they are limited to
/// (None: a ClusterRoleBinding, so every namespace).
fn bound_rules<'a>(
    install: &'a Install,
    ns: &str,
    name: &str,
) -> Vec<(Option<String>, &'a PolicyRule)> {
    let is_subject = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == name && s.namespace.as_deref() == Some(ns)
        })
    };
    let cluster_role = |n: &str| install.cluster_roles.iter().find(|r| r.name_any() == n);
    let mut out = Vec::new();
    for b in install
        .cluster_role_bindings
        .iter()
        .filter(|b| is_subject(&b.subjects))
    {
        if let Some(r) = cluster_role(&b.role_ref.name).filter(|_| b.role_ref.kind == "ClusterRole")
        {
            out.extend(r.rules.iter().flatten().map(|rule| (None, rule)));
        }
    }
    for b in install
        .role_bindings
        .iter()
        .filter(|b| is_subject(&b.subjects))
    {
        let bns = b.namespace();
        let rules: Vec<&PolicyRule> = match b.role_ref.kind.as_str() {
            "ClusterRole" => cluster_role(&b.role_ref.name)
                .into_iter()
                .flat_map(|r| r.rules.iter().flatten())
                .collect(),
            _ => install
                .roles
                .iter()
                .filter(|r| r.name_any() == b.role_ref.name && r.namespace() == bns)
                .flat_map(|r| r.rules.iter().flatten())
                .collect(),
        };
        out.extend(rules.into_iter().map(|rule| (bns.clone(), rule)));
    }
    out
}

fn rule_matches(rule: &PolicyRule, a: &Access) -> bool {
    let has = |list: &Option<Vec<String>>, want: &str| {
        list.iter().flatten().any(|x| x == "*" || x == want)
    };
    rule.resource_names.as_ref().is_none_or(Vec::is_empty)
        && has(&Some(rule.verbs.clone()), a.verb)
        && has(&rule.api_groups, a.group)
        && has(&rule.resources, a.resource)
}

/// Does the RBAC in `install` let ServiceAccount `ns/name` make call `a`? A cluster-wide
/// call needs a ClusterRoleBinding; a namespaced one is also allowed by a RoleBinding in
/// that namespace.
fn allows(install: &Install, ns: &str, name: &str, a: &Access) -> bool {
    bound_rules(install, ns, name)
        .into_iter()
        .any(|(limit, rule)| {
            let in_scope = match (&limit, a.scope) {
                (None, _) => true,
                (Some(l), Scope::Namespace(n)) => l == n,
                (Some(_), Scope::Cluster) => false,
            };
            in_scope && rule_matches(rule, a)
        })
}

/// Everything the bound rules grant, expanded (wildcards are reported, not expanded).
fn granted(install: &Install, ns: &str, name: &str) -> Result<BTreeSet<Access>, String> {
    let mut out = BTreeSet::new();
    for (limit, rule) in bound_rules(install, ns, name) {
        let lists = [
            Some(&rule.verbs),
            rule.api_groups.as_ref(),
            rule.resources.as_ref(),
        ];
        if lists
            .iter()
            .flatten()
            .any(|l| l.iter().any(|x| x.contains('*')))
            || rule.non_resource_urls.is_some()
        {
            return Err(format!(
                "{ns}/{name}: wildcard or non-resource rule {rule:?}"
            ));
        }
        let scope = match &limit {
            None => Scope::Cluster,
            // Leak the namespace name: it lives for the test only.
            Some(n) => Scope::Namespace(Box::leak(n.clone().into_boxed_str())),
        };
        for verb in &rule.verbs {
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    let leak =
                        |s: &String| -> &'static str { Box::leak(s.clone().into_boxed_str()) };
                    out.insert(access(leak(verb), leak(group), leak(resource), scope));
                }
            }
        }
    }
    Ok(out)
}

/// Required accesses the RBAC does not allow, and allowed ones nothing requires.
fn rbac_problems(install: &Install, sa: &str, required: &[Access]) -> Vec<String> {
    let mut errs = Vec::new();
    for a in required {
        if !allows(install, INSTALL_NS, sa, a) {
            errs.push(format!(
                "{sa} may not {} {}/{} ({:?})",
                a.verb, a.group, a.resource, a.scope
            ));
        }
    }
    match granted(install, INSTALL_NS, sa) {
        Err(e) => errs.push(e),
        Ok(granted) => {
            for g in granted.iter().filter(|g| !required.contains(g)) {
                errs.push(format!(
                    "{sa} may {} {}/{} ({:?}), which no hookd code needs",
                    g.verb, g.group, g.resource, g.scope
                ));
            }
        }
    }
    errs
}

// ---------------------------------------------------------------------------------------
// The install as a whole
// ---------------------------------------------------------------------------------------

fn container<'a>(d: &'a Deployment, name: &str) -> &'a Container {
    let spec = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{} has a container {name}", d.name_any()))
}

fn env<'a>(c: &'a Container, name: &str) -> Option<&'a k8s_openapi::api::core::v1::EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

fn secret_env(c: &Container, name: &str) -> Option<(String, String)> {
    env(c, name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|f| f.secret_key_ref.as_ref())
        .map(|r| (r.name.clone(), r.key.clone()))
}

/// The checks every rendering of the install must pass; `external` are the Secrets the
/// user creates. Returns the image every hookd container runs.
fn check_install(objects: &[Value], external: External<'_>) -> (Install, String) {
    let install = parse_install(objects);
    let mut errs = broken_references(&install, external);
    errs.extend(insecure_containers(&install));
    errs.extend(rbac_problems(
        &install,
        "hookd-controller",
        &controller_required_access(),
    ));
    errs.extend(rbac_problems(&install, "hookd-api", &api_required_access()));
    for sa in ["hookd-dispatcher", "hookd-migrate"] {
        errs.extend(rbac_problems(&install, sa, &[]));
        let automount = install
            .service_accounts
            .iter()
            .find(|s| s.name_any() == sa && s.namespace().as_deref() == Some(INSTALL_NS))
            .and_then(|s| s.automount_service_account_token);
        if automount != Some(false) {
            errs.push(format!("ServiceAccount {sa} must not automount a token"));
        }
    }

    let controller = install.deployment("hookd-controller");
    let api = install.deployment("hookd-api");
    let image = container(controller, "controller").image.clone().unwrap();
    for d in [controller, api] {
        let spec = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            if c.image.as_ref() != Some(&image) {
                errs.push(format!(
                    "{} container {} runs {:?}, not {image}",
                    d.name_any(),
                    c.name,
                    c.image
                ));
            }
        }
        // Migrations run before the component starts.
        let migrate = container(d, "migrate");
        let first_init = spec
            .init_containers
            .iter()
            .flatten()
            .next()
            .map(|c| c.name.as_str());
        if migrate.args.as_deref() != Some(&["migrate".to_string()][..])
            || first_init != Some("migrate")
        {
            errs.push(format!(
                "{}: the first init container must run `hookd migrate`",
                d.name_any()
            ));
        }
        for c in [migrate, &spec.containers[0]] {
            if secret_env(c, "DATABASE_URL") != Some(("hookd-database".into(), "url".into())) {
                errs.push(format!(
                    "{} {}: DATABASE_URL must come from Secret hookd-database key url",
                    d.name_any(),
                    c.name
                ));
            }
        }
    }
    let hookd_image_env =
        env(container(controller, "controller"), "HOOKD_IMAGE").and_then(|e| e.value.clone());
    if hookd_image_env.as_ref() != Some(&image) {
        errs.push(format!(
            "controller HOOKD_IMAGE is {hookd_image_env:?}, its own image is {image}"
        ));
    }

    // The controller: two replicas electing a leader, identified by pod name.
    let c = container(controller, "controller");
    if controller.spec.as_ref().unwrap().replicas != Some(2) {
        errs.push("hookd-controller must run 2 replicas".into());
    }
    for (var, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let field = env(c, var)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|f| f.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        if field != Some(path) {
            errs.push(format!(
                "controller {var} must come from the downward API ({path})"
            ));
        }
    }
    if secret_env(c, "HOOKD_ENCRYPTION_KEY") != Some(("hookd-encryption".into(), "key".into())) {
        errs.push(
            "controller HOOKD_ENCRYPTION_KEY must come from Secret hookd-encryption key key".into(),
        );
    }
    // Each component's own port, probes on it.
    for (d, cname, port) in [(controller, "controller", 8082), (api, "api", 8080)] {
        let c = container(d, cname);
        let listen = env(c, "HOOKD_LISTEN").and_then(|e| e.value.clone());
        if listen != Some(format!("0.0.0.0:{port}")) {
            errs.push(format!(
                "{cname}: HOOKD_LISTEN must be 0.0.0.0:{port}, is {listen:?}"
            ));
        }
        let http = c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("http"))
            .map(|p| p.container_port);
        if http != Some(port) {
            errs.push(format!("{cname}: container port http must be {port}"));
        }
        for (which, probe, path) in [
            ("liveness", &c.liveness_probe, "/healthz"),
            ("readiness", &c.readiness_probe, "/readyz"),
        ] {
            let got = probe.as_ref().and_then(|p| p.http_get.as_ref());
            if got.and_then(|h| h.path.as_deref()) != Some(path)
                || got.map(|h| &h.port) != Some(&IntOrString::String("http".into()))
            {
                errs.push(format!(
                    "{cname}: {which} probe must GET {path} on port http"
                ));
            }
        }
    }
    // The API Service and its disruption budget.
    let svc = install
        .services
        .iter()
        .find(|s| s.name_any() == "hookd-api")
        .expect("Service hookd-api");
    let port = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    if (port.name.as_deref(), port.port, port.target_port.clone())
        != (Some("http"), 80, Some(IntOrString::String("http".into())))
    {
        errs.push(format!(
            "Service hookd-api must map port 80 (http) to the pods' http port: {port:?}"
        ));
    }
    if !install.pdbs.iter().any(|p| p.name_any() == "hookd-api") {
        errs.push("PodDisruptionBudget hookd-api missing".into());
    }
    // Shared settings never carry a listener.
    let config = install
        .config_maps
        .iter()
        .find(|c| c.name_any() == "hookd-config")
        .expect("ConfigMap hookd-config");
    if config
        .data
        .iter()
        .flatten()
        .any(|(k, _)| k == "HOOKD_LISTEN")
    {
        errs.push(
            "ConfigMap hookd-config must not set HOOKD_LISTEN: every component has its own port"
                .into(),
        );
    }
    if !install
        .dispatchers
        .iter()
        .any(|d| d.name_any() == "default" && d.namespace().as_deref() == Some(INSTALL_NS))
    {
        errs.push("the default WebhookDispatcher is missing".into());
    }
    // The CRDs are the generated ones, unchanged.
    // kustomize orders objects its own way; compare by name.
    let by_name = |mut v: Vec<Value>| {
        v.sort_by_key(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        v
    };
    let generated = by_name(yaml_stream(&hookd::k8s::crds_yaml(), "hookd crd"));
    let rendered = by_name(
        install
            .crds
            .iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect(),
    );
    let drift = diff(&Value::Array(generated), &Value::Array(rendered), "crds");
    if !drift.is_empty() {
        errs.push(format!(
            "the rendered CRDs differ from `hookd crd`: {drift:?}"
        ));
    }
    assert!(errs.is_empty(), "install problems:\n{}", errs.join("\n"));
    (install, image)
}

#[test]
fn base_install_renders_parses_and_resolves() {
    let objects = render("manifests");
    let (install, image) = check_install(&objects, USER_SECRETS);
    assert_eq!(image, "hookd:0.1.0");
    assert!(
        install.secrets.is_empty(),
        "the base ships no Secret values"
    );
    assert!(
        install.stateful_sets.is_empty(),
        "Postgres is the dev overlay's"
    );
    // manifests/ is base/ and nothing else.
    let (base, _) = render_files(&repo("manifests/base"));
    assert_eq!(base, render_files(&repo("manifests")).0);
}

#[test]
fn dev_overlay_is_self_contained() {
    let objects = render("manifests/overlays/dev");
    // No user Secrets: an empty cluster gets everything it needs.
    let (install, _) = check_install(&objects, &[]);
    let string_data = |name: &str, key: &str| -> String {
        let s = install
            .secrets
            .iter()
            .find(|s| s.name_any() == name)
            .unwrap_or_else(|| panic!("Secret {name}"));
        s.string_data
            .as_ref()
            .and_then(|d| d.get(key))
            .cloned()
            .unwrap_or_else(|| panic!("{name} has {key}"))
    };
    let url = string_data("hookd-database", "url");
    let password = string_data("hookd-postgres", "password");
    assert_eq!(
        url,
        format!(
            "postgres://hookd:{password}@hookd-postgres.{INSTALL_NS}.svc:5432/hookd?sslmode=disable"
        ),
        "the database URL matches the dev Postgres (user, password, Service, database)"
    );
    let key = string_data("hookd-encryption", "key");
    let (id, b64) = key.split_once(':').expect("<key-id>:<base64>");
    assert!(!id.is_empty());
    use base64::Engine;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap()
            .len(),
        32
    );
    let pg = &install.stateful_sets[0];
    let pg_spec = pg.spec.as_ref().unwrap();
    assert_eq!(pg_spec.replicas, Some(1));
    assert_eq!(
        pg_spec.volume_claim_templates.as_ref().map(Vec::len),
        Some(1)
    );
    let dispatcher = install
        .dispatchers
        .iter()
        .find(|d| d.name_any() == "default")
        .unwrap();
    for cidr in ["10.244.0.0/16", "10.96.0.0/12"] {
        assert!(
            dispatcher
                .spec
                .allowed_destinations
                .iter()
                .any(|c| c == cidr),
            "kind's {cidr} is admitted"
        );
    }
    assert!(
        dispatcher.spec.database_secret_ref.name == "hookd-database",
        "the patch kept the base's fields"
    );
}

/// The e2e applies the dev overlay retagged to `hookd:e2e` plus its own objects; one
/// `images:` entry must retag every hookd container and HOOKD_IMAGE, two levels down.
#[test]
fn e2e_objects_resolve_and_one_images_entry_retags_everything() {
    let mut objects = render("e2e");
    // The Secret and WebhookEndpoint run.sh applies once hookd is up (the receiver mounts
    // the Secret, so it waits for them).
    objects.extend(yaml_stream(
        &read(&repo("e2e/endpoint.yaml")),
        "e2e/endpoint.yaml",
    ));
    let (install, image) = check_install(&objects, &[]);
    assert_eq!(image, "hookd:e2e");
    let receiver = install.deployment("receiver");
    let c = container(receiver, "receiver");
    assert_eq!(c.image.as_deref(), Some("hookd:e2e"));
    assert_eq!(c.args.as_ref().unwrap()[0], "receiver");
    assert_eq!(install.endpoints.len(), 1);
    let url = &install.endpoints[0].spec.url;
    assert!(url.starts_with("http://receiver.e2e.svc"), "{url}");
}

#[test]
fn rbac_checker_refuses_what_is_not_granted() {
    let install = parse_install(&render("manifests"));
    let ns = Scope::Namespace(INSTALL_NS);
    for (sa, a) in [
        (
            "hookd-controller",
            access("delete", "apps", "deployments", ns),
        ),
        (
            "hookd-controller",
            access("create", "apps", "deployments", Scope::Namespace("default")),
        ),
        (
            "hookd-controller",
            access("list", "apps", "deployments", Scope::Cluster),
        ),
        ("hookd-controller", access("create", "", "secrets", ns)),
        (
            "hookd-controller",
            access(
                "update",
                "hookd.dev",
                "webhookendpoints/finalizers/x",
                Scope::Cluster,
            ),
        ),
        ("hookd-api", access("get", "", "secrets", ns)),
        ("hookd-dispatcher", access("get", "", "secrets", ns)),
        (
            "nobody",
            access(
                "create",
                "authentication.k8s.io",
                "tokenreviews",
                Scope::Cluster,
            ),
        ),
    ] {
        assert!(
            !allows(&install, INSTALL_NS, sa, &a),
            "{sa} must not be allowed {a:?}"
        );
    }
    // Cluster-wide grants reach every namespace; namespaced ones only their own.
    assert!(allows(
        &install,
        INSTALL_NS,
        "hookd-controller",
        &access("watch", "", "secrets", Scope::Namespace("team-a"))
    ));
    assert!(allows(
        &install,
        INSTALL_NS,
        "hookd-controller",
        &access("patch", "coordination.k8s.io", "leases", ns)
    ));
    assert!(!allows(
        &install,
        INSTALL_NS,
        "hookd-controller",
        &access(
            "patch",
            "coordination.k8s.io",
            "leases",
            Scope::Namespace("kube-system")
        )
    ));
    // And the least-privilege comparison notices an unneeded grant.
    let mut fewer = controller_required_access();
    fewer.retain(|a| a.resource != "leases");
    assert!(
        rbac_problems(&install, "hookd-controller", &fewer)
            .iter()
            .any(|e| e.contains("leases"))
    );
}

#[test]
fn round_trip_catches_misspelt_fields() {
    let objects = render("manifests");
    let mut api = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "hookd-api")
        .unwrap()
        .clone();
    let c = &mut api["spec"]["template"]["spec"]["containers"][0];
    c["securityContext"]["readOnlyRootFileSystem"] = Value::Bool(true);
    let err = typed::<Deployment>(&api).unwrap_err();
    assert!(
        err.contains("readOnlyRootFileSystem: unknown field"),
        "{err}"
    );

    let mut d = objects
        .iter()
        .find(|o| o["kind"] == "WebhookDispatcher")
        .unwrap()
        .clone();
    d["spec"]["replica"] = Value::from(3);
    assert!(typed::<WebhookDispatcher>(&d).is_err());
}

#[test]
fn references_checker_notices_broken_references() {
    let objects = render("manifests/overlays/dev");
    let mutate = |f: &dyn Fn(&mut Vec<Value>)| {
        let mut objs = objects.clone();
        f(&mut objs);
        broken_references(&parse_install(&objs), &[])
    };
    fn find(objs: &[Value], kind: &str, name: &str) -> usize {
        objs.iter()
            .position(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap()
    }
    type Breakage = Box<dyn Fn(&mut Vec<Value>)>;
    let cases: [(&str, Breakage); 5] = [
        (
            "ServiceAccount hookd-apj",
            Box::new(|o| {
                let i = find(o, "Deployment", "hookd-api");
                o[i]["spec"]["template"]["spec"]["serviceAccountName"] = "hookd-apj".into();
            }),
        ),
        (
            "key uri of Secret hookd-database",
            Box::new(|o| {
                let i = find(o, "Deployment", "hookd-controller");
                let env = o[i]["spec"]["template"]["spec"]["containers"][0]["env"]
                    .as_array_mut()
                    .unwrap();
                let db = env
                    .iter_mut()
                    .find(|e| e["name"] == "DATABASE_URL")
                    .unwrap();
                db["valueFrom"]["secretKeyRef"]["key"] = "uri".into();
            }),
        ),
        (
            "ConfigMap hookd-confg",
            Box::new(|o| {
                let i = find(o, "Deployment", "hookd-api");
                o[i]["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"] =
                    "hookd-confg".into();
            }),
        ),
        (
            "ClusterRole hookd-ap",
            Box::new(|o| {
                let i = find(o, "ClusterRoleBinding", "hookd-api");
                o[i]["roleRef"]["name"] = "hookd-ap".into();
            }),
        ),
        (
            "unknown volume",
            Box::new(|o| {
                let i = find(o, "StatefulSet", "hookd-postgres");
                o[i]["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] = "pgdata".into();
            }),
        ),
    ];
    for (want, f) in cases {
        let errs = mutate(&*f);
        assert!(
            errs.iter().any(|e| e.contains(want)),
            "expected a problem naming {want:?}, got {errs:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Monitoring
// ---------------------------------------------------------------------------------------

/// Series Prometheus makes itself, per scrape target.
const PROMETHEUS_SERIES: [&str; 1] = ["up"];

/// Every series name hookd exports: counters get `_total`, histograms `_bucket`, `_sum`
/// and `_count`.
fn exported_series() -> BTreeSet<String> {
    let m = hookd::metrics::Metrics::new();
    // A labelled family is rendered only once it has a label set; give each one.
    let _ = m.http_requests.get_or_create(&hookd::metrics::RouteStatus {
        route: "messages",
        status: 201,
    });
    let _ = m
        .delivery_attempts
        .get_or_create(&hookd::metrics::Outcome { outcome: "dead" });
    let text = m.render();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

const PROMQL_KEYWORDS: [&str; 25] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "limitk",
    "limit_ratio",
];

/// The metric names a PromQL expression reads: identifiers that are not functions,
/// keywords, label names, durations or strings.
fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    // Drop strings, label matchers and range/subquery brackets.
    let mut flat = String::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
                flat.push(' ');
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                let mut in_string = None;
                for d in chars.by_ref() {
                    match in_string {
                        Some(q) if d == q => in_string = None,
                        Some(_) => {}
                        None if d == '"' || d == '\'' => in_string = Some(d),
                        None if d == close => break,
                        None => {}
                    }
                }
                flat.push(' ');
            }
            _ => flat.push(c),
        }
    }
    let b = flat.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_digit() || c == '.' {
            while i < b.len()
                && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_')
            {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < b.len()
                && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
            {
                i += 1;
            }
            let ident = &flat[start..i];
            let next = flat[i..].trim_start().chars().next();
            let grouping = [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&ident);
            if grouping && next == Some('(') {
                // skip the label list
                let open = i + flat[i..].find('(').unwrap();
                i = open + flat[open..].find(')').unwrap() + 1;
                continue;
            }
            if next != Some('(') && !PROMQL_KEYWORDS.contains(&ident) {
                names.insert(ident.to_string());
            }
            continue;
        }
        i += 1;
    }
    names
}

#[test]
fn promql_metric_name_extraction() {
    let names = |e: &str| promql_metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le) (rate(hookd_delivery_seconds_bucket{job=~"a|b", x='}'}[5m])))"#
        ),
        ["hookd_delivery_seconds_bucket"]
    );
    assert_eq!(
        names("max(hookd_backlog) > 1000 and deriv(max(hookd_backlog)[15m:1m]) > 0"),
        ["hookd_backlog"]
    );
    assert_eq!(
        names(
            r#"absent(up{component="dispatcher"} == 1) or sum(x offset 5m) without (pod) / on(a) group_left y"#
        ),
        ["up", "x", "y"]
    );
    assert_eq!(
        names("sum(rate(hookd_a_total[5m])) by (outcome) * 1e3"),
        ["hookd_a_total"]
    );
}

/// Parenthesis balance: a cheap guard against a broken expression.
fn balanced(expr: &str) -> bool {
    let mut depth = 0i32;
    for c in expr.chars() {
        depth += match c {
            '(' | '{' | '[' => 1,
            ')' | '}' | ']' => -1,
            _ => 0,
        };
        if depth < 0 {
            return false;
        }
    }
    depth == 0
}

fn check_expressions(origin: &str, exprs: &[String]) -> Vec<String> {
    let exported = exported_series();
    let mut errs = Vec::new();
    for e in exprs {
        if !balanced(e) {
            errs.push(format!("{origin}: unbalanced brackets in {e}"));
        }
        let names = promql_metric_names(e);
        if names.is_empty() {
            errs.push(format!("{origin}: {e} reads no metric"));
        }
        for n in names {
            if !exported.contains(&n) && !PROMETHEUS_SERIES.contains(&n.as_str()) {
                errs.push(format!(
                    "{origin}: {e} reads {n}, which hookd does not export (it exports {exported:?})"
                ));
            }
        }
    }
    errs
}

fn rules_file() -> Value {
    yaml_stream(
        &read(&repo("manifests/monitoring/hookd.rules.yaml")),
        "hookd.rules.yaml",
    )
    .remove(0)
}

#[test]
fn alert_rules_use_exported_metrics_and_cover_the_required_alerts() {
    let rules = rules_file();
    let mut exprs = Vec::new();
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let name = r["alert"]
                .as_str()
                .or(r["record"].as_str())
                .expect("alert or record");
            exprs.push(
                r["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: expr"))
                    .to_string(),
            );
            if r["alert"].is_string() {
                alerts.insert(name.to_string());
                assert!(
                    r["labels"]["severity"].is_string(),
                    "{name}: severity label"
                );
                assert!(r["annotations"]["summary"].is_string(), "{name}: summary");
                assert!(
                    r["annotations"]["description"].is_string(),
                    "{name}: description"
                );
            }
        }
    }
    for want in [
        "HookdBacklogGrowing",
        "HookdOldestDueDeliveryTooOld",
        "HookdDeadLetters",
        "HookdCircuitOpened",
        "HookdDispatcherDown",
    ] {
        assert!(alerts.contains(want), "alert {want} missing: {alerts:?}");
    }
    let errs = check_expressions("hookd.rules.yaml", &exprs);
    assert!(errs.is_empty(), "{}", errs.join("\n"));

    // The PrometheusRule carries exactly the same rules.
    let pr = yaml_stream(
        &read(&repo("manifests/monitoring/prometheusrule.yaml")),
        "prometheusrule.yaml",
    )
    .remove(0);
    assert_eq!(pr["kind"], "PrometheusRule");
    assert_eq!(
        pr["spec"], rules,
        "prometheusrule.yaml and hookd.rules.yaml must hold the same groups"
    );
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

#[test]
fn dashboard_uses_exported_metrics() {
    let text = read(&repo("manifests/monitoring/hookd-dashboard.json"));
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(dash["title"].is_string() && dash["uid"].is_string());
    let mut exprs = Vec::new();
    collect_exprs(&dash["panels"], &mut exprs);
    assert!(exprs.len() >= 10, "a panel per concern: {exprs:?}");
    let errs = check_expressions("hookd-dashboard.json", &exprs);
    assert!(errs.is_empty(), "{}", errs.join("\n"));
    // Every panel reads the datasource variable, so the dashboard imports anywhere.
    for p in dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
    {
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {}",
            p["title"]
        );
    }
}

#[test]
fn monitoring_kustomization_renders() {
    let objects = render("manifests/monitoring");
    let kinds: BTreeSet<String> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ConfigMap".into(),
            "PodMonitor".into(),
            "PrometheusRule".into()
        ])
    );
    let cm: ConfigMap = typed(objects.iter().find(|o| o["kind"] == "ConfigMap").unwrap()).unwrap();
    assert_eq!(
        cm.labels().get("grafana_dashboard").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        cm.data.as_ref().unwrap()["hookd-dashboard.json"],
        read(&repo("manifests/monitoring/hookd-dashboard.json"))
    );
    for o in &objects {
        assert_eq!(o["metadata"]["namespace"], INSTALL_NS, "{}", o["kind"]);
    }
}
