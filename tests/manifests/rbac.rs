//! RBAC: what each ServiceAccount is granted against what its component calls.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------------------

/// Where a call applies: in every namespace (or to a cluster-scoped resource), or in one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scope {
    Cluster,
    Namespace(&'static str),
}

/// One kind of call a component makes to the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Access {
    pub(crate) verb: &'static str,
    pub(crate) group: &'static str,
    pub(crate) resource: &'static str,
    pub(crate) scope: Scope,
}

pub(crate) const fn access(
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

pub(crate) fn expand(
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
pub(crate) fn controller_required_access() -> Vec<Access> {
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
pub(crate) fn api_required_access() -> Vec<Access> {
    expand(
        &["create"],
        "authentication.k8s.io",
        "tokenreviews",
        Scope::Cluster,
    )
}

/// Rules that apply to ServiceAccount `ns/name`, with the namespace they are limited to
/// (None: a ClusterRoleBinding, so every namespace).
pub(crate) fn bound_rules<'a>(
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

pub(crate) fn rule_matches(rule: &PolicyRule, a: &Access) -> bool {
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
pub(crate) fn allows(install: &Install, ns: &str, name: &str, a: &Access) -> bool {
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
pub(crate) fn granted(install: &Install, ns: &str, name: &str) -> Result<BTreeSet<Access>, String> {
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
pub(crate) fn rbac_problems(install: &Install, sa: &str, required: &[Access]) -> Vec<String> {
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
