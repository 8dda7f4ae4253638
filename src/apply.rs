//! `hookd apply -f FILE...`: WebhookEndpoint, WebhookSource and Secret YAML straight into
//! Postgres, through the same rules as the controller (the endpoint sync core, the source
//! rules). All documents of all files are parsed
//! and validated first; if any is invalid nothing is applied, and the error names the
//! file, the document and the problem.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use kube::{CustomResourceExt, ResourceExt};
use serde::Deserialize;
use sqlx::PgPool;

use crate::crypto::Keyring;
use crate::db::DbError;
use crate::domain::EndpointState;
use crate::k8s::sync::{self, SyncOutcome};
use crate::k8s::{WebhookEndpoint, WebhookEventType, WebhookSource};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{file}: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: document {index}{object}: {message}")]
    Invalid {
        file: PathBuf,
        index: usize,
        object: String,
        message: String,
    },
    /// The file as a whole is refused (too large, too deeply nested) before parsing.
    #[error("{file}: {message}")]
    File { file: PathBuf, message: String },
    #[error("no WebhookEndpoint, WebhookSource or WebhookEventType documents found")]
    Empty,
    /// The database refused a declared object (a source's name taken, a tenant at its
    /// cap): the transaction is rolled back, nothing of the files was applied.
    #[error("{object}: {message}; nothing was applied")]
    Refused { object: String, message: String },
    #[error(transparent)]
    Db(#[from] DbError),
}

/// One parsed document.
#[derive(Debug, Clone)]
pub enum Document {
    Endpoint(Box<WebhookEndpoint>),
    Source(Box<WebhookSource>),
    EventType(Box<WebhookEventType>),
    Secret(Box<Secret>),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    api_version: Option<String>,
    kind: Option<String>,
}

/// Largest YAML file read. Endpoint declarations are a few hundred bytes each; a bound
/// keeps a hostile or mistaken file (a log, a dump) from costing minutes of parsing.
pub const MAX_FILE_BYTES: usize = 1 << 20;

/// Deepest nesting of YAML collections accepted. A WebhookEndpoint or Secret nests at most
/// four levels; a YAML parser (serde_yaml, measured) took 21 s on 200 KB of deeply nested
/// flow YAML, so deep input is refused before it is parsed.
pub const MAX_NESTING: usize = 32;

/// Fields of `metadata` a YAML document may carry (ObjectMeta, camelCase).
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "generateName",
    "generation",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "finalizers",
    "managedFields",
    "ownerReferences",
    "selfLink",
];

/// Top-level fields of a v1 Secret.
const SECRET_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "data",
    "stringData",
    "type",
    "immutable",
];

/// Replaces every `whsec_…` in `message` by `whsec_(redacted)`: serde and sync errors quote
/// the values they refuse, and an apply error ends up in terminals, CI logs and tickets.
pub fn redact_secrets(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("whsec_") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "whsec_".len()..];
        let tail =
            after.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || "+/=-_".contains(c));
        // the bare prefix, as in "must start with whsec_", is no secret: keep it readable
        out.push_str(if tail.len() == after.len() {
            "whsec_"
        } else {
            "whsec_(redacted)"
        });
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// Serde's messages quote the refused value (`invalid type: string "…"`). In a Secret any
/// value may be key material, so every quoted value is dropped; field names, which serde
/// quotes with backticks, stay.
fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut parts = message.split('"');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    for (i, part) in parts.enumerate() {
        if i % 2 == 0 {
            out.push_str("\"(value hidden)");
        } else {
            out.push('"');
            out.push_str(part);
        }
    }
    out
}

/// Refuses a text nested deeper than [`MAX_NESTING`] collections, counted cheaply on the
/// raw text: flow brackets outside quotes and comments, plus block indentation steps.
fn check_nesting(text: &str) -> Result<(), String> {
    let mut deepest_flow = 0usize;
    let mut depth = 0usize;
    for line in text.lines() {
        let mut quote: Option<char> = None;
        let mut prev = ' ';
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q && prev != '\\' => quote = None,
                (Some(_), _) => {}
                (None, '#') if prev == ' ' || prev == '\t' => break,
                (None, '"' | '\'') => quote = Some(c),
                (None, '[' | '{') => {
                    depth += 1;
                    deepest_flow = deepest_flow.max(depth);
                }
                (None, ']' | '}') => depth = depth.saturating_sub(1),
                _ => {}
            }
            prev = c;
        }
    }
    // Block nesting: each level indents further, so the indentation width bounds it.
    let deepest_block = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start_matches([' ', '-']).len())
        .max()
        .unwrap_or(0)
        / 2;
    let deepest = deepest_flow.max(deepest_block);
    if deepest > MAX_NESTING {
        return Err(format!(
            "nested {deepest} levels deep; WebhookEndpoint, WebhookSource and Secret documents nest at most a few, and more than {MAX_NESTING} is refused"
        ));
    }
    Ok(())
}

/// Names fields of `value` (a JSON object) outside `known`, with a suggestion per field.
fn unknown_fields(value: &serde_json::Value, path: &str, known: &[&str], errs: &mut Vec<String>) {
    let Some(map) = value.as_object() else { return };
    for k in map.keys() {
        if !known.contains(&k.as_str()) {
            errs.push(unknown_field_message(path, k, known));
        }
    }
}

fn unknown_field_message(path: &str, field: &str, known: &[&str]) -> String {
    let full = if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    };
    let suggestion = known
        .iter()
        .map(|k| {
            (
                edit_distance(&field.to_ascii_lowercase(), &k.to_ascii_lowercase()),
                k,
            )
        })
        .filter(|(d, k)| *d <= 2 || k.starts_with(field) || field.starts_with(*k))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| format!(" (did you mean {k}?)"))
        .unwrap_or_default();
    format!(
        "unknown field {full}{suggestion}; known fields: {}",
        known.join(", ")
    )
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Parses a multi-document YAML text. `file` only labels errors.
pub fn parse_documents(file: &Path, text: &str) -> Result<Vec<Document>, ApplyError> {
    let whole = |message: String| ApplyError::File {
        file: file.to_path_buf(),
        message,
    };
    if text.len() > MAX_FILE_BYTES {
        return Err(whole(format!(
            "file is {} bytes; at most {MAX_FILE_BYTES} are read",
            text.len()
        )));
    }
    check_nesting(text).map_err(whole)?;
    // serde-saphyr (the YAML parser kube uses) reads every document into JSON values, the
    // shape the API server stores; empty documents between `---` are skipped. Its default
    // budget bounds alias expansion, so a "billion laughs" file is refused, not expanded.
    // No snippet: its errors would print the lines around the mistake, and a Secret's
    // base64 `data` there is a signing secret no redaction recognises.
    // Its default budget also stops at 1,024 documents, which a file of 600 endpoints and
    // their Secrets passes (`hookd-bench` writes 2,000 to a file): the file's size bounds
    // the documents instead (each takes at least its `---` line).
    let options = serde_saphyr::options! {
        with_snippet: false,
        budget: serde_saphyr::budget! {
            max_documents: MAX_FILE_BYTES / 4,
        },
    };
    let values: Vec<serde_json::Value> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| whole(redact_secrets(&format!("not valid YAML: {e}"))))?;
    let mut docs = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        let index = i + 1;
        let invalid = |object: String, message: String| ApplyError::Invalid {
            file: file.to_path_buf(),
            index,
            object,
            message: redact_secrets(&message),
        };
        if value.is_null() {
            continue;
        }
        let meta: TypeMeta = serde_json::from_value(value.clone())
            .map_err(|e| invalid(String::new(), format!("not a Kubernetes object: {e}")))?;
        let name_of = |v: &serde_json::Value| {
            let md = &v["metadata"];
            format!(
                " ({} {}/{})",
                meta.kind.as_deref().unwrap_or("?"),
                md["namespace"].as_str().unwrap_or("default"),
                md["name"].as_str().unwrap_or("?")
            )
        };
        let object = name_of(&value);
        match (meta.api_version.as_deref(), meta.kind.as_deref()) {
            (Some("hookd.dev/v1alpha1"), Some("WebhookEndpoint")) => {
                let ep: WebhookEndpoint =
                    hookd_object(value).map_err(|e| invalid(object.clone(), e))?;
                // The endpoint rules of every door first (their messages name the
                // field and the value), then what `kubectl apply` would refuse (the
                // CRD's CEL rules and schema bounds; tests/crd.rs holds both to one
                // verdict on a corpus of specs).
                crate::endpoints::validate_declared(&ep.spec.declared())
                    .map_err(|e| invalid(object.clone(), format!("spec.{e}")))?;
                ep.validate_as_api_server()
                    .map_err(|e| invalid(object.clone(), e))?;
                docs.push(Document::Endpoint(Box::new(ep)));
            }
            (Some("hookd.dev/v1alpha1"), Some("WebhookSource")) => {
                let src: WebhookSource =
                    hookd_object(value).map_err(|e| invalid(object.clone(), e))?;
                // the source rules run in `plan`, with the secret they check
                crate::inbound::sources::validate_name(&src.name_any())
                    .map_err(|e| invalid(object.clone(), format!("metadata.{e}")))?;
                src.validate_as_api_server()
                    .map_err(|e| invalid(object.clone(), e))?;
                docs.push(Document::Source(Box::new(src)));
            }
            (Some("hookd.dev/v1alpha1"), Some("WebhookEventType")) => {
                let et: WebhookEventType =
                    hookd_object(value).map_err(|e| invalid(object.clone(), e))?;
                et.validate_as_api_server()
                    .map_err(|e| invalid(object.clone(), e))?;
                // the catalog rules of every door (the API's and the controller's); the
                // tenant is the namespace's, as `plan` takes it
                let ns = et.namespace().unwrap_or_default();
                let name = et.event_type();
                crate::catalog::validate_declared(&et.declared(&ns, &ns, &name))
                    .map_err(|e| invalid(object.clone(), format!("spec: {e}")))?;
                docs.push(Document::EventType(Box::new(et)));
            }
            (Some("v1"), Some("Secret")) => {
                let mut errs = Vec::new();
                unknown_fields(&value, "", SECRET_FIELDS, &mut errs);
                unknown_fields(
                    &value["metadata"],
                    "metadata",
                    OBJECT_META_FIELDS,
                    &mut errs,
                );
                if !errs.is_empty() {
                    return Err(invalid(object, errs.join("; ")));
                }
                let mut s: Secret = serde_json::from_value(value).map_err(|e| {
                    invalid(
                        object.clone(),
                        format!("invalid Secret: {}", redact_quoted(&e.to_string())),
                    )
                })?;
                if s.metadata.name.as_deref().unwrap_or("").is_empty() {
                    return Err(invalid(object, "metadata.name is required".into()));
                }
                if s.metadata.namespace.is_none() {
                    s.metadata.namespace = Some("default".into());
                }
                docs.push(Document::Secret(Box::new(s)));
            }
            (av, k) => {
                return Err(invalid(
                    object,
                    format!(
                        "unsupported object {}/{}: only hookd.dev/v1alpha1 WebhookEndpoint, WebhookSource and WebhookEventType, and v1 Secret, can be applied",
                        av.unwrap_or("(no apiVersion)"),
                        k.unwrap_or("(no kind)")
                    ),
                ));
            }
        }
    }
    Ok(docs)
}

/// A document of one of hookd's kinds as `kubectl apply` would take it: only the fields
/// its CRD declares (kubectl refuses unknown fields; silently dropping `eventType:` for
/// `eventTypes` would subscribe an endpoint to every event), a name, and the namespace
/// `default` when it names none.
fn hookd_object<K>(value: serde_json::Value) -> Result<K, String>
where
    K: CustomResourceExt + kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    known_fields(&value, &K::crd())?;
    let mut obj: K =
        serde_json::from_value(value).map_err(|e| format!("invalid {}: {e}", K::kind(&())))?;
    if obj.meta().name.as_deref().unwrap_or("").is_empty() {
        return Err("metadata.name is required".into());
    }
    obj.meta_mut()
        .namespace
        .get_or_insert_with(|| "default".into());
    Ok(obj)
}

/// Refuses fields the CRD schema does not declare (what `kubectl apply` refuses with
/// strict field validation), in the object, its `metadata` and its `spec`.
fn known_fields(
    object: &serde_json::Value,
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Result<(), String> {
    use serde_json::Value;

    fn walk(schema: &Value, v: &Value, path: &str, errs: &mut Vec<String>) {
        let Value::Object(map) = v else {
            if let (Value::Array(items), Some(item)) = (v, schema.get("items")) {
                for (i, x) in items.iter().enumerate() {
                    walk(item, x, &format!("{path}[{i}]"), errs);
                }
            }
            return;
        };
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            return; // a map (additionalProperties) or an opaque object
        };
        let known: Vec<&str> = props.keys().map(String::as_str).collect();
        for (k, x) in map {
            match props.get(k) {
                Some(sub) => walk(sub, x, &format!("{path}.{k}"), errs),
                None => errs.push(unknown_field_message(path, k, &known)),
            }
        }
    }

    let schema = crate::k8s::crd::openapi_schema(crd);
    let mut errs = Vec::new();
    let mut top: Vec<&str> = vec!["apiVersion", "kind", "metadata"];
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for k in props.keys() {
            if !top.contains(&k.as_str()) {
                top.push(k);
            }
        }
    }
    unknown_fields(object, "", &top, &mut errs);
    unknown_fields(
        &object["metadata"],
        "metadata",
        OBJECT_META_FIELDS,
        &mut errs,
    );
    if let Some(spec_schema) = schema.pointer("/properties/spec") {
        walk(spec_schema, &object["spec"], "spec", &mut errs);
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

/// What a set of files declares, validated: each endpoint and each source with its
/// resolved secret.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub endpoints: Vec<sync::DesiredEndpoint>,
    pub sources: Vec<DesiredSource>,
    /// catalog entries, for the tenant of each object's namespace
    pub event_types: Vec<WebhookEventType>,
}

/// A WebhookSource with the verification secret its Secret holds.
#[derive(Clone)]
pub struct DesiredSource {
    pub source: WebhookSource,
    secret: String,
}

impl std::fmt::Debug for DesiredSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesiredSource")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl DesiredSource {
    /// The source as the source rules judge it: the tenant is `spec.tenant` or the
    /// namespace, as for a declared endpoint.
    fn declared(&self) -> crate::inbound::sources::Declared<'_> {
        let s = &self.source.spec;
        crate::inbound::sources::Declared {
            namespace: self
                .source
                .metadata
                .namespace
                .as_deref()
                .unwrap_or("default"),
            name: self.source.metadata.name.as_deref().unwrap_or_default(),
            tenant: s
                .tenant
                .as_deref()
                .or(self.source.metadata.namespace.as_deref())
                .unwrap_or("default"),
            consumer: s.consumer.as_deref(),
            provider: &s.provider,
            hmac: s.hmac.as_ref(),
            secret: &self.secret,
            event_type_prefix: s.event_type_prefix.as_deref(),
            max_body_bytes: s.max_body_bytes,
            description: s.description.as_deref(),
            secret_rotation_grace_seconds: s.secret_rotation_grace_seconds,
        }
    }
}

/// Warnings for endpoints signing with a published test-vector secret; they name the
/// endpoint, never the secret.
pub fn published_secret_warnings(plan: &Plan) -> Vec<String> {
    plan.endpoints
        .iter()
        .filter(|d| {
            d.secret
                .as_ref()
                .is_some_and(|s| crate::signing::is_published_test_secret(&s.value))
        })
        .map(|d| {
            format!(
                "warning: webhookendpoint/{}/{} signs with a published Standard Webhooks test-vector secret; anyone can forge its signatures. Generate one with: echo \"whsec_$(openssl rand -base64 32)\"",
                d.row.namespace, d.row.name
            )
        })
        .collect()
}

/// The validated plan: each endpoint and source with its resolved secret.
pub fn plan(files: &[(PathBuf, Vec<Document>)]) -> Result<Plan, ApplyError> {
    let mut secrets: HashMap<(String, String), &Secret> = HashMap::new();
    for (_, docs) in files {
        for d in docs {
            if let Document::Secret(s) = d {
                secrets.insert((s.namespace().unwrap_or_default(), s.name_any()), s);
            }
        }
    }
    let mut out = Plan::default();
    for (file, docs) in files {
        for (i, d) in docs.iter().enumerate() {
            let invalid = |object: String, message: &str| ApplyError::Invalid {
                file: file.clone(),
                index: i + 1,
                object,
                message: redact_secrets(message),
            };
            match d {
                Document::Endpoint(ep) => {
                    let ns = ep.namespace().unwrap_or_default();
                    let r = &ep.spec.secret_ref;
                    let secret = sync::resolve_secret(
                        &ns,
                        &r.name,
                        &r.key,
                        secrets.get(&(ns.clone(), r.name.clone())).copied(),
                    )
                    .map_err(|problem| {
                        invalid(
                            format!(" (WebhookEndpoint {ns}/{})", ep.name_any()),
                            &problem.to_string(),
                        )
                    })?;
                    out.endpoints.push(sync::desired_endpoint(ep, Ok(secret)));
                }
                Document::Source(src) => {
                    let ns = src.namespace().unwrap_or_default();
                    let object = format!(" (WebhookSource {ns}/{})", src.name_any());
                    let r = &src.spec.secret_ref;
                    let secret = sync::secret_text(
                        &ns,
                        &r.name,
                        &r.key,
                        secrets.get(&(ns.clone(), r.name.clone())).copied(),
                    )
                    .map_err(|problem| invalid(object.clone(), &problem.to_string()))?;
                    let desired = DesiredSource {
                        source: (**src).clone(),
                        secret,
                    };
                    // the rules of every door for a source (the API's and the controller's)
                    crate::inbound::sources::validate_declared(&desired.declared())
                        .map_err(|e| invalid(object, &format!("spec: {e}")))?;
                    out.sources.push(desired);
                }
                Document::EventType(et) => out.event_types.push((**et).clone()),
                Document::Secret(_) => {}
            }
        }
    }
    if out.endpoints.is_empty() && out.sources.is_empty() && out.event_types.is_empty() {
        return Err(ApplyError::Empty);
    }
    Ok(out)
}

/// What `-f -` is called in messages.
pub const STDIN_LABEL: &str = "(standard input)";

/// The texts `-f` names, as kubectl reads them: `-` is standard input, a directory is
/// every `*.yaml` (and `*.yml`) file directly in it, in name order, anything else a file.
/// Each is refused above [`MAX_FILE_BYTES`] before it is read whole.
pub fn read_sources(paths: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, ApplyError> {
    use std::io::Read;
    let too_large = |file: &Path, len: u64| ApplyError::File {
        file: file.to_path_buf(),
        message: format!("file is {len} bytes; at most {MAX_FILE_BYTES} are read"),
    };
    let mut out = Vec::new();
    let mut stdin_read = false;
    for p in paths {
        let read_err = |source| ApplyError::Read {
            file: p.clone(),
            source,
        };
        if p.as_os_str() == "-" {
            if std::mem::replace(&mut stdin_read, true) {
                continue; // `-f - -f -`: standard input is read once
            }
            let label = PathBuf::from(STDIN_LABEL);
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .take(MAX_FILE_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(|source| ApplyError::Read {
                    file: label.clone(),
                    source,
                })?;
            if bytes.len() > MAX_FILE_BYTES {
                return Err(ApplyError::File {
                    file: label,
                    message: format!("more than {MAX_FILE_BYTES} bytes; at most that is read"),
                });
            }
            let text = String::from_utf8(bytes).map_err(|_| ApplyError::File {
                file: label.clone(),
                message: "not UTF-8 text".into(),
            })?;
            out.push((label, text));
            continue;
        }
        let meta = std::fs::metadata(p).map_err(read_err)?;
        let files = if meta.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(read_err)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .filter(|f| f.is_file())
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(ApplyError::File {
                    file: p.clone(),
                    message: "a directory without *.yaml files".into(),
                });
            }
            files
        } else {
            vec![p.clone()]
        };
        for f in files {
            let read_err = |source| ApplyError::Read {
                file: f.clone(),
                source,
            };
            // Refuse a huge file before reading it into memory (a FIFO or /dev/stdin
            // reports 0 and is bounded by `parse_documents` instead).
            let len = std::fs::metadata(&f).map_err(read_err)?.len();
            if len > MAX_FILE_BYTES as u64 {
                return Err(too_large(&f, len));
            }
            let text = std::fs::read_to_string(&f).map_err(read_err)?;
            out.push((f, text));
        }
    }
    Ok(out)
}

/// Reads and validates the files into a plan; nothing is written.
pub fn load(paths: &[PathBuf]) -> Result<Plan, ApplyError> {
    load_texts(&read_sources(paths)?)
}

/// A declared object `hookd delete -f` removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredName {
    /// `webhookendpoint` or `webhooksource`, as kubectl names them
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for DeclaredName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

/// The WebhookEndpoints and WebhookSources `hookd delete -f` removes: every one the files
/// declare, in order, each once. The documents are validated as `hookd apply` validates
/// them (a file that would not apply names nothing to delete), but their Secrets need not
/// resolve.
pub fn load_deletions(paths: &[PathBuf]) -> Result<Vec<DeclaredName>, ApplyError> {
    let mut names: Vec<DeclaredName> = Vec::new();
    for (label, text) in read_sources(paths)? {
        for d in parse_documents(&label, &text)? {
            let (kind, namespace, name) = match d {
                Document::Endpoint(ep) => (
                    "webhookendpoint",
                    ep.namespace().unwrap_or_default(),
                    ep.name_any(),
                ),
                Document::Source(src) => (
                    "webhooksource",
                    src.namespace().unwrap_or_default(),
                    src.name_any(),
                ),
                Document::EventType(et) => (
                    "webhookeventtype",
                    et.namespace().unwrap_or_default(),
                    et.name_any(),
                ),
                Document::Secret(_) => continue,
            };
            let key = DeclaredName {
                kind,
                namespace,
                name,
            };
            if !names.contains(&key) {
                names.push(key);
            }
        }
    }
    if names.is_empty() {
        return Err(ApplyError::Empty);
    }
    Ok(names)
}

/// What `hookd delete` did to one declared object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// Disabled (its declaration is gone) and its unfinished deliveries cancelled; its
    /// history stays readable.
    Deleted {
        endpoint_id: uuid::Uuid,
        cancelled: i64,
    },
    /// A source deleted: its URL answers 401 from then on; the events it took in stay.
    SourceDeleted { source_id: uuid::Uuid },
    /// An event type removed from its tenant's catalog.
    EventTypeDeleted { tenant: String, name: String },
    /// Never applied, or already deleted.
    NotFound,
}

/// Removes the declared objects in one transaction, as the controller does when their
/// objects are deleted: an endpoint row is disabled and what was still to be sent is
/// `cancelled` (history stays), a source is deleted. Applying the same file again brings
/// them back.
pub async fn delete_declared(
    pool: &PgPool,
    names: &[DeclaredName],
) -> Result<Vec<(DeclaredName, Deletion)>, ApplyError> {
    let mut tx = crate::db::begin(pool).await?;
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let deletion = if n.kind == "webhookeventtype" {
            match crate::catalog::remove_declared(&mut tx, &n.namespace, &n.name).await {
                Ok(Some((tenant, name))) => Deletion::EventTypeDeleted { tenant, name },
                Ok(None) => Deletion::NotFound,
                Err(crate::catalog::CatalogError::Db(e)) => return Err(e.into()),
                Err(other) => {
                    return Err(ApplyError::Refused {
                        object: n.to_string(),
                        message: other.to_string(),
                    });
                }
            }
        } else if n.kind == "webhooksource" {
            match crate::inbound::sources::remove_declared(&mut tx, &n.namespace, &n.name).await {
                Ok(Some(source_id)) => Deletion::SourceDeleted { source_id },
                Ok(None) => Deletion::NotFound,
                Err(crate::inbound::sources::SourceError::Db(e)) => return Err(e.into()),
                Err(other) => {
                    return Err(ApplyError::Refused {
                        object: n.to_string(),
                        message: other.to_string(),
                    });
                }
            }
        } else if crate::db::endpoints::declared_live(&mut tx, &n.namespace, &n.name)
            .await?
            .is_none()
        {
            Deletion::NotFound
        } else {
            match crate::db::endpoints::remove_declared(
                &mut tx,
                &n.namespace,
                &n.name,
                "WebhookEndpoint deleted (hookd delete)",
            )
            .await?
            {
                Some((endpoint_id, cancelled)) => Deletion::Deleted {
                    endpoint_id,
                    cancelled,
                },
                None => Deletion::NotFound,
            }
        };
        out.push((n.clone(), deletion));
    }
    tx.commit().await.map_err(DbError::from)?;
    Ok(out)
}

/// Validates YAML texts already in memory (`label` names each in errors) into a plan.
pub fn load_texts(texts: &[(PathBuf, String)]) -> Result<Plan, ApplyError> {
    let mut files = Vec::new();
    for (label, text) in texts {
        files.push((label.clone(), parse_documents(label, text)?));
    }
    plan(&files)
}

/// What applying a plan did: each endpoint's and each source's outcome, by
/// `namespace/name`.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub endpoints: Vec<(String, SyncOutcome)>,
    pub sources: Vec<(String, crate::db::sources::DeclaredWrite)>,
    /// by `namespace/object`, with the event type it declares
    pub event_types: Vec<(String, String, crate::db::event_types::DeclaredWrite)>,
}

/// Applies a validated plan in one transaction; signing and verification secrets are
/// encrypted with `keyring`'s active key. A source the database refuses (its name taken
/// by another namespace or the API, or its tenant at its cap) fails the whole apply.
pub async fn apply_plan(
    pool: &PgPool,
    plan: &Plan,
    keyring: &Keyring,
) -> Result<Applied, ApplyError> {
    use crate::db::sources::DeclaredWrite;
    use crate::inbound::sources::SourceError;
    let mut tx = crate::db::begin(pool).await?;
    let mut applied = Applied::default();
    for d in &plan.endpoints {
        let outcome = sync::apply_endpoint(&mut tx, d, keyring).await?;
        applied
            .endpoints
            .push((format!("{}/{}", d.row.namespace, d.row.name), outcome));
    }
    for d in &plan.sources {
        let declared = d.declared();
        let label = format!("{}/{}", declared.namespace, declared.name);
        let refused = |message: String| ApplyError::Refused {
            object: format!("webhooksource/{label}"),
            message,
        };
        let written = crate::inbound::sources::apply_declared(&mut tx, keyring, &declared)
            .await
            .map_err(|e| match e {
                SourceError::Db(e) => ApplyError::Db(e),
                other => refused(other.to_string()),
            })?;
        match written {
            DeclaredWrite::NameTaken => {
                return Err(refused(format!(
                    "the name {:?} is taken by another namespace's WebhookSource or a source made through the API (source names are unique: they are the URL)",
                    declared.name
                )));
            }
            DeclaredWrite::TenantLimit => {
                return Err(refused(format!(
                    "tenant {:?} has {} sources, the most one tenant may have",
                    declared.tenant,
                    crate::inbound::sources::MAX_SOURCES_PER_TENANT
                )));
            }
            written => applied.sources.push((label, written)),
        }
    }
    for et in &plan.event_types {
        use crate::db::event_types::DeclaredWrite as Written;
        let ns = et.namespace().unwrap_or_default();
        let name = et.event_type();
        let label = format!("{ns}/{}", et.name_any());
        let refused = |message: String| ApplyError::Refused {
            object: format!("webhookeventtype/{label}"),
            message,
        };
        // `hookd apply` has no namespace map: the tenant is the namespace, as for a
        // declared endpoint or source without spec.tenant
        let written = crate::catalog::apply_declared(&mut tx, &et.declared(&ns, &ns, &name))
            .await
            .map_err(|e| match e {
                crate::catalog::CatalogError::Db(e) => ApplyError::Db(e),
                other => refused(other.to_string()),
            })?;
        match written {
            Written::NameTaken => {
                return Err(refused(format!(
                    "tenant {ns:?} has event type {name:?} already, made through the API or declared by another WebhookEventType"
                )));
            }
            Written::TenantLimit => {
                return Err(refused(format!(
                    "tenant {ns:?} has {} event types, the most one tenant may have",
                    crate::catalog::MAX_EVENT_TYPES_PER_TENANT
                )));
            }
            written => applied.event_types.push((label, name, written)),
        }
    }
    tx.commit().await.map_err(DbError::from)?;
    let created = applied.endpoints.iter().filter(|(_, o)| o.created).count();
    if created >= ANALYZE_AFTER_CREATING {
        // Autovacuum may have sampled the table while this transaction was open and
        // recorded its new pages as holding no rows; until its next pass every plan
        // that joins endpoints expects one (a 10,000-endpoint apply made outcome
        // batches scan the whole table: 288 deliveries/s instead of 5,600). The
        // endpoints are committed whatever this says.
        if let Err(e) = crate::db::endpoints::analyze(pool).await {
            tracing::warn!(error = %e, "could not refresh the endpoints' statistics after a bulk apply; autovacuum will");
        }
    }
    Ok(applied)
}

/// An apply that creates at least this many endpoints refreshes the table's statistics.
pub const ANALYZE_AFTER_CREATING: usize = 500;

/// Reads, validates and applies the files in one transaction.
pub async fn apply_files(
    pool: &PgPool,
    paths: &[PathBuf],
    keyring: &Keyring,
) -> Result<Applied, ApplyError> {
    let desired = load(paths)?;
    apply_plan(pool, &desired, keyring).await
}

/// One line per applied endpoint for `hookd apply`'s output: what changed, and for an
/// endpoint that is not active, why (a receiver's 410, a paused spec, an unusable
/// Secret) and what to do, so re-applying an unchanged file never leaves a silent
/// `disabled`.
pub async fn describe(pool: &PgPool, applied: &Applied) -> Result<Vec<String>, ApplyError> {
    use crate::db::sources::DeclaredWrite;
    let mut lines = Vec::with_capacity(applied.endpoints.len() + applied.sources.len());
    for (name, outcome) in &applied.endpoints {
        let what = match (outcome.created, outcome.changed, outcome.secret_rotated) {
            (true, _, _) => "created",
            (_, _, true) => "secret rotated",
            (_, true, _) => "configured",
            _ => "unchanged",
        };
        let mut line = format!(
            "webhookendpoint/{name} {what} (id {}, state {}, {} active secret(s))",
            outcome.endpoint_id,
            outcome.state.map_or("unchanged", EndpointState::as_str),
            outcome.active_secrets
        );
        if outcome.state != Some(EndpointState::Active)
            && let Some(row) = crate::db::endpoints::get(pool, outcome.endpoint_id, None).await?
        {
            if let Some(reason) = row.state_reason {
                line.push_str(&format!("; {} because: {reason}", row.state));
            }
            if row.state == EndpointState::Disabled {
                line.push_str(
                    "; to re-enable it once the receiver is fixed, apply it once with `paused: true`, then again without (see README, Retries)",
                );
            }
        }
        lines.push(line);
    }
    for (name, written) in &applied.sources {
        lines.push(match written {
            DeclaredWrite::Created(id) => {
                format!("webhooksource/{name} created (id {id}, takes requests at /in/{})", name.rsplit('/').next().unwrap_or(name))
            }
            DeclaredWrite::Updated {
                id,
                secret_rotated: true,
            } => format!("webhooksource/{name} secret rotated (id {id}; the previous secret verifies for the grace)"),
            DeclaredWrite::Updated { id, .. } => format!("webhooksource/{name} configured (id {id})"),
            // refused before the commit (apply_plan)
            DeclaredWrite::NameTaken | DeclaredWrite::TenantLimit => continue,
        });
    }
    for (label, name, written) in &applied.event_types {
        use crate::db::event_types::DeclaredWrite as Written;
        let what = match written {
            Written::Created => "created",
            Written::Updated { changed: true } => "configured",
            Written::Updated { changed: false } => "unchanged",
            Written::NameTaken | Written::TenantLimit => continue,
        };
        lines.push(format!(
            "webhookeventtype/{label} {what} (event type {name})"
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::{MAX_FILE_BYTES, parse_documents, redact_secrets};

    /// The file's size bounds what one file holds, not the YAML parser's default of 1,024
    /// documents: 2,000 endpoints with their Secrets were refused as "budget breached".
    #[test]
    fn a_file_of_thousands_of_documents_is_read_whole() {
        let doc =
            "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: s\nstringData:\n  secret: x\n";
        let text = doc.repeat(4_000);
        assert!(text.len() < MAX_FILE_BYTES);
        let docs = parse_documents(std::path::Path::new("many.yaml"), &text).unwrap();
        assert_eq!(docs.len(), 4_000);
    }

    /// A secret after the prefix is hidden; the prefix alone, as in the hint "must start
    /// with whsec_", is not a secret and stays readable.
    #[test]
    fn only_secrets_are_redacted() {
        assert_eq!(
            redact_secrets("secret must start with whsec_"),
            "secret must start with whsec_"
        );
        assert_eq!(
            redact_secrets("bad whsec_MfKQ9r8+/= here; whsec_ again"),
            "bad whsec_(redacted) here; whsec_ again"
        );
    }
}
