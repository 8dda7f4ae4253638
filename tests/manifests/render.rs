//! Rendering the kustomizations (kubectl kustomize, or the built-in fallback).

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------

pub(crate) fn yaml_stream(text: &str, origin: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{origin}: not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `kubectl kustomize dir`, or None when kubectl is not installed. A kustomization kubectl
/// refuses fails the test rather than falling back.
pub(crate) fn kubectl_kustomize(dir: &Path) -> Option<Vec<Value>> {
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
pub(crate) fn render_files(dir: &Path) -> (Vec<Value>, Vec<FieldSpec>) {
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
pub(crate) struct FieldSpec {
    pub(crate) path: String,
    pub(crate) kind: Option<String>,
}

pub(crate) fn key_of(o: &Value) -> (String, String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&o["apiVersion"]),
        s(&o["kind"]),
        s(&o["metadata"]["namespace"]),
        s(&o["metadata"]["name"]),
    )
}

pub(crate) fn same_object(a: &Value, b: &Value) -> bool {
    key_of(a) == key_of(b)
}

/// RFC 7386, which is what kustomize does for a patch of a custom resource.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
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
pub(crate) fn visit_strings(v: &mut Value, path: &[&str], f: &mut dyn FnMut(&mut String)) {
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
pub(crate) fn retag(reference: &mut String, image: &Value) {
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
pub(crate) fn render(dir: &str) -> Vec<Value> {
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
