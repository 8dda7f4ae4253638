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

/// Parses a multi-document YAML text. `file` only labels errors.
pub fn parse_documents(file: &Path, text: &str) -> Result<Vec<Document>, ApplyError> {
    let mut docs = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let invalid = |object: String, message: String| ApplyError::Invalid {
            file: file.to_path_buf(),
            index,
            object,
            message,
        };
        let value = serde_yaml::Value::deserialize(de)
            .map_err(|e| invalid(String::new(), format!("not valid YAML: {e}")))?;
        if value.is_null() {
            continue; // an empty document between `---` separators
        }
        let meta: TypeMeta = serde_yaml::from_value(value.clone())
            .map_err(|e| invalid(String::new(), format!("not a Kubernetes object: {e}")))?;
        let name_of = |v: &serde_yaml::Value| {
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
                let json = serde_json::to_value(&value)
                    .map_err(|e| invalid(object.clone(), e.to_string()))?;
                let mut ep: WebhookEndpoint =
                    serde_json::from_value(json.clone()).map_err(|e| {
                        invalid(object.clone(), format!("invalid WebhookEndpoint: {e}"))
                    })?;
                if ep.metadata.name.as_deref().unwrap_or("").is_empty() {
                    return Err(invalid(object, "metadata.name is required".into()));
                }
                if ep.metadata.namespace.is_none() {
                    ep.metadata.namespace = Some("default".into());
                }
                // The CRD's CEL rules, evaluated locally: the same refusals kubectl would give.
                ep.validate_cel()
                    .map_err(|e| invalid(object.clone(), e.to_string()))?;
                // validate_cel runs only the x-kubernetes-validations rules; the schema's
                // own bounds (minimum/maximum, lengths, item counts) are the API server's
                // job in a cluster, so check them here too.
                schema_bounds(&ep).map_err(|e| invalid(object.clone(), e))?;
                docs.push(Document::Endpoint(Box::new(ep)));
            }
            (Some("v1"), Some("Secret")) => {
                let mut s: Secret = serde_yaml::from_value(value)
                    .map_err(|e| invalid(object.clone(), format!("invalid Secret: {e}")))?;
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

/// Checks `ep` against the OpenAPI bounds of the CRD schema (what `kubectl apply` would
/// refuse before any CEL rule runs). Returns every violation, `path: problem`, joined.
fn schema_bounds(ep: &WebhookEndpoint) -> Result<(), String> {
    use kube::CustomResourceExt;
    use serde_json::Value;

    fn walk(schema: &Value, v: &Value, path: &str, errs: &mut Vec<String>) {
        let num = |k: &str| schema.get(k).and_then(Value::as_f64);
        let len = |k: &str| schema.get(k).and_then(Value::as_u64);
        match v {
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or_default();
                if let Some(min) = num("minimum").filter(|m| x < *m) {
                    errs.push(format!("{path}: {n} is less than the minimum {min}"));
                }
                if let Some(max) = num("maximum").filter(|m| x > *m) {
                    errs.push(format!("{path}: {n} is greater than the maximum {max}"));
                }
            }
            Value::String(s) => {
                let n = s.chars().count() as u64;
                if let Some(min) = len("minLength").filter(|m| n < *m) {
                    errs.push(format!("{path}: must be at least {min} characters"));
                }
                if let Some(max) = len("maxLength").filter(|m| n > *m) {
                    errs.push(format!("{path}: must be at most {max} characters"));
                }
            }
            Value::Array(items) => {
                let n = items.len() as u64;
                if let Some(min) = len("minItems").filter(|m| n < *m) {
                    errs.push(format!("{path}: must have at least {min} items"));
                }
                if let Some(max) = len("maxItems").filter(|m| n > *m) {
                    errs.push(format!("{path}: must have at most {max} items"));
                }
                if let Some(item) = schema.get("items") {
                    for (i, x) in items.iter().enumerate() {
                        walk(item, x, &format!("{path}[{i}]"), errs);
                    }
                }
            }
            Value::Object(map) => {
                let props = schema.get("properties").and_then(Value::as_object);
                let extra = schema.get("additionalProperties").filter(|a| a.is_object());
                for (k, x) in map {
                    let sub = props.and_then(|p| p.get(k)).or(extra);
                    if let Some(sub) = sub {
                        let p = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        walk(sub, x, &p, errs);
                    }
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }

    let crd = WebhookEndpoint::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or_default();
    let object = serde_json::to_value(ep).map_err(|e| e.to_string())?;
    let mut errs = Vec::new();
    walk(&schema, &object, "", &mut errs);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
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
                message: problem.to_string(),
            })?;
            out.push(sync::desired_endpoint(ep, Ok(secret)));
        }
    }
    if out.is_empty() {
        return Err(ApplyError::Empty);
    }
    Ok(out)
}

/// Reads and validates the files into a plan; nothing is written.
pub fn load(paths: &[PathBuf]) -> Result<Vec<sync::DesiredEndpoint>, ApplyError> {
    let mut files = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(p).map_err(|source| ApplyError::Read {
            file: p.clone(),
            source,
        })?;
        files.push((p.clone(), parse_documents(p, &text)?));
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
    let mut tx = pool.begin().await.map_err(DbError::from)?;
    let mut results = Vec::new();
    for d in desired {
        let outcome = sync::apply_endpoint(&mut tx, d, keyring).await?;
        results.push((format!("{}/{}", d.row.namespace, d.row.name), outcome));
    }
    tx.commit().await.map_err(DbError::from)?;
    Ok(results)
}

/// Reads, validates and applies the files in one transaction.
pub async fn apply_files(
    pool: &PgPool,
    paths: &[PathBuf],
    keyring: &Keyring,
) -> Result<Vec<(String, SyncOutcome)>, ApplyError> {
    let desired = load(paths)?;
    apply_plan(pool, &desired, keyring).await
}
