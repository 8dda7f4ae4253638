//! Limits, network policies and disruption budgets: every hookd pod, the dispatcher pods the
//! controller makes included, has CPU and memory limits, accepts connections on its `http`
//! port only, and the controller and dispatchers survive a node drain one pod at a time.

#[allow(unused_imports)]
use super::*;

fn is_hookd(w: &Workload<'_>) -> bool {
    w.labels.get("app.kubernetes.io/name").map(String::as_str) == Some("hookd")
}

pub(crate) fn policy_problems(install: &Install) -> Vec<String> {
    let mut errs = Vec::new();
    for w in install.workloads() {
        if w.ns != INSTALL_NS {
            continue;
        }
        if is_hookd(&w) {
            for c in w
                .spec
                .containers
                .iter()
                .chain(w.spec.init_containers.iter().flatten())
            {
                let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
                for resource in ["cpu", "memory"] {
                    if limits.is_none_or(|l| !l.contains_key(resource)) {
                        errs.push(format!(
                            "{} container {}: no {resource} limit",
                            w.what, c.name
                        ));
                    }
                }
            }
        }
        let policies: Vec<&NetworkPolicy> = install
            .network_policies
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(w.ns.as_str()))
            .filter(|p| {
                let spec = p.spec.as_ref().unwrap();
                selects(&match_labels(spec.pod_selector.as_ref()), &w.labels)
                    && spec.policy_types.iter().flatten().any(|t| t == "Ingress")
            })
            .collect();
        if policies.is_empty() {
            errs.push(format!("{}: no NetworkPolicy limits its ingress", w.what));
        }
        if is_hookd(&w) {
            for p in &policies {
                for rule in p.spec.as_ref().unwrap().ingress.iter().flatten() {
                    let ports: Vec<_> = rule.ports.iter().flatten().collect();
                    if ports.is_empty()
                        || ports
                            .iter()
                            .any(|port| port.port != Some(IntOrString::String("http".into())))
                    {
                        errs.push(format!(
                            "{}: NetworkPolicy {} admits more than the http port",
                            w.what,
                            p.name_any()
                        ));
                    }
                }
            }
            let component = w.labels.get("app.kubernetes.io/component");
            if matches!(
                component.map(String::as_str),
                Some("controller" | "dispatcher")
            ) && !install.pdbs.iter().any(|p| {
                p.namespace().as_deref() == Some(w.ns.as_str())
                    && selects(
                        &match_labels(p.spec.as_ref().and_then(|s| s.selector.as_ref())),
                        &w.labels,
                    )
            }) {
                errs.push(format!("{}: no PodDisruptionBudget", w.what));
            }
        }
    }
    errs
}

#[test]
pub(crate) fn every_pod_has_limits_an_ingress_policy_and_a_disruption_budget() {
    for dir in ["manifests", "manifests/overlays/dev"] {
        let install = parse_install(&render(dir));
        assert!(
            install
                .generated
                .iter()
                .any(|d| d.name_any() == "hookd-dispatcher-default"),
            "the default dispatcher's Deployment is checked too"
        );
        let errs = policy_problems(&install);
        assert!(errs.is_empty(), "{dir}:\n{}", errs.join("\n"));
    }
}

#[test]
pub(crate) fn policy_checker_notices_what_is_missing() {
    let objects = render("manifests/overlays/dev");
    let without = |kind: &str, name: &str| -> Vec<String> {
        let objs: Vec<Value> = objects
            .iter()
            .filter(|o| !(o["kind"] == kind && o["metadata"]["name"] == name))
            .cloned()
            .collect();
        policy_problems(&parse_install(&objs))
    };
    let errs = without("NetworkPolicy", "hookd").join("\n");
    for d in ["hookd-api", "hookd-controller", "hookd-dispatcher-default"] {
        assert!(
            errs.contains(&format!("{d}: no NetworkPolicy")),
            "{d}: {errs}"
        );
    }
    assert!(
        without("NetworkPolicy", "hookd-postgres")
            .join("\n")
            .contains("StatefulSet hookd-system/hookd-postgres: no NetworkPolicy")
    );
    assert!(
        without("PodDisruptionBudget", "hookd-dispatcher")
            .join("\n")
            .contains("hookd-dispatcher-default: no PodDisruptionBudget")
    );
    let mut no_cpu = objects.clone();
    let i = no_cpu
        .iter()
        .position(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "hookd-controller")
        .unwrap();
    no_cpu[i]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        .as_object_mut()
        .unwrap()
        .remove("cpu");
    assert!(
        policy_problems(&parse_install(&no_cpu))
            .join("\n")
            .contains("container controller: no cpu limit")
    );
}
