//! The install as a whole: the base, the dev overlay and the e2e kustomization.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------
// The install as a whole
// ---------------------------------------------------------------------------------------

pub(crate) fn container<'a>(d: &'a Deployment, name: &str) -> &'a Container {
    let spec = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{} has a container {name}", d.name_any()))
}

pub(crate) fn env<'a>(
    c: &'a Container,
    name: &str,
) -> Option<&'a k8s_openapi::api::core::v1::EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

pub(crate) fn secret_env(c: &Container, name: &str) -> Option<(String, String)> {
    env(c, name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|f| f.secret_key_ref.as_ref())
        .map(|r| (r.name.clone(), r.key.clone()))
}

/// The checks every rendering of the install must pass; `external` are the Secrets the
/// user creates. Returns the image every hookd container runs.
pub(crate) fn check_install(objects: &[Value], external: External<'_>) -> (Install, String) {
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
pub(crate) fn base_install_renders_parses_and_resolves() {
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
pub(crate) fn dev_overlay_is_self_contained() {
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

/// The endpoints API checks each endpoint URL against the outbound policy when it is
/// created, so on kind the API must admit what the dev dispatcher admits, or the endpoints
/// API and the portal would refuse every in-cluster receiver the dispatcher can reach.
#[test]
pub(crate) fn dev_overlay_gives_the_api_the_dispatchers_allowed_destinations() {
    let objects = render("manifests/overlays/dev");
    let (install, _) = check_install(&objects, &[]);
    let dispatcher = install
        .dispatchers
        .iter()
        .find(|d| d.name_any() == "default")
        .unwrap();
    let api = container(install.deployment("hookd-api"), "api");
    // The value the API process sees: its own env, else what envFrom brings in.
    let from_config_maps = || {
        api.env_from.iter().flatten().find_map(|source| {
            let name = &source.config_map_ref.as_ref()?.name;
            install
                .config_maps
                .iter()
                .find(|c| &c.name_any() == name)?
                .data
                .as_ref()?
                .get("HOOKD_ALLOWED_DESTINATIONS")
                .cloned()
        })
    };
    let value = env(api, "HOOKD_ALLOWED_DESTINATIONS")
        .and_then(|e| e.value.clone())
        .or_else(from_config_maps)
        .expect("the dev overlay gives hookd api HOOKD_ALLOWED_DESTINATIONS");
    let api_cidrs: BTreeSet<&str> = value.split(',').map(str::trim).collect();
    let dispatcher_cidrs: BTreeSet<&str> = dispatcher
        .spec
        .allowed_destinations
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(
        api_cidrs, dispatcher_cidrs,
        "the API admits exactly what the dev dispatcher admits"
    );
}

/// The e2e applies the dev overlay retagged to `hookd:e2e` plus its own objects; one
/// `images:` entry must retag every hookd container and HOOKD_IMAGE, two levels down.
#[test]
pub(crate) fn e2e_objects_resolve_and_one_images_entry_retags_everything() {
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
pub(crate) fn rbac_checker_refuses_what_is_not_granted() {
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
pub(crate) fn round_trip_catches_misspelt_fields() {
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
pub(crate) fn references_checker_notices_broken_references() {
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
