//! `hookd apply -f FILE...`: WebhookEndpoint and Secret YAML straight into Postgres,
//! through the same sync core as the controller. All documents of all files are parsed
//! and validated first; if any is invalid nothing is applied, and the error names the
//! file, the document and the problem.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde::Deserialize;
use sqlx::PgPool;

use crate::crypto::Keyring;
use crate::db::DbError;
use crate::domain::EndpointState;
use crate::k8s::WebhookEndpoint;
use crate::k8s::sync::{self, SyncOutcome};

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
    #[error("no WebhookEndpoint documents found")]
    Empty,
    #[error(transparent)]
    Db(#[from] DbError),
}

/// One parsed document.
#[derive(Debug, Clone)]
pub enum Document {
    Endpoint(Box<WebhookEndpoint>),
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
            "nested {deepest} levels deep; WebhookEndpoint and Secret documents nest at most a few, and more than {MAX_NESTING} is refused"
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
                // kubectl refuses unknown fields; silently dropping `eventType:` (for
                // `eventTypes`) would subscribe the endpoint to every event.
                known_fields(&value).map_err(|e| invalid(object.clone(), e))?;
                let mut ep: WebhookEndpoint = serde_json::from_value(value).map_err(|e| {
                    invalid(object.clone(), format!("invalid WebhookEndpoint: {e}"))
                })?;
                if ep.metadata.name.as_deref().unwrap_or("").is_empty() {
                    return Err(invalid(object, "metadata.name is required".into()));
                }
                if ep.metadata.namespace.is_none() {
                    ep.metadata.namespace = Some("default".into());
                }
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
                        "unsupported object {}/{}: only hookd.dev/v1alpha1 WebhookEndpoint and v1 Secret can be applied",
                        av.unwrap_or("(no apiVersion)"),
                        k.unwrap_or("(no kind)")
                    ),
                ));
            }
        }
    }
    Ok(docs)
}

/// Refuses fields the CRD schema does not declare (what `kubectl apply` refuses with
/// strict field validation), in the object, its `metadata` and its `spec`.
fn known_fields(object: &serde_json::Value) -> Result<(), String> {
    use kube::CustomResourceExt;
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

    let schema = crate::k8s::crd::openapi_schema(&WebhookEndpoint::crd());
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

/// Warnings for endpoints signing with a published test-vector secret; they name the
/// endpoint, never the secret.
pub fn published_secret_warnings(plan: &[sync::DesiredEndpoint]) -> Vec<String> {
    plan.iter()
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

/// The validated plan: each endpoint with its resolved secret.
pub fn plan(files: &[(PathBuf, Vec<Document>)]) -> Result<Vec<sync::DesiredEndpoint>, ApplyError> {
    let mut secrets: HashMap<(String, String), &Secret> = HashMap::new();
    for (_, docs) in files {
        for d in docs {
            if let Document::Secret(s) = d {
                secrets.insert((s.namespace().unwrap_or_default(), s.name_any()), s);
            }
        }
    }
    let mut out = Vec::new();
    for (file, docs) in files {
        for (i, d) in docs.iter().enumerate() {
            let Document::Endpoint(ep) = d else { continue };
            let ns = ep.namespace().unwrap_or_default();
            let r = &ep.spec.secret_ref;
            let secret = sync::resolve_secret(
                &ns,
                &r.name,
                &r.key,
                secrets.get(&(ns.clone(), r.name.clone())).copied(),
            )
            .map_err(|problem| ApplyError::Invalid {
                file: file.clone(),
                index: i + 1,
                object: format!(" (WebhookEndpoint {ns}/{})", ep.name_any()),
                message: redact_secrets(&problem.to_string()),
            })?;
            out.push(sync::desired_endpoint(ep, Ok(secret)));
        }
    }
    if out.is_empty() {
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
pub fn load(paths: &[PathBuf]) -> Result<Vec<sync::DesiredEndpoint>, ApplyError> {
    load_texts(&read_sources(paths)?)
}

/// The WebhookEndpoints `hookd delete -f` removes: every one the files declare, as
/// `(namespace, name)`, in order, each once. The documents are validated as `hookd apply`
/// validates them (a file that would not apply names nothing to delete), but their
/// Secrets need not resolve.
pub fn load_deletions(paths: &[PathBuf]) -> Result<Vec<(String, String)>, ApplyError> {
    let mut names: Vec<(String, String)> = Vec::new();
    for (label, text) in read_sources(paths)? {
        for d in parse_documents(&label, &text)? {
            if let Document::Endpoint(ep) = d {
                let key = (ep.namespace().unwrap_or_default(), ep.name_any());
                if !names.contains(&key) {
                    names.push(key);
                }
            }
        }
    }
    if names.is_empty() {
        return Err(ApplyError::Empty);
    }
    Ok(names)
}

/// What `hookd delete` did to one declared endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// Disabled (its declaration is gone) and its unfinished deliveries cancelled; its
    /// history stays readable.
    Deleted {
        endpoint_id: uuid::Uuid,
        cancelled: i64,
    },
    /// Never applied, or already deleted.
    NotFound,
}

/// Removes the declared endpoints in one transaction, as the controller does when a
/// WebhookEndpoint object is deleted: the row is disabled, what was still to be sent is
/// `cancelled`, history stays. Applying the same file again brings it back.
pub async fn delete_declared(
    pool: &PgPool,
    names: &[(String, String)],
) -> Result<Vec<(String, Deletion)>, ApplyError> {
    let mut tx = crate::db::begin(pool).await?;
    let mut out = Vec::with_capacity(names.len());
    for (ns, name) in names {
        let label = format!("{ns}/{name}");
        if crate::db::endpoints::declared_live(&mut tx, ns, name)
            .await?
            .is_none()
        {
            out.push((label, Deletion::NotFound));
            continue;
        }
        let removed = crate::db::endpoints::remove_declared(
            &mut tx,
            ns,
            name,
            "WebhookEndpoint deleted (hookd delete)",
        )
        .await?;
        out.push((
            label,
            match removed {
                Some((endpoint_id, cancelled)) => Deletion::Deleted {
                    endpoint_id,
                    cancelled,
                },
                None => Deletion::NotFound,
            },
        ));
    }
    tx.commit().await.map_err(DbError::from)?;
    Ok(out)
}

/// Validates YAML texts already in memory (`label` names each in errors) into a plan.
pub fn load_texts(texts: &[(PathBuf, String)]) -> Result<Vec<sync::DesiredEndpoint>, ApplyError> {
    let mut files = Vec::new();
    for (label, text) in texts {
        files.push((label.clone(), parse_documents(label, text)?));
    }
    plan(&files)
}

/// Applies a validated plan in one transaction; signing secrets are encrypted with
/// `keyring`'s active key.
pub async fn apply_plan(
    pool: &PgPool,
    desired: &[sync::DesiredEndpoint],
    keyring: &Keyring,
) -> Result<Vec<(String, SyncOutcome)>, ApplyError> {
    let mut tx = crate::db::begin(pool).await?;
    let mut results = Vec::new();
    for d in desired {
        let outcome = sync::apply_endpoint(&mut tx, d, keyring).await?;
        results.push((format!("{}/{}", d.row.namespace, d.row.name), outcome));
    }
    tx.commit().await.map_err(DbError::from)?;
    let created = results.iter().filter(|(_, o)| o.created).count();
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
    Ok(results)
}

/// An apply that creates at least this many endpoints refreshes the table's statistics.
pub const ANALYZE_AFTER_CREATING: usize = 500;

/// Reads, validates and applies the files in one transaction.
pub async fn apply_files(
    pool: &PgPool,
    paths: &[PathBuf],
    keyring: &Keyring,
) -> Result<Vec<(String, SyncOutcome)>, ApplyError> {
    let desired = load(paths)?;
    apply_plan(pool, &desired, keyring).await
}

/// One line per applied endpoint for `hookd apply`'s output: what changed, and for an
/// endpoint that is not active, why (a receiver's 410, a paused spec, an unusable
/// Secret) and what to do, so re-applying an unchanged file never leaves a silent
/// `disabled`.
pub async fn describe(
    pool: &PgPool,
    results: &[(String, SyncOutcome)],
) -> Result<Vec<String>, ApplyError> {
    let mut lines = Vec::with_capacity(results.len());
    for (name, outcome) in results {
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
