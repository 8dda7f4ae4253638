//! Generates the client from `../openapi.json` with progenitor, into `$OUT_DIR/codegen.rs`.
//!
//! hookd serves OpenAPI 3.1 (utoipa 5); progenitor reads 3.0 only (through the `openapiv3`
//! crate; oxidecomputer/progenitor#762). The 3.1 constructs the document uses have exact
//! 3.0 spellings, so `downgrade` rewrites them here rather than the server serving a
//! second document. Anything it does not know stays as it is, and then fails to parse
//! below, naming the place, rather than generating a client that silently differs.

use serde_json::{Map, Value};

fn main() {
    let src = "../openapi.json";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(src).expect("clients/openapi.json is readable");
    let mut doc: Value = serde_json::from_str(&text).expect("clients/openapi.json is JSON");
    downgrade(&mut doc);
    let spec: openapiv3::OpenAPI = serde_json::from_value(doc)
        .unwrap_or_else(|e| panic!("the 3.0 rendering of clients/openapi.json: {e}"));

    let mut settings = progenitor::GenerationSettings::default();
    settings
        .with_interface(progenitor::InterfaceStyle::Builder)
        .with_tag(progenitor::TagStyle::Merged)
        .with_derive("PartialEq");
    let mut generator = progenitor::Generator::new(&settings);
    let tokens = generator
        .generate_tokens(&spec)
        .unwrap_or_else(|e| panic!("progenitor: {e}"));
    let ast = syn::parse2(tokens).expect("progenitor's output parses");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("codegen.rs");
    std::fs::write(out, prettyplease::unparse(&ast)).unwrap();
}

/// OpenAPI 3.1 → 3.0 for what utoipa emits.
fn downgrade(doc: &mut Value) {
    doc["openapi"] = "3.0.3".into();
    // 3.1 added the SPDX `identifier`; 3.0's License has `name` and `url` only.
    if let Some(license) = doc
        .pointer_mut("/info/license")
        .and_then(Value::as_object_mut)
    {
        license.remove("identifier");
    }
    walk(doc);
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for op in paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
        {
            raw_when_answers_differ(op);
            not_null_parameters(op);
        }
    }
}

/// utoipa spells an optional parameter `type: [T, "null"]`; a header or query parameter
/// is absent or a string, never null (`required: false` says it may be absent), and
/// progenitor would make it an `Option<Option<T>>` it cannot send.
fn not_null_parameters(op: &mut Value) {
    for param in op
        .get_mut("parameters")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(schema) = param.get_mut("schema").and_then(Value::as_object_mut) {
            schema.remove("nullable");
        }
    }
}

/// progenitor gives an operation one success type, and refuses one whose 2xx answers
/// differ (`DELETE /v1/consumers/{uid}`: 202 with a body while the deletion runs, 204
/// without one when it is done). Such an operation answers its body as raw bytes here;
/// docs/clients.md names it and how to read it.
fn raw_when_answers_differ(op: &mut Value) {
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    let success = |code: &String| code.starts_with('2');
    let kinds: std::collections::BTreeSet<String> = responses
        .iter()
        .filter(|(code, _)| success(code))
        .map(|(_, r)| r.get("content").map(Value::to_string).unwrap_or_default())
        .collect();
    if kinds.len() <= 1 {
        return;
    }
    for (_, response) in responses.iter_mut().filter(|(code, _)| success(code)) {
        response["content"] = serde_json::json!({
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
        });
    }
}

fn walk(v: &mut Value) {
    match v {
        Value::Object(o) => {
            schema_3_0(o);
            o.values_mut().for_each(walk);
        }
        Value::Array(a) => a.iter_mut().for_each(walk),
        _ => {}
    }
}

/// One object, if it is a 3.1 schema construct: rewritten in place to its 3.0 spelling.
fn schema_3_0(o: &mut Map<String, Value>) {
    // `type: [T, "null"]` is 3.0's `type: T, nullable: true`; several non-null types have
    // no 3.0 spelling but "any" (the event payload: any JSON value but null).
    if let Some(Value::Array(types)) = o.get("type") {
        let nullable = types.iter().any(|t| t == "null");
        let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        match rest.as_slice() {
            [one] => {
                o.insert("type".into(), one.clone());
            }
            _ => {
                o.remove("type");
            }
        }
        if nullable {
            o.insert("nullable".into(), true.into());
        }
    }
    // `oneOf: [{type: null}, X]` (utoipa's Option<T> of a component) is `X` made nullable;
    // 3.0 can only say that as `allOf: [X], nullable: true`.
    for key in ["oneOf", "anyOf"] {
        let Some(Value::Array(alts)) = o.get(key) else {
            continue;
        };
        let is_null = |s: &Value| s.get("type").is_some_and(|t| t == "null");
        if !alts.iter().any(is_null) {
            continue;
        }
        let rest: Vec<Value> = alts.iter().filter(|s| !is_null(s)).cloned().collect();
        if rest.len() == 1 {
            o.remove(key);
            o.insert("allOf".into(), Value::Array(rest));
        } else {
            o.insert(key.into(), Value::Array(rest));
        }
        o.insert("nullable".into(), true.into());
    }
    // 3.1's numeric `exclusiveMinimum`/`exclusiveMaximum` are 3.0's bound plus a flag.
    for (exclusive, bound) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if let Some(n) = o.get(exclusive).filter(|n| n.is_number()).cloned() {
            o.insert(bound.into(), n);
            o.insert(exclusive.into(), true.into());
        }
    }
    // `const` is a one-value `enum`; a schema's `examples` (a list; a parameter's or media
    // type's `examples` is a map in both versions) is 3.0's single `example`.
    if let Some(c) = o.remove("const") {
        o.insert("enum".into(), Value::Array(vec![c]));
    }
    if o.get("examples").is_some_and(Value::is_array)
        && let Some(Value::Array(mut examples)) = o.remove("examples")
        && !examples.is_empty()
    {
        o.insert("example".into(), examples.swap_remove(0));
    }
}
