//! Workloads, references between objects, and container security.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------
// Workloads, references and security
// ---------------------------------------------------------------------------------------

pub(crate) struct Workload<'a> {
    pub(crate) what: String,
    pub(crate) ns: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) selector: Option<&'a LabelSelector>,
    pub(crate) spec: &'a PodSpec,
    pub(crate) claim_templates: Vec<String>,
}

impl Install {
    pub(crate) fn workloads(&self) -> Vec<Workload<'_>> {
        let mut out = Vec::new();
        for d in self.deployments.iter().chain(&self.generated) {
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

    pub(crate) fn deployment(&self, name: &str) -> &Deployment {
        self.deployments
            .iter()
            .find(|d| d.name_any() == name)
            .unwrap_or_else(|| panic!("Deployment {name} is rendered"))
    }
}

/// Secrets the install expects its user to create (the base ships no secret values):
/// (namespace, name, keys).
pub(crate) type External<'a> = &'a [(&'a str, &'a str, &'a [&'a str])];

pub(crate) const USER_SECRETS: External<'static> = &[
    (INSTALL_NS, "hookd-database", &["url"]),
    (INSTALL_NS, "hookd-encryption", &["key"]),
];

pub(crate) fn selects(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub(crate) fn match_labels(s: Option<&LabelSelector>) -> BTreeMap<String, String> {
    assert!(
        s.is_none_or(|s| s.match_expressions.is_none()),
        "selectors use matchLabels only"
    );
    s.and_then(|s| s.match_labels.clone()).unwrap_or_default()
}

/// Every reference between objects, checked; returns one message per broken one.
pub(crate) fn broken_references(install: &Install, external: External<'_>) -> Vec<String> {
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
        network_policies,
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
pub(crate) fn insecure_containers(install: &Install) -> Vec<String> {
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
