//! The CRDs committed under `crds/` are exactly what the Rust types generate, so a
//! schema change cannot ship without regenerating them (`hookd crd > crds/hookd.dev.yaml`).

use kube::CustomResourceExt;

#[test]
fn committed_crds_match_generated() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crds/hookd.dev.yaml"))
            .expect("crds/hookd.dev.yaml exists");
    assert_eq!(
        committed,
        hookd::k8s::crds_yaml(),
        "crds/hookd.dev.yaml is stale: run `cargo run -q -- crd > crds/hookd.dev.yaml`"
    );
}

#[test]
fn crd_has_printer_columns_short_name_and_cel_rules() {
    let crd = serde_json::to_value(hookd::k8s::WebhookEndpoint::crd()).unwrap();
    let v = &crd["spec"]["versions"][0];
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for want in ["Ready", "Circuit", "Backlog", "Age"] {
        assert!(
            columns.contains(&want),
            "missing printer column {want}: {columns:?}"
        );
    }
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "whep");
    assert_eq!(crd["spec"]["group"], "hookd.dev");
    assert_eq!(v["name"], "v1alpha1");
    let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert!(spec["properties"]["url"]["x-kubernetes-validations"].is_array());
    assert!(
        spec["required"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("secretRef"))
    );
}

/// The CEL rules themselves, evaluated locally with kube's `cel` feature.
#[test]
fn cel_rules_refuse_bad_specs() {
    let base = serde_json::json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "e", "namespace": "n"},
        "spec": {"url": "https://example.com/hook", "eventTypes": ["invoice.*", "user.created"],
                 "secretRef": {"name": "s", "key": "secret"}}
    });
    let check = |patch: serde_json::Value| {
        let mut v = base.clone();
        for (k, val) in patch.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        let ep: hookd::k8s::WebhookEndpoint = serde_json::from_value(v).unwrap();
        ep.validate_cel()
    };
    assert!(check(serde_json::json!({})).is_ok());
    for bad in [
        serde_json::json!({"url": "ftp://example.com"}),
        serde_json::json!({"url": "https://user:pw@example.com/"}),
        serde_json::json!({"url": "example.com/hook"}),
        serde_json::json!({"eventTypes": ["a..b"]}),
        serde_json::json!({"eventTypes": ["a b"]}),
        serde_json::json!({"tenant": "-x"}),
        serde_json::json!({"retrySchedule": [0]}),
        serde_json::json!({"headers": {"webhook-id": "x"}}),
        serde_json::json!({"headers": {"Content-Type": "x"}}),
    ] {
        assert!(check(bad.clone()).is_err(), "should be refused: {bad}");
    }
    assert!(
        check(
            serde_json::json!({"eventTypes": ["*"], "headers": {"X-Team": "a"}, "tenant": "team.a"})
        )
        .is_ok()
    );
}
