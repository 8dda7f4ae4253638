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
        serde_json::json!({"headers": {"X-A": "a\r\nX-Injected: 1"}}),
        serde_json::json!({"headers": {"X-A": "a\u{1}"}}),
    ] {
        assert!(check(bad.clone()).is_err(), "should be refused: {bad}");
    }
    assert!(
        check(
            serde_json::json!({"eventTypes": ["*"], "headers": {"X-Team": "a b\tc ü"}, "tenant": "team.a"})
        )
        .is_ok()
    );
}

/// One corpus of specs, two judges: the endpoint rules every door runs
/// (`hookd::endpoints::validate_declared`, what the controller holds an object for and
/// `hookd apply` refuses) and what an API server would say (the CRD's CEL rules, evaluated
/// by kube's CEL library, and its schema bounds). They must agree on every spec, or an
/// object `kubectl apply` accepts is held by the controller (or the other way round).
#[test]
fn the_endpoint_rules_and_the_crd_give_one_verdict_on_a_corpus() {
    use serde_json::json;
    let base = json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "e", "namespace": "n"},
        "spec": {"url": "https://example.com/hook", "secretRef": {"name": "s", "key": "secret"}}
    });
    let long = |n: usize| "a".repeat(n);
    let many_headers = |n: usize| {
        serde_json::Value::Object((0..n).map(|i| (format!("X-H{i}"), json!("v"))).collect())
    };
    let corpus: Vec<serde_json::Value> = vec![
        json!({}),
        // url
        json!({"url": "http://example.com"}),
        json!({"url": "https://example.com:8443/a?b=c#d"}),
        json!({"url": "https://[2001:db8::1]/x"}),
        json!({"url": "https://10.0.0.1/private-is-policy-not-syntax"}),
        json!({"url": "https://example.com/ü"}),
        json!({"url": "ftp://example.com/x"}),
        json!({"url": "example.com/hook"}),
        json!({"url": "https://user:pw@example.com/"}),
        json!({"url": "https://user@example.com/"}),
        json!({"url": "https://example.com/a b"}),
        json!({"url": "https://example.com:0/"}),
        json!({"url": "https://example.com:99999/"}),
        json!({"url": "https://exa mple.com/"}),
        json!({"url": "https:///nohost"}),
        json!({"url": "HTTPS://EXAMPLE.COM/"}),
        json!({"url": "https:example.com/x"}),
        json!({"url": "https:\\\\example.com/x"}),
        json!({"url": "https://example.com\\@evil.example/"}),
        json!({"url": "https://example.com/a\\b"}),
        json!({"url": "https://example.com:/"}),
        json!({"url": "https://example.com:00080/"}),
        json!({"url": "https://example.com:65535/"}),
        json!({"url": "https://example.com:65536/"}),
        json!({"url": "https://example.com:8x/"}),
        json!({"url": "https://exa<mple.com/"}),
        json!({"url": "https://exa%41mple.com/"}),
        json!({"url": "https://bücher.example/"}),
        json!({"url": "https://xn--bcher-kva.example/"}),
        json!({"url": "https://under_score.example/"}),
        json!({"url": "https://example.com/tab\there"}),
        json!({"url": "https://example.com/nbsp\u{a0}here"}),
        json!({"url": "https://example.com/\u{1}"}),
        json!({"url": "https://example.com?q"}),
        json!({"url": "https://example.com#f"}),
        json!({"url": "http://a"}),
        json!({"url": format!("https://example.com/{}", "ü".repeat(1100))}),
        json!({"url": format!("https://example.com/{}", long(2030))}),
        json!({"url": format!("https://example.com/{}", long(2040))}),
        // eventTypes
        json!({"eventTypes": ["*"]}),
        json!({"eventTypes": ["invoice.*", "user.created-v2", "a_b"]}),
        json!({"eventTypes": ["a..b"]}),
        json!({"eventTypes": ["a b"]}),
        json!({"eventTypes": [".a"]}),
        json!({"eventTypes": ["a.*.b"]}),
        json!({"eventTypes": ["*.a"]}),
        json!({"eventTypes": [""]}),
        json!({"eventTypes": [long(128)]}),
        json!({"eventTypes": [long(129)]}),
        json!({"eventTypes": vec!["a"; 64]}),
        json!({"eventTypes": vec!["a"; 65]}),
        // tenant and consumer
        json!({"tenant": "team.a_b-1"}),
        json!({"tenant": "-x"}),
        json!({"tenant": ".x"}),
        json!({"tenant": ""}),
        json!({"tenant": long(128)}),
        json!({"tenant": long(129)}),
        json!({"consumer": "cust_42"}),
        json!({"consumer": "cust 42"}),
        json!({"consumer": "ü"}),
        // policy numbers
        json!({"timeoutSeconds": 1, "maxAttempts": 100, "maxInFlight": 10000}),
        json!({"timeoutSeconds": 0}),
        json!({"timeoutSeconds": 301}),
        json!({"maxAttempts": 0}),
        json!({"maxAttempts": 101}),
        json!({"maxInFlight": 0}),
        json!({"maxInFlight": 10001}),
        json!({"retrySchedule": [1, 604800]}),
        json!({"retrySchedule": []}),
        json!({"retrySchedule": [0]}),
        json!({"retrySchedule": [604801]}),
        json!({"retrySchedule": vec![5; 50]}),
        json!({"retrySchedule": vec![5; 51]}),
        json!({"rateLimit": {"perSecond": 0.01}}),
        json!({"rateLimit": {"perSecond": 100000, "burst": 100000}}),
        json!({"rateLimit": {"perSecond": 2.5, "burst": 1}}),
        json!({"rateLimit": {"perSecond": 0}}),
        json!({"rateLimit": {"perSecond": 0.001}}),
        json!({"rateLimit": {"perSecond": -1}}),
        json!({"rateLimit": {"perSecond": 100001}}),
        json!({"rateLimit": {"perSecond": 10, "burst": 0}}),
        json!({"rateLimit": {"perSecond": 10, "burst": 100001}}),
        json!({"rateLimit": {"perSecond": 1000, "burst": 50}}),
        json!({"rateLimit": {"perSecond": 1000, "burst": 49}}),
        json!({"rateLimit": {"perSecond": 1000, "burst": 1}}),
        json!({"secretRotationGraceSeconds": 0}),
        json!({"secretRotationGraceSeconds": 2592001}),
        // headers
        json!({"headers": {"X-Team": "a b\tc ü"}}),
        json!({"headers": {"Authorization": "Bearer x"}}),
        json!({"headers": {"webhook-id": "x"}}),
        json!({"headers": {"Webhook-Signature": "x"}}),
        json!({"headers": {"Content-Type": "x"}}),
        json!({"headers": {"content-encoding": "gzip"}}),
        json!({"headers": {"Transfer-Encoding": "chunked"}}),
        json!({"headers": {"Proxy-Authorization": "x"}}),
        json!({"headers": {"X_Underscore": "x"}}),
        json!({"headers": {"X A": "x"}}),
        json!({"headers": {"": "x"}}),
        json!({"headers": {long(64): "x"}}),
        json!({"headers": {long(65): "x"}}),
        json!({"headers": {"X-A": "a\r\nX-Injected: 1"}}),
        json!({"headers": {"X-A": "a\u{1}"}}),
        json!({"headers": {"X-A": "a\u{7f}"}}),
        json!({"headers": {"X-A": ""}}),
        json!({"headers": {"X-A": long(4096)}}),
        json!({"headers": {"X-A": long(4097)}}),
        json!({"headers": many_headers(32)}),
        json!({"headers": many_headers(33)}),
    ];
    let (mut accepted, mut refused) = (0, 0);
    let mut disagreements = Vec::new();
    for patch in &corpus {
        let mut v = base.clone();
        for (k, val) in patch.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        let ep: hookd::k8s::WebhookEndpoint = serde_json::from_value(v).unwrap();
        let rules = hookd::endpoints::validate_declared(&ep.spec.declared());
        let api_server = ep.validate_as_api_server();
        if rules.is_ok() != api_server.is_ok() {
            disagreements.push(format!(
                "{patch}: endpoint rules {rules:?}, API server {api_server:?}"
            ));
        }
        if rules.is_ok() {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} specs judged differently:\n{}",
        disagreements.len(),
        corpus.len(),
        disagreements.join("\n")
    );
    assert!(
        accepted >= 15 && refused >= 40,
        "{accepted} accepted, {refused} refused"
    );
}

// ---- the API server's static CEL cost estimate ----
//
// A real API server refuses a CRD whose rules' estimated worst-case cost exceeds 10,000,000
// per rule or 100,000,000 per CRD (k8s.io/apiextensions-apiserver validation.go:
// StaticEstimatedCostLimit, StaticEstimatedCRDCostLimit). kube's local CEL evaluation does
// not estimate, and no API server runs here, so this recomputes the estimate the way the
// API server does:
// - sizes from the schema (k8s.io/apiserver pkg/cel/common/schemas.go): a string is
//   maxLength x 4 bytes, else 3,145,726; a list maxItems, else (3,145,726 / (min item
//   size + 1)); a map maxProperties, else 3,145,726 / (min value size + 6); map keys have
//   no declared size (0);
// - costs from cel-go checker/cost.go: ident and select 1 (select only on objects and
//   maps), literals 0, list literals 10, most calls 1 plus their arguments; `&&`/`||` the
//   sum of both sides; `?:` the condition plus the dearer branch; `in` the list size;
//   `matches` ceil((size+1) x 0.1) x ceil(len(regex) x 0.25); startsWith/endsWith
//   ceil(len(prefix) x 0.1); lowerAscii ceil(size x 0.1); string `==` ceil(min size x 0.1);
//   a comprehension its range size x (loop condition + step);
// - a rule's cost is multiplied by how many times its node can occur (the bounds of
//   enclosing lists and maps), and the CRD's total is the sum over its rules.

mod cel_cost {
    use cel::IdedExpr;
    use cel::common::ast::{Expr, LiteralValue};
    use serde_json::Value;
    use std::collections::HashMap;

    /// apiservercel.DefaultMaxRequestSizeBytes - 2 (for the quotes / brackets)
    const MAX_REQUEST_MINUS_2: u64 = 3 * 1024 * 1024 - 2;
    pub const RULE_LIMIT: u64 = 10_000_000;
    pub const CRD_LIMIT: u64 = 100_000_000;

    #[derive(Clone, Debug)]
    pub enum Ty {
        Str(u64),
        Scalar,
        List(Box<Ty>, u64),
        Map(Box<Ty>, Box<Ty>, u64),
        Object(Value, bool),
        Unknown,
    }

    impl Ty {
        fn size(&self) -> u64 {
            match self {
                Ty::Str(n) | Ty::List(_, n) | Ty::Map(_, _, n) => *n,
                Ty::Scalar => 1,
                Ty::Object(..) | Ty::Unknown => u64::MAX,
            }
        }
    }

    fn int(v: &Value) -> Option<u64> {
        v.as_u64()
    }

    /// MinSerializedSize of a schema (schemas.go / types.go).
    fn min_size(s: &Value) -> u64 {
        if s["x-kubernetes-int-or-string"] == true {
            return 1;
        }
        match s["type"].as_str() {
            Some("string") => 2,
            Some("boolean") => 4,
            Some("integer") | Some("number") => 1,
            Some("array") => 2,
            Some("object") if s.get("additionalProperties").is_some() => 2,
            Some("object") => {
                let required: Vec<&str> = s["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(|v| v.as_str()).collect())
                    .unwrap_or_default();
                let mut n = 2;
                for (name, p) in s["properties"].as_object().into_iter().flatten() {
                    if required.contains(&name.as_str()) && p.get("default").is_none() {
                        n += name.len() as u64 + min_size(p) + 4;
                    }
                }
                n
            }
            _ => 1,
        }
    }

    pub fn ty_of(s: &Value, root: bool) -> Ty {
        if s["x-kubernetes-int-or-string"] == true {
            return Ty::Str(int(&s["maxLength"]).map_or(MAX_REQUEST_MINUS_2, |m| m * 4));
        }
        match s["type"].as_str() {
            Some("string") => Ty::Str(match int(&s["maxLength"]) {
                Some(m) => m * 4,
                None => match s["enum"].as_array() {
                    Some(e) => e
                        .iter()
                        .filter_map(|v| v.as_str())
                        .map(|v| v.len() as u64)
                        .max()
                        .unwrap_or(0),
                    None => MAX_REQUEST_MINUS_2,
                },
            }),
            Some("array") => {
                let items = &s["items"];
                let n = int(&s["maxItems"]).unwrap_or(MAX_REQUEST_MINUS_2 / (min_size(items) + 1));
                Ty::List(Box::new(ty_of(items, false)), n)
            }
            Some("object") if s["additionalProperties"].is_object() => {
                let v = &s["additionalProperties"];
                let n = int(&s["maxProperties"]).unwrap_or(MAX_REQUEST_MINUS_2 / (min_size(v) + 6));
                // apiservercel.StringType: keys carry no size bound (MaxElements 0)
                Ty::Map(Box::new(Ty::Str(0)), Box::new(ty_of(v, false)), n)
            }
            Some("object") => Ty::Object(s.clone(), root),
            Some(_) => Ty::Scalar,
            None => Ty::Unknown,
        }
    }

    fn field(t: &Ty, name: &str) -> Ty {
        match t {
            Ty::Object(s, root) => {
                if *root && (name == "kind" || name == "apiVersion") {
                    return Ty::Str(MAX_REQUEST_MINUS_2);
                }
                if *root && name == "metadata" {
                    // WithTypeAndObjectMeta: name and generateName, unbounded strings
                    return Ty::Object(
                        serde_json::json!({"type": "object", "properties": {
                            "name": {"type": "string"}, "generateName": {"type": "string"}}}),
                        false,
                    );
                }
                match s["properties"].get(name) {
                    Some(p) => ty_of(p, false),
                    None => panic!("rule reads unknown field {name:?}"),
                }
            }
            Ty::Map(_, v, _) => (**v).clone(),
            _ => Ty::Unknown,
        }
    }

    fn factor(x: u64, f: f64) -> u64 {
        let v = (x as f64 * f).ceil();
        if v >= u64::MAX as f64 {
            u64::MAX
        } else {
            v as u64
        }
    }

    pub struct Estimator {
        vars: HashMap<String, Ty>,
    }

    impl Estimator {
        pub fn new(self_ty: Ty) -> Self {
            Estimator {
                vars: HashMap::from([("self".to_string(), self_ty)]),
            }
        }

        /// (max cost, type) of an expression.
        pub fn cost(&mut self, e: &IdedExpr) -> (u64, Ty) {
            match &e.expr {
                Expr::Literal(LiteralValue::String(s)) => {
                    (0, Ty::Str(s.inner().chars().count() as u64))
                }
                Expr::Literal(_) => (0, Ty::Scalar),
                Expr::Ident(name) => (
                    1,
                    self.vars
                        .get(name)
                        .cloned()
                        .unwrap_or_else(|| panic!("unknown identifier {name}")),
                ),
                Expr::Select(sel) => {
                    let (c, t) = self.cost(&sel.operand);
                    if sel.test {
                        return (c.saturating_add(1), Ty::Scalar);
                    }
                    let select = matches!(t, Ty::Object(..) | Ty::Map(..) | Ty::Unknown) as u64;
                    (c.saturating_add(select), field(&t, &sel.field))
                }
                Expr::List(l) => {
                    let mut c: u64 = 10;
                    let mut elem = 0;
                    for el in &l.elements {
                        let (ec, et) = self.cost(el);
                        c = c.saturating_add(ec);
                        elem = elem.max(et.size());
                    }
                    (
                        c,
                        Ty::List(Box::new(Ty::Str(elem)), l.elements.len() as u64),
                    )
                }
                Expr::Comprehension(comp) => {
                    let (rc, rt) = self.cost(&comp.iter_range);
                    let (ic, it) = self.cost(&comp.accu_init);
                    let (elem, n) = match &rt {
                        Ty::List(el, n) => ((**el).clone(), *n),
                        Ty::Map(k, _, n) => ((**k).clone(), *n),
                        other => panic!("comprehension over {other:?}"),
                    };
                    self.vars.insert(comp.accu_var.clone(), it);
                    self.vars.insert(comp.iter_var.clone(), elem);
                    let (lc, _) = self.cost(&comp.loop_cond);
                    let (sc, _) = self.cost(&comp.loop_step);
                    self.vars.remove(&comp.iter_var);
                    let (resc, rest) = self.cost(&comp.result);
                    self.vars.remove(&comp.accu_var);
                    let per = lc.saturating_add(sc);
                    (
                        rc.saturating_add(ic)
                            .saturating_add(resc)
                            .saturating_add(n.saturating_mul(per)),
                        rest,
                    )
                }
                Expr::Call(call) => {
                    let (tc, tt) = match &call.target {
                        Some(t) => {
                            let (c, t) = self.cost(t);
                            (c, Some(t))
                        }
                        None => (0, None),
                    };
                    let args: Vec<(u64, Ty)> = call.args.iter().map(|a| self.cost(a)).collect();
                    let args_sum = args.iter().fold(tc, |s, (c, _)| s.saturating_add(*c));
                    let size = |t: &Ty| t.size();
                    let (own, ty) = match call.func_name.as_str() {
                        "_&&_" | "_||_" => (0, Ty::Scalar),
                        "_?_:_" => {
                            let branch = args[1].0.max(args[2].0);
                            let ty = if size(&args[1].1) >= size(&args[2].1) {
                                args[1].1.clone()
                            } else {
                                args[2].1.clone()
                            };
                            return (args[0].0.saturating_add(branch), ty);
                        }
                        "@in" => (size(&args[1].1), Ty::Scalar),
                        // indexing a map or list: one step, yielding a value of its type
                        "_[_]" => match &args[0].1 {
                            Ty::Map(_, v, _) => (1, (**v).clone()),
                            Ty::List(el, _) => (1, (**el).clone()),
                            other => panic!("index into {other:?}"),
                        },
                        "matches" => {
                            let s = size(tt.as_ref().expect("member matches"));
                            let r = size(&args[0].1);
                            (
                                factor(s.saturating_add(1), 0.1).saturating_mul(factor(r, 0.25)),
                                Ty::Scalar,
                            )
                        }
                        "startsWith" | "endsWith" => (factor(size(&args[0].1), 0.1), Ty::Scalar),
                        "contains" => {
                            let s = size(tt.as_ref().expect("member contains"));
                            (
                                factor(s, 0.1).saturating_mul(factor(size(&args[0].1), 0.1)),
                                Ty::Scalar,
                            )
                        }
                        "lowerAscii" | "upperAscii" | "trim" => {
                            let t = tt.clone().expect("member string function");
                            (factor(size(&t), 0.1), t)
                        }
                        "_==_" | "_!=_" => {
                            let m = size(&args[0].1).min(size(&args[1].1));
                            (factor(m, 0.1), Ty::Scalar)
                        }
                        "_<_" | "_<=_" | "_>_" | "_>=_" => match (&args[0].1, &args[1].1) {
                            (Ty::Str(a), Ty::Str(b)) => (factor(*a.min(b), 0.1), Ty::Scalar),
                            _ => (1, Ty::Scalar),
                        },
                        "size"
                        | "!_"
                        | "@not_strictly_false"
                        | "_+_"
                        | "_-_"
                        | "_*_"
                        | "_/_"
                        | "_%_"
                        | "-_"
                        | "int"
                        | "double"
                        | "string" => (1, Ty::Scalar),
                        other => panic!(
                            "no cost formula for {other}(); add cel-go's (checker/cost.go) or the Kubernetes library's"
                        ),
                    };
                    (args_sum.saturating_add(own), ty)
                }
                other => panic!("unsupported CEL expression {other:?}"),
            }
        }
    }

    /// One rule's estimate.
    #[derive(Debug)]
    pub struct RuleCost {
        pub path: String,
        pub rule: String,
        pub cost: u64,
    }

    /// Every rule of every version of a CRD (a serde_json value), with its cost times the
    /// cardinality of its node.
    pub fn crd_rules(crd: &Value) -> Vec<RuleCost> {
        let mut out = Vec::new();
        for v in crd["spec"]["versions"].as_array().unwrap() {
            walk(&v["schema"]["openAPIV3Schema"], true, "", 1, &mut out);
        }
        out
    }

    fn walk(s: &Value, root: bool, path: &str, cardinality: u64, out: &mut Vec<RuleCost>) {
        for rule in s["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let src = rule["rule"].as_str().unwrap();
            let ast = cel::parser::Parser::new()
                .parse(src)
                .unwrap_or_else(|e| panic!("rule at {path} does not parse: {e:?}"));
            let (cost, _) = Estimator::new(ty_of(s, root)).cost(&ast);
            out.push(RuleCost {
                path: if path.is_empty() {
                    "<root>".into()
                } else {
                    path.into()
                },
                rule: src.into(),
                cost: cost.saturating_mul(cardinality),
            });
        }
        for (name, p) in s["properties"].as_object().into_iter().flatten() {
            walk(p, false, &format!("{path}.{name}"), cardinality, out);
        }
        if s["items"].is_object() {
            let n = match ty_of(s, false) {
                Ty::List(_, n) => n,
                _ => 1,
            };
            walk(
                &s["items"],
                false,
                &format!("{path}[*]"),
                cardinality.saturating_mul(n),
                out,
            );
        }
        if s["additionalProperties"].is_object() {
            let n = match ty_of(s, false) {
                Ty::Map(_, _, n) => n,
                _ => 1,
            };
            walk(
                &s["additionalProperties"],
                false,
                &format!("{path}{{*}}"),
                cardinality.saturating_mul(n),
                out,
            );
        }
    }

    /// Prints every rule's figure and returns the problems (over a limit).
    pub fn check(yaml: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for crd in serde_saphyr::from_multiple::<Value>(yaml).unwrap() {
            let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
            let rules = crd_rules(&crd);
            let total = rules.iter().fold(0u64, |s, r| s.saturating_add(r.cost));
            for r in &rules {
                println!("{kind} {:<32} {:>14}  {}", r.path, r.cost, r.rule);
                if r.cost > RULE_LIMIT {
                    problems.push(format!(
                        "{kind} {}: estimated cost {} exceeds the per-rule limit {RULE_LIMIT}",
                        r.path, r.cost
                    ));
                }
            }
            println!("{kind} total {total} (limit {CRD_LIMIT})");
            if total > CRD_LIMIT {
                problems.push(format!(
                    "{kind}: total estimated cost {total} exceeds the per-CRD limit {CRD_LIMIT}"
                ));
            }
        }
        problems
    }
}

/// Every rule of the generated CRDs fits the API server's static cost budget with a wide
/// margin (a tenth of each limit), so a `kubectl apply -k crds/` on a real cluster accepts them.
#[test]
fn cel_rules_fit_the_api_servers_cost_budget() {
    let yaml = hookd::k8s::crds_yaml();
    let problems = cel_cost::check(&yaml);
    assert!(problems.is_empty(), "{problems:#?}");
    for crd in serde_saphyr::from_multiple::<serde_json::Value>(&yaml).unwrap() {
        let rules = cel_cost::crd_rules(&crd);
        assert!(!rules.is_empty());
        let total: u64 = rules.iter().map(|r| r.cost).sum();
        assert!(
            total < cel_cost::CRD_LIMIT / 10,
            "{}: total {total} leaves less than a 10x margin",
            crd["spec"]["names"]["kind"]
        );
        for r in rules {
            assert!(
                r.cost < cel_cost::RULE_LIMIT / 10,
                "{} leaves less than a 10x margin: {}",
                r.path,
                r.cost
            );
        }
    }
}

/// The estimator refuses the CRDs a real API server refused before the bounds were added
/// (kept as a fixture), with the figures the review computed by hand.
#[test]
fn cel_cost_estimate_refuses_the_unbounded_crds() {
    let old = include_str!("fixtures/hookd.dev.before-cel-bounds.yaml");
    let problems = cel_cost::check(old);
    let joined = problems.join("\n");
    for want in [
        "WebhookEndpoint .spec.eventTypes",
        "WebhookEndpoint .spec.headers",
        "WebhookDispatcher .spec.allowedDestinations",
        "WebhookEndpoint: total",
        "WebhookDispatcher: total",
    ] {
        assert!(
            joined.contains(want),
            "expected a problem for {want}: {joined}"
        );
    }
    let crd: serde_json::Value =
        serde_saphyr::from_multiple::<serde_json::Value>(old).unwrap()[0].clone();
    let rules = cel_cost::crd_rules(&crd);
    let cost = |p: &str| rules.iter().find(|r| r.path == p).unwrap().cost;
    // 64 items x (ceil(3,145,727 x 0.1) x ceil(48 x 0.25) + 7)
    assert!((240_000_000..243_000_000).contains(&cost(".spec.eventTypes")));
    assert!((10_000_000..15_000_000).contains(&cost(".spec.headers")));
}

/// A WebhookDispatcher name becomes a label value: more than 63 characters is refused at
/// admission.
#[test]
fn dispatcher_name_is_bounded_at_admission() {
    let mk = |name: &str| -> hookd::k8s::WebhookDispatcher {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookDispatcher",
            "metadata": {"name": name, "namespace": "hookd-system"},
            "spec": {"databaseSecretRef": {"name": "db"}}
        }))
        .unwrap()
    };
    assert!(mk(&"d".repeat(63)).validate_cel().is_ok());
    assert!(mk(&"d".repeat(64)).validate_cel().is_err());
}

/// Every `format` in the CRDs is one the API server knows: from Kubernetes 1.34 each unknown
/// one is a warning on every `kubectl apply` of the CRDs (schemars' `uint32` gave nine).
#[test]
fn crds_use_only_formats_the_api_server_knows() {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                // `format` of a schema, not a property that happens to be called so
                if let Some(serde_json::Value::String(f)) = m.get("format")
                    && m.contains_key("type")
                    && !hookd::k8s::crd::format_is_known(f)
                {
                    out.push(format!("{path}: format {f:?}"));
                }
                for (k, v) in m {
                    walk(v, &format!("{path}.{k}"), out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(v, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut formats = std::collections::BTreeSet::new();
    let mut unknown = Vec::new();
    for crd in serde_saphyr::from_multiple::<serde_json::Value>(&hookd::k8s::crds_yaml()).unwrap() {
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        walk(&crd["spec"]["versions"], &kind, &mut unknown);
        collect_formats(&crd, &mut formats);
    }
    assert!(unknown.is_empty(), "{unknown:#?}");
    // the known list is Kubernetes', not whatever the CRDs happen to use
    for f in ["int32", "int64", "date-time", "byte", "password", "double"] {
        assert!(hookd::k8s::crd::format_is_known(f), "{f}");
    }
    for f in ["uint32", "uint8", "uint", "int-or-string"] {
        assert!(!hookd::k8s::crd::format_is_known(f), "{f}");
    }
    assert!(
        formats.contains("int32") && formats.contains("date-time"),
        "{formats:?}"
    );
    // the u32 fields keep their bounds: int32 where they fit, and their ranges
    let crd = serde_json::to_value(hookd::k8s::crd::crds()[0].clone()).unwrap();
    let timeout = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["timeoutSeconds"];
    assert_eq!(timeout["format"], "int32");
    assert_eq!(timeout["minimum"].as_f64(), Some(1.0));
    assert_eq!(timeout["maximum"].as_f64(), Some(300.0));
}

fn collect_formats(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(serde_json::Value::String(f)) = m.get("format") {
                out.insert(f.clone());
            }
            m.values().for_each(|v| collect_formats(v, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_formats(v, out)),
        _ => {}
    }
}

fn dispatcher_with(spec: serde_json::Value) -> hookd::k8s::WebhookDispatcher {
    let mut base = serde_json::json!({"databaseSecretRef": {"name": "db"}});
    for (k, v) in spec.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookDispatcher",
        "metadata": {"name": "default", "namespace": "hookd-system"},
        "spec": base,
    }))
    .unwrap()
}

/// The `env` rule admits exactly the settings the controller's privilege check admits,
/// retention included (every cluster pruned at 30 days whatever was asked, issue 28).
#[test]
fn env_rule_admits_the_allowed_settings_and_nothing_else() {
    for name in hookd::k8s::crd::DISPATCHER_ENV_ALLOWED {
        let d = dispatcher_with(serde_json::json!({"env": [{"name": name, "value": "1"}]}));
        assert!(
            d.validate_cel().is_ok(),
            "{name} is refused by the CEL rule"
        );
    }
    for name in ["HOOKD_RETENTION_DAYS", "HOOKD_TENANT_RETENTION"] {
        assert!(hookd::k8s::crd::DISPATCHER_ENV_ALLOWED.contains(&name));
    }
    for name in [
        "DATABASE_URL",
        "HOOKD_ENCRYPTION_KEY",
        "HOOKD_LISTEN",
        "HOOKD_ENCRYPTION_KEY_FILE",
    ] {
        let d = dispatcher_with(serde_json::json!({"env": [{"name": name, "value": "x"}]}));
        assert!(d.validate_cel().is_err(), "{name} must be refused");
    }
}

/// The allow-list of a WebhookDispatcher's `env` is settings `hookd dispatch` reads (a name
/// it does not read would be accepted and do nothing), and the CEL rule's message lists the
/// same names.
#[test]
fn the_env_allow_list_is_settings_of_hookd_dispatch() {
    use clap::CommandFactory;
    let cli = hookd::cli::Cli::command();
    let dispatch = cli.find_subcommand("dispatch").expect("hookd dispatch");
    // its own flags, and the global ones (HOOKD_LOG, HOOKD_LOG_FORMAT)
    let read: Vec<String> = dispatch
        .get_arguments()
        .chain(cli.get_arguments().filter(|a| a.is_global_set()))
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    for name in hookd::k8s::crd::DISPATCHER_ENV_ALLOWED {
        assert!(
            read.iter().any(|r| r == name),
            "hookd dispatch reads no {name}"
        );
    }
    let crd = hookd::k8s::crds_yaml();
    assert!(
        crd.contains(&hookd::k8s::crd::DISPATCHER_ENV_ALLOWED.join(", ")),
        "the env rule's message lists the allow-list"
    );
}

/// Private registries and placement are part of the schema (additive fields), typed as
/// Kubernetes types them, so a misspelt toleration is refused like in a Deployment.
#[test]
fn dispatcher_schema_has_pull_secrets_and_placement() {
    let crd = serde_json::to_value(hookd::k8s::crd::crds()[1].clone()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["imagePullSecrets"]["type"], "array");
    assert_eq!(
        spec["imagePullSecrets"]["items"]["properties"]["name"]["type"],
        "string"
    );
    assert_eq!(
        spec["nodeSelector"]["additionalProperties"]["type"],
        "string"
    );
    assert!(spec["tolerations"]["items"]["properties"]["tolerationSeconds"].is_object());
    assert!(spec["affinity"]["properties"]["nodeAffinity"].is_object());
    assert_eq!(spec["priorityClassName"]["type"], "string");
    // every field that existed keeps its name
    for f in [
        "replicas",
        "autoscaling",
        "concurrency",
        "endpointConcurrency",
        "leaseSeconds",
        "requestTimeoutSeconds",
        "image",
        "imagePullPolicy",
        "databaseSecretRef",
        "encryptionKeySecretRef",
        "allowedDestinations",
        "resources",
        "serviceAccountName",
        "env",
    ] {
        assert!(spec[f].is_object(), "spec.{f} is gone");
    }
    let d = dispatcher_with(serde_json::json!({
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"pool": "egress"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "hookd-high",
    }));
    assert!(d.validate_cel().is_ok());
    assert_eq!(d.spec.image_pull_secrets[0].name, "regcred");
}
