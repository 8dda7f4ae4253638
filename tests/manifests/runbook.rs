//! The key-rotation runbook (`manifests/README.md`) against the install: every restart it
//! tells the operator to do reaches every Deployment that holds the encryption key, the
//! dispatcher Deployments the controller generates included.

#[allow(unused_imports)]
use super::*;

use hookd::k8s::dispatcher_controller::desired_deployment;

const KEY_SECRET: &str = "hookd-encryption";

/// Whether any container of the Deployment reads Secret `secret` (env, envFrom, volume).
pub(crate) fn reads_secret(d: &Deployment, secret: &str) -> bool {
    let spec = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let from_env = containers.clone().any(|c| {
        c.env.iter().flatten().any(|e| {
            e.value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                .is_some_and(|r| r.name == secret)
        }) || c
            .env_from
            .iter()
            .flatten()
            .any(|f| f.secret_ref.as_ref().is_some_and(|r| r.name == secret))
    });
    let from_volume = spec.volumes.iter().flatten().any(|v| {
        v.secret
            .as_ref()
            .is_some_and(|s| s.secret_name.as_deref() == Some(secret))
    });
    from_env || from_volume
}

/// Every Deployment of the install that reads the key: the rendered ones, and the one the
/// controller makes from each WebhookDispatcher.
pub(crate) fn key_holders(install: &Install) -> Vec<Deployment> {
    install
        .deployments
        .iter()
        .chain(&install.generated)
        .filter(|d| reads_secret(d, KEY_SECRET))
        .cloned()
        .collect()
}

/// The shell commands of a Markdown section's code blocks, continuation lines joined.
pub(crate) fn section_commands(markdown: &str, heading: &str) -> Vec<String> {
    let start = markdown
        .find(heading)
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let rest = &markdown[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut commands = Vec::new();
    let mut in_code = false;
    let mut current = String::new();
    for line in section.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code || line.trim_start().starts_with('#') {
            continue;
        }
        let line = line.trim();
        match line.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    commands.push(current.trim().to_string());
                }
                current.clear();
            }
        }
    }
    commands
}

/// What a `kubectl rollout restart` restarts: (namespace, named Deployments, selector).
#[derive(Debug, Default)]
pub(crate) struct Restart {
    pub(crate) namespace: Option<String>,
    pub(crate) names: Vec<String>,
    pub(crate) all_deployments_matching: Option<BTreeMap<String, String>>,
}

/// Parses `kubectl [-n NS] rollout restart TYPE/NAME... | TYPE NAME... | TYPE -l SEL`.
pub(crate) fn parse_restart(command: &str) -> Option<Restart> {
    let words: Vec<&str> = command.split_whitespace().collect();
    if words.first() != Some(&"kubectl") || !command.contains(" rollout restart ") {
        return None;
    }
    let mut r = Restart::default();
    let mut positional = Vec::new();
    let mut selector = None;
    let mut i = 1;
    while i < words.len() {
        let w = words[i];
        let value = |i: &mut usize| -> String {
            *i += 1;
            words[*i].to_string()
        };
        match w {
            "-n" | "--namespace" => r.namespace = Some(value(&mut i)),
            "-l" | "--selector" => selector = Some(value(&mut i)),
            _ if w.starts_with("--namespace=") => r.namespace = Some(w[12..].to_string()),
            _ if w.starts_with("--selector=") => selector = Some(w[11..].to_string()),
            _ if w.starts_with('-') => panic!("{command}: flag {w} not understood"),
            _ => positional.push(w),
        }
        i += 1;
    }
    if positional.get(..2) != Some(&["rollout", "restart"][..]) {
        return None;
    }
    let is_deployment = |t: &str| matches!(t, "deploy" | "deployment" | "deployments");
    let targets = &positional[2..];
    match targets.first() {
        Some(t) if !t.contains('/') => {
            assert!(is_deployment(t), "{command}: only Deployments hold the key");
            r.names = targets[1..].iter().map(|s| s.to_string()).collect();
        }
        _ => {
            for t in targets {
                let (kind, name) = t.split_once('/').unwrap();
                assert!(is_deployment(kind), "{command}: {t} is not a Deployment");
                r.names.push(name.to_string());
            }
        }
    }
    if let Some(sel) = selector {
        r.all_deployments_matching = Some(
            sel.split(',')
                .map(|kv| {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("{command}: selector {kv} is not key=value"));
                    (k.to_string(), v.to_string())
                })
                .collect(),
        );
    }
    Some(r)
}

impl Restart {
    pub(crate) fn reaches(&self, d: &Deployment) -> bool {
        let ns_ok = self.namespace.as_deref().unwrap_or("default")
            == d.namespace().as_deref().unwrap_or("default");
        let by_name = self.names.iter().any(|n| *n == d.name_any());
        let by_label = self
            .all_deployments_matching
            .as_ref()
            .is_some_and(|sel| selects(sel, d.labels()));
        ns_ok && (by_name || by_label)
    }
}

/// Every restart the runbook does reaches every Deployment that holds the key; a runbook
/// that restarts the controller and one dispatcher leaves the API (which seals the
/// secrets it creates) and the other dispatchers on the old key.
pub(crate) fn runbook_problems(install: &Install, markdown: &str) -> Vec<String> {
    let holders = key_holders(install);
    let restarts: Vec<(String, Restart)> =
        section_commands(markdown, "## Rotating the encryption key")
            .into_iter()
            .filter_map(|c| parse_restart(&c).map(|r| (c, r)))
            .collect();
    let mut problems = Vec::new();
    if restarts.is_empty() {
        problems.push("the runbook restarts nothing".into());
    }
    for (command, restart) in &restarts {
        for d in &holders {
            if !restart.reaches(d) {
                problems.push(format!(
                    "`{command}` does not restart Deployment {}, which reads Secret {KEY_SECRET}",
                    d.name_any()
                ));
            }
        }
    }
    problems
}

#[test]
pub(crate) fn key_rotation_restarts_every_deployment_that_holds_the_key() {
    let markdown = read(&repo("manifests/README.md"));
    for dir in ["manifests", "manifests/overlays/dev"] {
        let install = parse_install(&render(dir));
        let holders: BTreeSet<String> =
            key_holders(&install).iter().map(|d| d.name_any()).collect();
        for want in ["hookd-api", "hookd-controller", "hookd-dispatcher-default"] {
            assert!(
                holders.contains(want),
                "{dir}: {want} reads the key: {holders:?}"
            );
        }
        let problems = runbook_problems(&install, &markdown);
        assert!(problems.is_empty(), "{dir}:\n{}", problems.join("\n"));
    }
}

/// The checker notices what the old runbook missed: the API, and a second dispatcher.
#[test]
pub(crate) fn runbook_checker_notices_a_missed_deployment() {
    let mut install = parse_install(&render("manifests"));
    let old = "## Rotating the encryption key\n\n```sh\nkubectl -n hookd-system rollout restart deploy/hookd-controller deploy/hookd-dispatcher-default\n```\n";
    let problems = runbook_problems(&install, old).join("\n");
    assert!(problems.contains("Deployment hookd-api,"), "{problems}");
    let mut second = install.dispatchers[0].clone();
    second.metadata.name = Some("bulk".into());
    install
        .generated
        .push(desired_deployment(&second, "hookd", 1));
    let named = "## Rotating the encryption key\n\n```sh\nkubectl -n hookd-system rollout restart \\\n  deployment hookd-api hookd-controller hookd-dispatcher-default\n```\n";
    let problems = runbook_problems(&install, named).join("\n");
    assert!(
        problems.contains("Deployment hookd-dispatcher-bulk,")
            && !problems.contains("Deployment hookd-api,"),
        "{problems}"
    );
    let wrong_ns = "## Rotating the encryption key\n\n```sh\nkubectl rollout restart deployment -l app.kubernetes.io/part-of=hookd\n```\n";
    assert!(!runbook_problems(&install, wrong_ns).is_empty());
}

/// Problems of an uninstall sequence: a `kubectl delete -k DIR` without
/// `--ignore-not-found` that deletes an object an earlier step already deleted (itself, or
/// its namespace) fails with NotFound and exit 1.
pub(crate) fn uninstall_problems(markdown: &str, heading: &str) -> Vec<String> {
    let mut gone: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut gone_namespaces: BTreeSet<String> = BTreeSet::new();
    let mut problems = Vec::new();
    for command in section_commands(markdown, heading) {
        let command = command.split(" #").next().unwrap().trim().to_string();
        let words: Vec<&str> = command.split_whitespace().collect();
        if words.get(..2) != Some(&["kubectl", "delete"][..]) {
            continue;
        }
        let Some(dir) = words
            .iter()
            .position(|w| *w == "-k")
            .and_then(|i| words.get(i + 1))
        else {
            continue;
        };
        let tolerant = words
            .iter()
            .any(|w| *w == "--ignore-not-found" || *w == "--ignore-not-found=true");
        let objects: Vec<(String, String, String)> = render(dir.trim_end_matches('/'))
            .iter()
            .map(|o| {
                let (_, kind, ns, name) = key_of(o);
                (kind, ns, name)
            })
            .collect();
        for (kind, ns, name) in &objects {
            let key = (kind.clone(), ns.clone(), name.clone());
            if !tolerant && (gone.contains(&key) || gone_namespaces.contains(ns)) {
                problems.push(format!(
                    "`{command}`: {kind} {ns}/{name} is already deleted by an earlier step (NotFound, exit 1); add --ignore-not-found"
                ));
            }
        }
        for (kind, ns, name) in objects {
            if kind == "Namespace" {
                gone_namespaces.insert(name.clone());
            }
            gone.insert((kind, ns, name));
        }
    }
    problems
}

#[test]
pub(crate) fn uninstall_tolerates_what_earlier_steps_deleted() {
    let doc = read(&repo("docs/uninstall.md"));
    let problems = uninstall_problems(&doc, "# Uninstalling hookd from a cluster");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The README's steps before issue 28: `delete -k crds/` after the install (which
    // includes the CRDs) was already deleted.
    let before = "**Uninstall.**\n\n```sh\nkubectl delete webhookendpoints --all -A --wait          # the controller clears the finalizers\nkubectl delete -k manifests/overlays/dev                 # or manifests/ for a production install\nkubectl delete -k crds/                                  # WebhookDispatchers and their Deployments go with it\nkind delete cluster --name hookd\n```\n";
    let problems = uninstall_problems(before, "**Uninstall.**").join("\n");
    assert!(
        problems.contains("CustomResourceDefinition /webhookendpoints.hookd.dev"),
        "{problems}"
    );
}
