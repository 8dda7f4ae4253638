//! The event-type catalog (issue 34, item 3): what an event type is (its rules, for every
//! door: the API, a WebhookEventType object, `hookd apply`), hookd's own reserved types, and
//! checking a message against its type's JSON Schema at enqueue, with the compiled schemas
//! an API process keeps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sqlx::PgPool;

use crate::db::{self, DbError, event_types as rows};
use crate::domain::ManagedBy;

/// The largest schema a type may have, as compact JSON: compiling it is work done on a
/// write and kept, but every byte is held by each API process that validates with it.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// The largest example, as sent.
pub const MAX_EXAMPLE_BYTES: usize = 64 * 1024;
/// The longest description and deprecation note, in characters.
pub const MAX_TEXT_CHARS: usize = 1000;
/// Most types one tenant may declare: a producer or an object in a loop must not be able
/// to fill the database, or the portal's picker.
pub const MAX_EVENT_TYPES_PER_TENANT: i64 = 1000;
/// Compiled schemas an API process keeps (each at most a few MB: see [`compile`]); past
/// it one is dropped for each one compiled.
pub const CACHED_SCHEMAS: usize = 256;
/// The most subschemas a schema may stand for with its `$ref`s followed: a payload's check
/// costs at most about this many subschemas per node of the payload. Without the bound a
/// 64 KiB schema of alternatives that refer to one another checks one wrong payload in
/// time exponential in its depth (measured: 8 alternatives over a payload nested 8 deep took
/// 26 s of a core).
pub const MAX_EXPANDED_SUBSCHEMAS: usize = 10_000;
/// The most a compiled `pattern` may take (the `regex` engine's size limits): a 64 KiB
/// schema of `\w{1000}` patterns must not cost the API gigabytes.
const PATTERN_BYTES: usize = 256 * 1024;

/// hookd's own event type, shown in the catalog and never stored (migration 0033 refuses
/// any under `hookd.`).
#[derive(Debug, Clone, Copy)]
pub struct ReservedType {
    pub name: &'static str,
    pub description: &'static str,
    pub example: &'static str,
}

/// The operational events (docs/delivery.md#operational-events), in name order.
pub const RESERVED: &[ReservedType] = &[
    ReservedType {
        name: "hookd.endpoint.circuit_open",
        description: "An endpoint's circuit has stayed open for HOOKD_CIRCUIT_ALERT_SECS: its receiver keeps failing and its deliveries are held. Sent to the tenant's own endpoints that name it.",
        example: r#"{"type":"hookd.endpoint.circuit_open","endpointId":"01938f6e-7c1a-7b3e-9d2a-3f1c5e7a9b11","consumer":"cust_42","url":"https://example.com/hooks","description":null,"state":"active","reason":"open since 2026-12-06T06:40:12Z after 5 failures","circuitOpenedAt":"2026-12-06T06:40:12.31Z","kubernetes":null,"at":"2026-12-06T06:45:12.31Z"}"#,
    },
    ReservedType {
        name: "hookd.endpoint.disabled",
        description: "An endpoint was disabled: its receiver answered 410 Gone, its consumer was deleted, or its declaration moved to another owner. Sent to the tenant's own endpoints that name it.",
        example: r#"{"type":"hookd.endpoint.disabled","endpointId":"01938f6e-7c1a-7b3e-9d2a-3f1c5e7a9b11","consumer":"cust_42","url":"https://example.com/hooks","description":null,"state":"disabled","reason":"receiver answered 410 Gone","circuitOpenedAt":null,"kubernetes":null,"at":"2026-12-06T06:40:12.31Z"}"#,
    },
    ReservedType {
        name: "hookd.endpoint.enabled",
        description: "A disabled endpoint was enabled again. Sent to the tenant's own endpoints that name it.",
        example: r#"{"type":"hookd.endpoint.enabled","endpointId":"01938f6e-7c1a-7b3e-9d2a-3f1c5e7a9b11","consumer":"cust_42","url":"https://example.com/hooks","description":null,"state":"active","reason":null,"circuitOpenedAt":null,"kubernetes":null,"at":"2026-12-06T06:40:12.31Z"}"#,
    },
    ReservedType {
        name: "hookd.endpoint.secret_unreadable",
        description: "A dispatcher cannot open an endpoint's signing secret (its key is missing); its deliveries are held, never sent unsigned. Sent to the tenant's own endpoints that name it.",
        example: r#"{"type":"hookd.endpoint.secret_unreadable","endpointId":"01938f6e-7c1a-7b3e-9d2a-3f1c5e7a9b11","consumer":null,"url":"https://example.com/hooks","description":null,"state":"active","reason":"sealed with key k1, which this dispatcher does not have","circuitOpenedAt":null,"kubernetes":null,"at":"2026-12-06T06:40:12.31Z"}"#,
    },
];

/// The reserved type named `name`, if it is one of [`RESERVED`].
pub fn reserved(name: &str) -> Option<&'static ReservedType> {
    RESERVED.iter().find(|r| r.name == name)
}

/// Why a catalog operation was refused (mapped to answers in `api::error`).
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// the name is not an event type
    #[error("{0}")]
    InvalidName(String),
    /// under `hookd.`: hookd's own
    #[error("{0}")]
    Reserved(String),
    #[error("{0}")]
    Invalid(String),
    /// the schema does not compile (or is too large, or not an object)
    #[error("{0}")]
    InvalidSchema(String),
    #[error("event type {0:?} exists")]
    Exists(String),
    #[error("tenant {tenant:?} has {cap} event types, the most it may have")]
    TenantLimit { tenant: String, cap: i64 },
    /// declared by a WebhookEventType object: the object is changed, not the type
    #[error("event type {0:?} is declared by a WebhookEventType object")]
    ManagedByKubernetes(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// An event type's name: the syntax of every event type, and not hookd's own.
pub fn validate_name(name: &str) -> Result<(), CatalogError> {
    crate::domain::validate_event_type(name).map_err(CatalogError::InvalidName)?;
    crate::domain::check_not_reserved(name).map_err(CatalogError::Reserved)
}

/// Compiles a JSON Schema (its `$schema` names the draft; 2020-12 when it names none). No
/// reference outside the schema is fetched (a `$ref` to a URL is refused: the API must
/// not be made to call out, nor wait on another server at enqueue), and `pattern`s use the
/// linear-time `regex` engine within [`PATTERN_BYTES`], so no schema can make a payload's
/// check take exponential time. The error names what is wrong, for the declarer.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .offline()
        .with_pattern_options(
            jsonschema::PatternOptions::regex()
                .size_limit(PATTERN_BYTES)
                .dfa_size_limit(PATTERN_BYTES),
        )
        .build(schema)
        .map_err(|e| bounded(&format!("schema{}: {e}", e.instance_path().as_str())))
}

/// How many subschemas `schema` stands for with its `$ref`s followed (each target counted
/// once per reference, computed once), refusing what would make a payload's check cost
/// more than polynomial time: a reference that leads back to itself (recursion), one that is
/// not a JSON pointer into the schema itself (`#/$defs/...`), `$dynamicRef` and
/// `$recursiveRef`, and more than [`MAX_EXPANDED_SUBSCHEMAS`].
pub fn expanded_size(schema: &Value) -> Result<usize, String> {
    walk_expanded(
        schema,
        schema,
        Place::Root,
        &mut HashMap::new(),
        &mut Vec::new(),
    )
}

fn too_many_subschemas() -> String {
    format!(
        "schema: it stands for more than {MAX_EXPANDED_SUBSCHEMAS} subschemas with its $refs followed; checking a payload against it could take minutes"
    )
}

/// What a JSON value in a schema is: the schema itself, a subschema (whose keys are
/// keywords), or a map whose keys are names (`properties`, `$defs`, …) and whose values
/// are subschemas. A property named `enum` is a subschema like any other: skipping it as
/// data let a recursive schema through (the hostile review).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    Schema,
    Names,
}

fn walk_expanded(
    root: &Value,
    node: &Value,
    place: Place,
    memo: &mut HashMap<String, usize>,
    stack: &mut Vec<String>,
) -> Result<usize, String> {
    let mut total: usize = 1;
    match node {
        Value::Array(items) => {
            for item in items {
                total =
                    total.saturating_add(walk_expanded(root, item, Place::Schema, memo, stack)?);
                if total > MAX_EXPANDED_SUBSCHEMAS {
                    return Err(too_many_subschemas());
                }
            }
        }
        Value::Object(map) => {
            for (key, value) in map {
                let n = if place == Place::Names {
                    walk_expanded(root, value, Place::Schema, memo, stack)?
                } else {
                    match key.as_str() {
                        // data, not subschemas
                        "enum" | "const" | "examples" | "default" => 0,
                        "$dynamicRef" | "$recursiveRef" => {
                            return Err(format!(
                                "schema: {key} is not supported (a recursive schema can make a payload's check take exponential time)"
                            ));
                        }
                        // a subschema with its own base URI resolves `#/...` against itself,
                        // not against the root this walk follows
                        "$id" | "id" | "$anchor" | "$dynamicAnchor"
                            if place == Place::Schema && value.is_string() =>
                        {
                            return Err(format!(
                                "schema: {key} is only supported at the top of the schema (references are resolved against it)"
                            ));
                        }
                        "$ref" => {
                            let Some(target) = value.as_str() else {
                                return Err("schema: $ref must be a string".into());
                            };
                            follow_ref(root, target, memo, stack)?
                        }
                        "properties" | "patternProperties" | "$defs" | "definitions"
                        | "dependentSchemas" | "dependencies" => {
                            walk_expanded(root, value, Place::Names, memo, stack)?
                        }
                        _ => walk_expanded(root, value, Place::Schema, memo, stack)?,
                    }
                };
                total = total.saturating_add(n);
                if total > MAX_EXPANDED_SUBSCHEMAS {
                    return Err(too_many_subschemas());
                }
            }
        }
        _ => {}
    }
    Ok(total)
}

fn follow_ref(
    root: &Value,
    target: &str,
    memo: &mut HashMap<String, usize>,
    stack: &mut Vec<String>,
) -> Result<usize, String> {
    let Some(fragment) = target.strip_prefix('#') else {
        return Err(format!(
            "schema: $ref {target:?} is not supported: only references into the schema itself (#/$defs/...) are, and nothing is fetched"
        ));
    };
    if let Some(n) = memo.get(fragment) {
        return Ok(*n);
    }
    if stack.iter().any(|p| p == fragment) {
        return Err(format!(
            "schema: $ref {target:?} leads back to itself; recursive schemas are not supported (checking a deep payload against one can take exponential time)"
        ));
    }
    let pointer = percent_decode(fragment);
    let node = if pointer.is_empty() {
        Some(root)
    } else if pointer.starts_with('/') {
        root.pointer(&pointer)
    } else {
        None
    };
    let Some(node) = node else {
        return Err(format!(
            "schema: $ref {target:?} does not point into the schema (use #/$defs/name)"
        ));
    };
    stack.push(fragment.to_string());
    let n = walk_expanded(root, node, Place::Schema, memo, stack)?;
    stack.pop();
    memo.insert(fragment.to_string(), n);
    Ok(n)
}

/// The `%XX` escapes of a URI fragment decoded (a JSON pointer's `~0` and `~1` are
/// `Value::pointer`'s to read).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| s.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A message of at most 500 characters: an error quotes the value it refuses, and a payload
/// may be a megabyte.
fn bounded(s: &str) -> String {
    const MAX: usize = 500;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// The first way `instance` fails `validator`, named by its JSON pointer under `root`
/// (`payload/amount: "x" is not of type "integer"`). Only the first: collecting every error
/// built the nested `anyOf` detail of every item of an array before the first was taken
/// (the hostile review: 20.9 GB for one 240 KB payload against a schema this module accepts).
pub fn violation(
    validator: &jsonschema::Validator,
    instance: &Value,
    root: &str,
) -> Option<String> {
    // the common case, a payload that matches, without building any error
    if validator.is_valid(instance) {
        return None;
    }
    let first = validator.validate(instance).err()?;
    Some(bounded(&format!(
        "{root}{}: {first}",
        first.instance_path().as_str()
    )))
}

/// A description or deprecation note: bounded free text.
fn check_text(field: &str, text: Option<&str>) -> Result<(), CatalogError> {
    match text {
        Some(t) => {
            crate::domain::validate_text(field, t, MAX_TEXT_CHARS).map_err(CatalogError::Invalid)
        }
        None => Ok(()),
    }
}

/// A schema as stored: a JSON object within [`MAX_SCHEMA_BYTES`] that compiles.
pub fn check_schema(schema: &Value) -> Result<jsonschema::Validator, CatalogError> {
    if !schema.is_object() {
        return Err(CatalogError::InvalidSchema(
            "schema must be a JSON Schema object ({\"type\": \"object\", ...})".into(),
        ));
    }
    let size = serde_json::to_string(schema).map_or(usize::MAX, |s| s.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(CatalogError::InvalidSchema(format!(
            "schema is {size} bytes as compact JSON; at most {MAX_SCHEMA_BYTES} are kept"
        )));
    }
    crate::domain::validate_json_text("schema", schema).map_err(CatalogError::InvalidSchema)?;
    expanded_size(schema).map_err(CatalogError::InvalidSchema)?;
    compile(schema).map_err(CatalogError::InvalidSchema)
}

/// An example: JSON text within [`MAX_EXAMPLE_BYTES`], valid under the schema if there is
/// one.
pub fn check_example(
    example: &str,
    validator: Option<&jsonschema::Validator>,
) -> Result<(), CatalogError> {
    if example.len() > MAX_EXAMPLE_BYTES {
        return Err(CatalogError::Invalid(format!(
            "example is {} bytes; at most {MAX_EXAMPLE_BYTES} are kept",
            example.len()
        )));
    }
    let value: Value = serde_json::from_str(example)
        .map_err(|e| CatalogError::Invalid(format!("example is not JSON: {e}")))?;
    if let Some(v) = validator
        && let Some(problem) = violation(v, &value, "example")
    {
        return Err(CatalogError::Invalid(format!(
            "the example does not match the schema: {problem}"
        )));
    }
    Ok(())
}

/// An event type's fields as every door gives them.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    pub description: Option<String>,
    pub schema: Option<Value>,
    /// the exact text
    pub example: Option<String>,
    pub deprecated: bool,
    pub deprecation_note: Option<String>,
}

impl Fields {
    /// The rules of every door: bounded texts, a schema that compiles, an example that is
    /// JSON and matches it.
    pub fn check(&self) -> Result<(), CatalogError> {
        check_text("description", self.description.as_deref())?;
        check_text("deprecationNote", self.deprecation_note.as_deref())?;
        let validator = self.schema.as_ref().map(check_schema).transpose()?;
        if let Some(e) = &self.example {
            check_example(e, validator.as_ref())?;
        }
        Ok(())
    }

    /// [`Fields::check`] on a blocking thread, at most one per core at a time in the
    /// process: compiling a schema and checking an example against it can take seconds of
    /// CPU, which must not stop the runtime's workers (the hostile review: `/healthz` took
    /// 7.4 s behind two such writes).
    pub async fn check_off_runtime(&self) -> Result<(), CatalogError> {
        static WRITES: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
            std::sync::LazyLock::new(|| {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                Arc::new(tokio::sync::Semaphore::new(cores))
            });
        let permit = WRITES
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| CatalogError::Invalid(e.to_string()))?;
        let fields = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            fields.check()
        })
        .await
        .map_err(|e| CatalogError::Invalid(format!("the schema check failed: {e}")))?
    }

    fn as_row(&self) -> rows::EventTypeFields<'_> {
        rows::EventTypeFields {
            description: self.description.as_deref(),
            schema: self.schema.as_ref(),
            example: self.example.as_deref(),
            deprecated: self.deprecated,
            deprecation_note: self.deprecation_note.as_deref(),
        }
    }
}

/// Creates an event type of `tenant` through the API.
pub async fn create(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    f: &Fields,
) -> Result<rows::EventTypeRow, CatalogError> {
    validate_name(name)?;
    f.check_off_runtime().await?;
    let mut tx = db::begin(pool).await?;
    if rows::lock_and_count(&mut tx, tenant).await? >= MAX_EVENT_TYPES_PER_TENANT {
        return Err(CatalogError::TenantLimit {
            tenant: tenant.to_string(),
            cap: MAX_EVENT_TYPES_PER_TENANT,
        });
    }
    let row = rows::insert(&mut tx, tenant, name, &f.as_row())
        .await?
        .ok_or_else(|| CatalogError::Exists(name.to_string()))?;
    tx.commit().await.map_err(DbError::from)?;
    Ok(row)
}

/// Applies a change to the API's event type `name` of `tenant` with the rules of
/// [`create`], checked against the type as it is after the change (an example kept must
/// match a new schema); `None` when there is no such type.
pub async fn change(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    p: rows::EventTypePatch,
) -> Result<Option<rows::EventTypeRow>, CatalogError> {
    let mut tx = db::begin(pool).await?;
    let Some(current) = rows::get_for_update(&mut tx, tenant, name).await? else {
        return Ok(None);
    };
    if current.managed_by == ManagedBy::Kubernetes {
        return Err(CatalogError::ManagedByKubernetes(current.name));
    }
    let after = Fields {
        description: p.description.clone().unwrap_or(current.description),
        schema: p
            .schema
            .clone()
            .unwrap_or_else(|| current.schema.map(|s| s.0)),
        example: p.example.clone().unwrap_or(current.example),
        deprecated: p.deprecated.unwrap_or(current.deprecated),
        deprecation_note: p
            .deprecation_note
            .clone()
            .unwrap_or(current.deprecation_note),
    };
    after.check_off_runtime().await?;
    let row = rows::patch(&mut tx, tenant, name, &p).await?;
    tx.commit().await.map_err(DbError::from)?;
    Ok(row)
}

/// Deletes the API's event type `name` of `tenant`; false when there is none. A declared
/// one is its object's to delete.
pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, CatalogError> {
    if rows::delete(pool, tenant, name).await? {
        return Ok(true);
    }
    match rows::get(pool, tenant, name).await? {
        Some(t) if t.managed_by == ManagedBy::Kubernetes => {
            Err(CatalogError::ManagedByKubernetes(t.name))
        }
        _ => Ok(false),
    }
}

/// A WebhookEventType object as the catalog rules judge it.
#[derive(Debug, Clone)]
pub struct Declared<'a> {
    pub namespace: &'a str,
    /// the object's name
    pub object: &'a str,
    pub tenant: &'a str,
    /// the event type: `spec.name`, or the object's name
    pub name: &'a str,
    pub fields: Fields,
}

/// The catalog rules for a declared type, every field; the message names the field.
pub fn validate_declared(d: &Declared<'_>) -> Result<(), CatalogError> {
    validate_owner_and_name(d)?;
    d.fields.check()
}

fn validate_owner_and_name(d: &Declared<'_>) -> Result<(), CatalogError> {
    crate::domain::validate_tenant(d.tenant).map_err(CatalogError::Invalid)?;
    validate_name(d.name)
}

/// Writes a declared type in the caller's transaction (the controller's, or `hookd
/// apply`'s for a whole file).
pub async fn apply_declared(
    conn: &mut sqlx::PgConnection,
    d: &Declared<'_>,
) -> Result<rows::DeclaredWrite, CatalogError> {
    // the rules of validate_declared, the schema's off the runtime's workers
    validate_owner_and_name(d)?;
    d.fields.check_off_runtime().await?;
    Ok(rows::write_declared(
        conn,
        d.namespace,
        d.object,
        d.tenant,
        d.name,
        &d.fields.as_row(),
        MAX_EVENT_TYPES_PER_TENANT,
    )
    .await?)
}

/// Deletes a declared type in the caller's transaction; its (tenant, name), when there was
/// one.
pub async fn remove_declared(
    conn: &mut sqlx::PgConnection,
    namespace: &str,
    object: &str,
) -> Result<Option<(String, String)>, CatalogError> {
    Ok(rows::delete_declared(conn, namespace, object).await?)
}

// ---- validation at enqueue ----

/// The compiled schemas of one API process, by (tenant, type) and the version they were
/// compiled from: a message is checked with what its type says now (its version is read
/// with every check), and a schema is compiled once per version, not per message.
/// A compiled schema by (tenant, type), with the version it was compiled from.
type Compiled = HashMap<(String, String), (i64, Arc<jsonschema::Validator>)>;

#[derive(Clone)]
pub struct SchemaCache {
    compiled: Arc<Mutex<Compiled>>,
    /// schemas compiled since the process started (each is a miss)
    compiles: Arc<std::sync::atomic::AtomicU64>,
    /// Checks of payloads run on blocking threads, at most half the cores at once: a schema
    /// is the tenant's to write, and one whose check of a payload is costly (alternatives
    /// nested over a deep payload) must neither stall the runtime's workers nor take every
    /// core from the other requests.
    checking: Arc<tokio::sync::Semaphore>,
}

impl Default for SchemaCache {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        SchemaCache {
            compiled: Arc::default(),
            compiles: Arc::default(),
            checking: Arc::new(tokio::sync::Semaphore::new((cores / 2).max(1))),
        }
    }
}

impl SchemaCache {
    fn get(&self, tenant: &str, name: &str, version: i64) -> Option<Arc<jsonschema::Validator>> {
        let compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        compiled
            .get(&(tenant.to_string(), name.to_string()))
            .filter(|(v, _)| *v == version)
            .map(|(_, c)| c.clone())
    }

    fn put(&self, tenant: &str, name: &str, version: i64, validator: Arc<jsonschema::Validator>) {
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        let key = (tenant.to_string(), name.to_string());
        if !compiled.contains_key(&key)
            && compiled.len() >= CACHED_SCHEMAS
            && let Some(evicted) = compiled.keys().next().cloned()
        {
            compiled.remove(&evicted);
        }
        compiled.insert(key, (version, validator));
    }

    /// How many schemas this cache compiled: one per (type, version) it met, unless it
    /// had to drop one past [`CACHED_SCHEMAS`].
    pub fn compiles(&self) -> u64 {
        self.compiles.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many schemas are kept.
    pub fn len(&self) -> usize {
        self.compiled.lock().map(|c| c.len()).unwrap_or_default()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One message to check: its index in the request, tenant, type and payload text.
#[derive(Debug, Clone, Copy)]
pub struct ToCheck<'a> {
    pub index: usize,
    pub tenant: &'a str,
    pub event_type: &'a str,
    pub payload: &'a str,
}

/// Why a message was refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("event type {event_type:?} is not in tenant {tenant:?}'s catalog")]
    Unknown {
        index: usize,
        tenant: String,
        event_type: String,
    },
    #[error("{message}")]
    Violation { index: usize, message: String },
    /// the check itself failed (its thread panicked): nothing was written
    #[error("the schema check failed: {0}")]
    Internal(String),
    /// the stored schema no longer compiles (a later hookd reads it differently)
    #[error("the schema of event type {event_type:?} does not compile: {problem}")]
    BrokenSchema {
        index: usize,
        event_type: String,
        problem: String,
    },
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A checked message whose type is deprecated: still taken, and the producer is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecated {
    pub index: usize,
    pub event_type: String,
    pub note: Option<String>,
}

/// Checks messages against the catalog: each type must be declared, and a payload must
/// match its type's schema. One statement per tenant reads the types' versions; a schema
/// is read and compiled only when this process has not compiled that version. The first
/// refusal is returned (nothing of the request is written); otherwise the deprecated
/// types among them.
pub async fn check(
    pool: &PgPool,
    cache: &SchemaCache,
    messages: &[ToCheck<'_>],
) -> Result<Vec<Deprecated>, CheckError> {
    let mut deprecated = Vec::new();
    // (index, its type's schema, the payload): checked together once every type is known
    let mut payloads: Vec<(usize, Arc<jsonschema::Validator>, String)> = Vec::new();
    let mut tenants: Vec<&str> = messages.iter().map(|m| m.tenant).collect();
    tenants.sort_unstable();
    tenants.dedup();
    for tenant in tenants {
        let of_tenant: Vec<&ToCheck<'_>> = messages.iter().filter(|m| m.tenant == tenant).collect();
        let mut names: Vec<&str> = of_tenant.iter().map(|m| m.event_type).collect();
        names.sort_unstable();
        names.dedup();
        let declared = rows::declared(pool, tenant, &names).await?;
        let found = |name: &str| declared.iter().find(|d| d.name == name);
        // compile what this process lacks, once per type
        let mut validators: HashMap<&str, Arc<jsonschema::Validator>> = HashMap::new();
        let mut missing = Vec::new();
        for d in declared.iter().filter(|d| d.has_schema) {
            match cache.get(tenant, &d.name, d.version) {
                Some(v) => {
                    validators.insert(d.name.as_str(), v);
                }
                None => missing.push(d.name.as_str()),
            }
        }
        let mut broken: HashMap<String, String> = HashMap::new();
        if !missing.is_empty() {
            let stored = rows::schemas(pool, tenant, &missing).await?;
            // compiled on a blocking thread: a large schema takes milliseconds of CPU each
            // (the hostile review cycled 300 of 62 KB through one process)
            let compiled = tokio::task::spawn_blocking(move || {
                stored
                    .into_iter()
                    .map(|(name, version, schema)| (name, version, compile(&schema.0)))
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| CheckError::Internal(e.to_string()))?;
            for (name, version, result) in compiled {
                cache
                    .compiles
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match result {
                    Ok(v) => cache.put(tenant, &name, version, Arc::new(v)),
                    Err(problem) => {
                        tracing::error!(%tenant, event_type = %name, %problem, "a stored event-type schema does not compile");
                        broken.insert(name, problem);
                    }
                }
            }
            for d in declared.iter().filter(|d| d.has_schema) {
                if let Some(v) = cache.get(tenant, &d.name, d.version) {
                    validators.insert(d.name.as_str(), v);
                }
            }
        }
        for m in of_tenant {
            let Some(d) = found(m.event_type) else {
                return Err(CheckError::Unknown {
                    index: m.index,
                    tenant: tenant.to_string(),
                    event_type: m.event_type.to_string(),
                });
            };
            if let Some(problem) = broken.get(m.event_type) {
                return Err(CheckError::BrokenSchema {
                    index: m.index,
                    event_type: m.event_type.to_string(),
                    problem: problem.clone(),
                });
            }
            // a schema changed between the two reads is checked at its newer version
            // next time; this message is checked with the one compiled
            if let Some(v) = validators.get(m.event_type) {
                payloads.push((m.index, v.clone(), m.payload.to_string()));
            }
            if d.deprecated {
                deprecated.push(Deprecated {
                    index: m.index,
                    event_type: m.event_type.to_string(),
                    note: d.deprecation_note.clone(),
                });
            }
        }
    }
    if !payloads.is_empty() {
        check_payloads(cache, payloads).await?;
    }
    deprecated.sort_by_key(|d| d.index);
    Ok(deprecated)
}

/// Checks payloads against their schemas on a blocking thread, within the process's share
/// ([`SchemaCache`]`::checking`); the first that fails, in request order, is the refusal.
async fn check_payloads(
    cache: &SchemaCache,
    mut payloads: Vec<(usize, Arc<jsonschema::Validator>, String)>,
) -> Result<(), CheckError> {
    payloads.sort_by_key(|p| p.0);
    let permit = cache
        .checking
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| CheckError::Internal(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        for (index, validator, payload) in payloads {
            // the payload was checked to be JSON on the way in
            let value: Value =
                serde_json::from_str(&payload).map_err(|e| CheckError::Violation {
                    index,
                    message: format!("payload is not JSON: {e}"),
                })?;
            if let Some(message) = violation(&validator, &value, "payload") {
                return Err(CheckError::Violation { index, message });
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| CheckError::Internal(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Only the first error is built: against a chain of `anyOf`s, collecting every error
    /// of every item took 280 KB per item (the hostile review). The first failing item is
    /// named.
    #[test]
    fn a_violation_is_the_first_error_only() {
        let mut defs = serde_json::Map::new();
        for i in 0..8 {
            let next = format!("#/$defs/l{}", i + 1);
            defs.insert(
                format!("l{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next, "maxLength": 3}]}),
            );
        }
        defs.insert("l8".into(), json!({"type": "string"}));
        let schema = json!({"$defs": defs, "type": "array", "items": {"$ref": "#/$defs/l0"}});
        let v = check_schema(&schema).unwrap();
        let items: Vec<Value> = (0..2000).map(|_| json!(5)).collect();
        let message = violation(&v, &Value::Array(items), "payload").unwrap();
        assert!(message.starts_with("payload/0: "), "{message}");
        assert!(!message.contains("more)"), "{message}");
    }

    #[test]
    fn a_violation_names_the_json_pointer_of_what_failed() {
        let v = compile(&json!({
            "type": "object",
            "required": ["amount"],
            "properties": {"amount": {"type": "integer"}, "lines": {"type": "array", "items": {"type": "string"}}}
        }))
        .unwrap();
        assert_eq!(
            violation(&v, &json!({"amount": "x"}), "payload").unwrap(),
            r#"payload/amount: "x" is not of type "integer""#
        );
        let m = violation(&v, &json!({"amount": 1, "lines": ["a", 2, 3]}), "payload").unwrap();
        assert_eq!(m, r#"payload/lines/1: 2 is not of type "string""#);
        assert!(violation(&v, &json!({"amount": 1}), "payload").is_none());
    }

    #[test]
    fn schemas_that_do_not_compile_or_reach_out_are_refused() {
        assert!(compile(&json!({"type": "nonsense"})).is_err());
        assert!(compile(&json!({"$ref": "https://example.com/s.json"})).is_err());
        assert!(compile(&json!({"pattern": "(?=lookahead)"})).is_err());
        assert!(check_schema(&json!(true)).is_err());
        assert!(
            compile(&json!({"type": "object", "properties": {"id": {"pattern": "^[a-z]+$"}}}))
                .is_ok()
        );
    }

    /// Schemas whose check of a wrong payload would take exponential time are refused at
    /// the write: recursion through `$ref`, and references reused until they stand for more
    /// than [`MAX_EXPANDED_SUBSCHEMAS`] subschemas. Reuse within the bound is fine.
    #[test]
    fn schemas_whose_check_could_take_exponential_time_are_refused() {
        let branches: Vec<Value> = (0..8)
            .map(|_| json!({"items": {"$ref": "#/$defs/a"}}))
            .collect();
        let recursive =
            json!({"$defs": {"a": {"anyOf": branches, "type": "array"}}, "$ref": "#/$defs/a"});
        let e = expanded_size(&recursive).unwrap_err();
        assert!(e.contains("leads back to itself"), "{e}");
        assert!(check_schema(&json!({"items": {"$ref": "#"}})).is_err());

        // no recursion, but each level refers to the next twice: 2^20 paths
        let mut defs = serde_json::Map::new();
        for i in 0..20 {
            let next = format!("#/$defs/l{}", i + 1);
            defs.insert(
                format!("l{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next, "minimum": 1}]}),
            );
        }
        defs.insert("l20".into(), json!({"type": "string"}));
        let dag = json!({"$defs": defs, "$ref": "#/$defs/l0"});
        let e = expanded_size(&dag).unwrap_err();
        assert!(e.contains("10000 subschemas"), "{e}");

        // (the hostile review) a property named like a data keyword is a subschema: the
        // recursion inside it is found
        for name in ["enum", "const", "default", "examples"] {
            let hidden = json!({"type": "object", "properties": {name: {
                "type": "array",
                "anyOf": [{"items": {"$ref": format!("#/properties/{name}")}},
                          {"items": {"$ref": format!("#/properties/{name}")}}]}}});
            let e = expanded_size(&hidden).unwrap_err();
            assert!(e.contains("leads back to itself"), "{name}: {e}");
        }
        // and a subschema with its own base URI, which `#/...` would resolve against
        let scoped = json!({"$defs": {"r": {"type": "string"}}, "properties": {"x": {
            "$id": "https://x.example/sub",
            "$defs": {"r": {"anyOf": [{"items": {"$ref": "#/$defs/r"}}]}},
            "$ref": "#/$defs/r"}}});
        let e = expanded_size(&scoped).unwrap_err();
        assert!(e.contains("$id is only supported at the top"), "{e}");
        // a property named `id` or `$id` is a name, not a keyword
        assert!(
            expanded_size(&json!({"properties": {"id": {"type": "string"},
                                                     "$id": {"type": "string"}}}))
            .is_ok()
        );

        let reuse = json!({
            "$defs": {"money": {"type": "object", "required": ["amount", "currency"],
                                "properties": {"amount": {"type": "integer"}, "currency": {"enum": ["EUR", "USD"]}}}},
            "type": "object",
            "properties": {"total": {"$ref": "#/$defs/money"}, "tax": {"$ref": "#/$defs/money"}, "tip": {"$ref": "#/%24defs/money"}}
        });
        let n = expanded_size(&reuse).unwrap();
        assert!(n < 100, "{n}");
        assert!(check_schema(&reuse).is_ok());
        for bad in [
            json!({"$ref": "https://example.com/s.json"}),
            json!({"$ref": "#/$defs/missing"}),
            json!({"$dynamicRef": "#meta"}),
        ] {
            assert!(expanded_size(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn examples_are_json_and_match_the_schema() {
        let f = Fields {
            schema: Some(json!({"type": "object", "required": ["id"]})),
            example: Some(r#"{"other": 1}"#.into()),
            ..Fields::default()
        };
        let e = f.check().unwrap_err().to_string();
        assert!(e.contains("example") && e.contains("\"id\""), "{e}");
        let f = Fields {
            example: Some("{".into()),
            ..Fields::default()
        };
        assert!(f.check().is_err());
    }

    #[test]
    fn reserved_names_are_refused_and_listed_in_order() {
        assert!(matches!(
            validate_name("hookd.endpoint.disabled"),
            Err(CatalogError::Reserved(_))
        ));
        assert!(matches!(
            validate_name("HOOKD.x"),
            Err(CatalogError::Reserved(_))
        ));
        assert!(matches!(
            validate_name("a..b"),
            Err(CatalogError::InvalidName(_))
        ));
        assert!(validate_name("invoice.paid").is_ok());
        let names: Vec<&str> = RESERVED.iter().map(|r| r.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        for r in RESERVED {
            serde_json::from_str::<Value>(r.example).unwrap();
            assert!(crate::domain::is_reserved_event_type(r.name));
        }
    }
}
