//! Monitoring: alert rules and the dashboard use exported metrics.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------
// Monitoring
// ---------------------------------------------------------------------------------------

/// Series Prometheus makes itself, per scrape target.
pub(crate) const PROMETHEUS_SERIES: [&str; 1] = ["up"];

/// Every series name hookd exports: counters get `_total`, histograms `_bucket`, `_sum`
/// and `_count`.
pub(crate) fn exported_series() -> BTreeSet<String> {
    let m = hookd::metrics::Metrics::new();
    // A labelled family is rendered only once it has a label set; give each one.
    let _ = m.http_requests.get_or_create(&hookd::metrics::RouteStatus {
        method: "POST",
        route: "/v1/messages".into(),
        status: 201,
    });
    let _ = m.delivery_attempts.get_or_create(&hookd::metrics::Outcome {
        outcome: hookd::metrics::AttemptOutcome::Dead,
    });
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

pub(crate) const PROMQL_KEYWORDS: [&str; 25] = [
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
pub(crate) fn promql_metric_names(expr: &str) -> BTreeSet<String> {
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
pub(crate) fn promql_metric_name_extraction() {
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
pub(crate) fn balanced(expr: &str) -> bool {
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

pub(crate) fn check_expressions(origin: &str, exprs: &[String]) -> Vec<String> {
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

pub(crate) fn rules_file() -> Value {
    yaml_stream(
        &read(&repo("manifests/monitoring/hookd.rules.yaml")),
        "hookd.rules.yaml",
    )
    .remove(0)
}

#[test]
pub(crate) fn alert_rules_use_exported_metrics_and_cover_the_required_alerts() {
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

pub(crate) fn collect_exprs(v: &Value, out: &mut Vec<String>) {
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
pub(crate) fn dashboard_uses_exported_metrics() {
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
pub(crate) fn monitoring_kustomization_renders() {
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
