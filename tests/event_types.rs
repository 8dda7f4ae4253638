//! The event-type catalog (issue 34, item 3): `/v1/event-types` through the real API with
//! real tokens (a tenant's, a read-only one, a consumer's), messages checked against it at
//! enqueue (`"validate": true`), its bounds, hookd's reserved types, two API processes
//! sharing one catalog, and `hookd apply -f` / `hookd delete -f` of a WebhookEventType run
//! as the real binary.

use crate::common;

use axum::http::StatusCode;
use common::*;
use hookd::auth::Scope;
use reqwest::Method;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const TENANT: &str = DEFAULT_TENANT;

fn invoice_schema() -> Value {
    json!({
        "type": "object",
        "required": ["invoice", "amount"],
        "properties": {
            "invoice": {"type": "string", "pattern": "^in_[a-z0-9]+$"},
            "amount": {"type": "integer", "minimum": 0}
        }
    })
}

async fn events(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn declare(api: &TestApi, token: &str, body: Value) -> Value {
    let (s, v) = call(api, token, Method::POST, "/v1/event-types", Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

async fn send_message(api: &TestApi, token: &str, body: Value) -> (StatusCode, Value) {
    call(api, token, Method::POST, "/v1/messages", Some(body)).await
}

#[sqlx::test]
async fn event_types_are_created_read_changed_and_deleted_through_the_api(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    // the example is kept byte for byte, as a payload is
    let body = format!(
        r#"{{"name":"invoice.paid","description":"An invoice was paid.","schema":{},"example":{{"invoice": "in_1",  "amount": 4200}}}}"#,
        invoice_schema()
    );
    let (s, created) = send(
        api.client
            .post(format!("{}/v1/event-types", api.base))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body.clone()),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    assert_eq!(created["name"], "invoice.paid");
    assert_eq!(created["managedBy"], "api");
    assert_eq!(created["deprecated"], false);
    assert_eq!(created["schema"], invoice_schema());
    assert!(created["createdAt"].is_string());
    let raw = api
        .client
        .get(format!("{}/v1/event-types/invoice.paid", api.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        raw.contains(r#""example":{"invoice": "in_1",  "amount": 4200}"#),
        "{raw}"
    );

    // a second declaration of the name is a conflict, not an overwrite
    let (s, e) = send(
        api.client
            .post(format!("{}/v1/event-types", api.base))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{e}");
    assert_eq!(e["error"]["code"], "event_type_exists");

    declare(&api, &token, json!({"name": "invoice.void", "deprecated": true, "deprecationNote": "use invoice.cancelled"})).await;
    // the list: by name, hookd's own operational types included for a tenant credential,
    // deprecated ones only when asked
    let (s, page) = call(&api, &token, Method::GET, "/v1/event-types", None).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    let names: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "hookd.endpoint.circuit_open",
            "hookd.endpoint.disabled",
            "hookd.endpoint.enabled",
            "hookd.endpoint.secret_unreadable",
            "invoice.paid"
        ]
    );
    assert_eq!(page["items"][1]["managedBy"], "hookd");
    let (_, page) = call(
        &api,
        &token,
        Method::GET,
        "/v1/event-types?includeDeprecated=true&limit=2&cursor=hookd.endpoint.secret_unreadable",
        None,
    )
    .await;
    let names: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["invoice.paid", "invoice.void"]);
    assert_eq!(page["nextCursor"], "invoice.void");

    // a change is checked as a whole: the kept example must match a new schema
    let (s, e) = call(
        &api,
        &token,
        Method::PATCH,
        "/v1/event-types/invoice.paid",
        Some(json!({"schema": {"type": "object", "required": ["customer"]}})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("example"),
        "{e}"
    );
    let (s, changed) = call(
        &api,
        &token,
        Method::PATCH,
        "/v1/event-types/invoice.paid",
        Some(json!({"description": "Paid in full.", "deprecated": true, "example": null})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{changed}");
    assert_eq!(changed["description"], "Paid in full.");
    assert_eq!(changed["deprecated"], true);
    assert!(changed["example"].is_null());
    assert_eq!(changed["schema"], invoice_schema(), "left as it was");

    let (s, _) = call(
        &api,
        &token,
        Method::DELETE,
        "/v1/event-types/invoice.paid",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, e) = call(
        &api,
        &token,
        Method::GET,
        "/v1/event-types/invoice.paid",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{e}");
    let (s, _) = call(
        &api,
        &token,
        Method::DELETE,
        "/v1/event-types/invoice.paid",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // another tenant sees none of them
    let other = api.token_for("team-b").await;
    let (s, _) = call(
        &api,
        &other,
        Method::GET,
        "/v1/event-types/invoice.void",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[sqlx::test]
async fn consumer_and_read_tokens_read_the_catalog_and_cannot_change_it(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    declare(
        &api,
        &token,
        json!({"name": "invoice.paid", "schema": invoice_schema()}),
    )
    .await;
    let (s, v) = call(
        &api,
        &token,
        Method::PUT,
        "/v1/consumers/cust_42",
        Some(json!({})),
    )
    .await;
    assert!(s.is_success(), "{v}");
    let (s, t) = call(
        &api,
        &token,
        Method::POST,
        "/v1/consumers/cust_42/tokens",
        Some(json!({"ttlSeconds": 600})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let consumer = t["token"].as_str().unwrap().to_string();
    let reader = mint_token(&pool, TENANT, &[Scope::Read]).await;

    for t in [&consumer, &reader] {
        let (s, one) = call(&api, t, Method::GET, "/v1/event-types/invoice.paid", None).await;
        assert_eq!(s, StatusCode::OK, "{one}");
        assert_eq!(one["schema"], invoice_schema());
        let (s, page) = call(&api, t, Method::GET, "/v1/event-types", None).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        assert!(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == "invoice.paid")
        );
    }
    // a customer's endpoints never receive hookd's own events, so it is not shown them
    let (_, page) = call(&api, &consumer, Method::GET, "/v1/event-types", None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    let (s, _) = call(
        &api,
        &consumer,
        Method::GET,
        "/v1/event-types/hookd.endpoint.disabled",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (s, e) = call(
        &api,
        &consumer,
        Method::POST,
        "/v1/event-types",
        Some(json!({"name": "x.y"})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("consumer_token"))
    );
    let (s, e) = call(
        &api,
        &consumer,
        Method::PATCH,
        "/v1/event-types/invoice.paid",
        Some(json!({"deprecated": true})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("consumer_token"))
    );
    let (s, e) = call(
        &api,
        &consumer,
        Method::DELETE,
        "/v1/event-types/invoice.paid",
        None,
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("consumer_token"))
    );
    let (s, e) = call(
        &api,
        &reader,
        Method::POST,
        "/v1/event-types",
        Some(json!({"name": "x.y"})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("insufficient_scope"))
    );
    let (_, one) = call(
        &api,
        &token,
        Method::GET,
        "/v1/event-types/invoice.paid",
        None,
    )
    .await;
    assert_eq!(one["deprecated"], false, "nothing was changed");
}

#[sqlx::test]
async fn a_validated_message_that_breaks_its_schema_is_refused_naming_the_path_and_nothing_is_written(
    pool: PgPool,
) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    declare(
        &api,
        &token,
        json!({"name": "invoice.paid", "schema": invoice_schema()}),
    )
    .await;
    declare(&api, &token, json!({"name": "invoice.note"})).await;

    let (s, e) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "validate": true, "payload": {"invoice": "in_1", "amount": "x"}}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"]["code"], "schema_violation");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(r#"payload/amount: "x" is not of type "integer""#),
        "{message}"
    );
    let (s, e) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "validate": true, "payload": {"amount": 1}}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains(r#""invoice" is a required property"#),
        "{e}"
    );
    let (s, e) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.refunded", "validate": true, "payload": {}}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"]["code"], "unknown_event_type");
    // a batch is all or nothing: the second message's path is named, the first is not written
    let (s, e) = call(
        &api,
        &token,
        Method::POST,
        "/v1/messages/batch",
        Some(json!({"messages": [
            {"eventType": "invoice.paid", "validate": true, "payload": {"invoice": "in_1", "amount": 1}},
            {"eventType": "invoice.paid", "validate": true, "payload": {"invoice": "IN-2", "amount": 1}}
        ]})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages[1]: payload/invoice: "),
        "{e}"
    );
    assert_eq!(
        events(&pool).await,
        0,
        "nothing of a refused request is written"
    );

    // what matches is taken; a type without a schema only has to be declared; without
    // validate nothing is checked, as before
    let (s, v) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "validate": true, "payload": {"invoice": "in_1", "amount": 4200}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.note", "validate": true, "payload": [1, "anything"]}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "payload": {"amount": "x"}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(events(&pool).await, 3);
}

#[sqlx::test]
async fn a_deprecated_type_is_taken_with_a_warning(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    declare(&api, &token, json!({"name": "invoice.void", "deprecated": true, "deprecationNote": "use invoice.cancelled"})).await;
    let r = api
        .client
        .post(format!("{}/v1/messages", api.base))
        .bearer_auth(&token)
        .json(&json!({"eventType": "invoice.void", "validate": true, "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let warning = r.headers().get("warning").unwrap().to_str().unwrap();
    assert_eq!(
        warning,
        r#"299 - "event type invoice.void is deprecated: use invoice.cancelled""#
    );
}

#[sqlx::test]
async fn schemas_that_do_not_compile_and_oversized_fields_are_refused(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let refused = |body: Value, code: &'static str, needle: &'static str| {
        let api = &api;
        let token = &token;
        async move {
            let (s, e) = call(api, token, Method::POST, "/v1/event-types", Some(body)).await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
            assert_eq!(e["error"]["code"], code, "{e}");
            let m = e["error"]["message"].as_str().unwrap();
            assert!(m.contains(needle), "{m} should say {needle}");
        }
    };
    refused(
        json!({"name": "a.b", "schema": {"type": "nonsense"}}),
        "invalid_schema",
        "nonsense",
    )
    .await;
    // nothing is fetched from elsewhere, at a write or at an enqueue
    refused(
        json!({"name": "a.b", "schema": {"$ref": "https://schemas.example.com/a.json"}}),
        "invalid_schema",
        "schema",
    )
    .await;
    // a schema whose check of a wrong payload could take exponential time (alternatives over
    // a recursive $ref) is refused at once, not found out at enqueue
    let started = std::time::Instant::now();
    refused(
        json!({"name": "a.b", "schema": {"$defs": {"a": {"type": "array", "anyOf": [
            {"items": {"$ref": "#/$defs/a"}}, {"items": {"$ref": "#/$defs/a"}, "minItems": 1}
        ]}}, "$ref": "#/$defs/a"}}),
        "invalid_schema",
        "recursive",
    )
    .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    refused(
        json!({"name": "a.b", "schema": "string"}),
        "invalid_schema",
        "object",
    )
    .await;
    refused(
        json!({"name": "a.b", "schema": {"type": "object", "required": ["id"]}, "example": {"other": 1}}),
        "invalid_field",
        "\"id\" is a required property",
    )
    .await;
    let big: serde_json::Map<String, Value> = (0..3000)
        .map(|i| (format!("field_{i:05}"), json!({"type": "string"})))
        .collect();
    refused(
        json!({"name": "a.b", "schema": {"type": "object", "properties": big}}),
        "invalid_schema",
        "65536",
    )
    .await;
    refused(
        json!({"name": "a.b", "example": {"text": "x".repeat(70_000)}}),
        "invalid_field",
        "65536",
    )
    .await;
    refused(
        json!({"name": "a.b", "description": "d".repeat(1001)}),
        "invalid_field",
        "1000",
    )
    .await;
    refused(json!({"name": "a..b"}), "invalid_event_type", "a..b").await;
    let (s, _) = call(&api, &token, Method::GET, "/v1/event-types/a.b", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing was stored");

    // a tenant's catalog is bounded: 1,000 types
    sqlx::query(
        "INSERT INTO hookd.event_types (tenant, name)
         SELECT $1, 'bulk.t' || i FROM generate_series(1, 999) i",
    )
    .bind(TENANT)
    .execute(&pool)
    .await
    .unwrap();
    declare(&api, &token, json!({"name": "the.last"})).await;
    refused(
        json!({"name": "one.more"}),
        "tenant_event_type_limit",
        "1000",
    )
    .await;
    // another tenant has its own
    let other = api.token_for("team-b").await;
    declare(&api, &other, json!({"name": "one.more"})).await;
}

#[sqlx::test]
async fn reserved_types_are_listed_read_only_and_cannot_be_declared(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    for name in ["hookd.endpoint.disabled", "hookd.mine", "HOOKD.x", "hookd"] {
        let (s, e) = call(
            &api,
            &token,
            Method::POST,
            "/v1/event-types",
            Some(json!({"name": name})),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {e}");
        assert_eq!(e["error"]["code"], "reserved_event_type", "{name}: {e}");
    }
    let (s, t) = call(
        &api,
        &token,
        Method::GET,
        "/v1/event-types/hookd.endpoint.disabled",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{t}");
    assert_eq!(t["managedBy"], "hookd");
    assert_eq!(t["example"]["type"], "hookd.endpoint.disabled");
    for method in [Method::PATCH, Method::DELETE] {
        let body = (method == Method::PATCH).then(|| json!({"deprecated": true}));
        let (s, e) = call(
            &api,
            &token,
            method,
            "/v1/event-types/hookd.endpoint.disabled",
            body,
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
        assert_eq!(e["error"]["code"], "reserved_event_type");
    }
    // and no other door stores one either
    let r =
        sqlx::query("INSERT INTO hookd.event_types (tenant, name) VALUES ('t', 'Hookd.Sneaky')")
            .execute(&pool)
            .await;
    assert!(r.is_err(), "migration 0033's CHECK");
}

/// Two API processes share the catalog: a schema changed through one is what the other
/// checks the very next message against, though it compiled (and kept) the old one.
#[sqlx::test]
async fn a_changed_schema_takes_effect_for_the_next_message_in_every_api_process(pool: PgPool) {
    let first = TestApi::start(&pool).await;
    let second = TestApi::start(&pool).await;
    let token = first.token_for(TENANT).await;
    declare(&first, &token, json!({"name": "order.placed", "schema": {"type": "object", "properties": {"id": {"type": "integer"}}}})).await;
    let numeric = json!({"eventType": "order.placed", "validate": true, "payload": {"id": 7}});
    let textual = json!({"eventType": "order.placed", "validate": true, "payload": {"id": "o_7"}});
    for _ in 0..3 {
        let (s, v) = send_message(&second, &token, numeric.clone()).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let (s, _) = send_message(&second, &token, textual.clone()).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);

    let (s, v) = call(
        &first,
        &token,
        Method::PATCH,
        "/v1/event-types/order.placed",
        Some(json!({"schema": {"type": "object", "properties": {"id": {"type": "string"}}}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, e) = send_message(&second, &token, numeric.clone()).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("payload/id: 7 is not of type \"string\""),
        "{e}"
    );
    let (s, v) = send_message(&second, &token, textual).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // a schema removed: only the type's existence is checked
    let (s, _) = call(
        &first,
        &token,
        Method::PATCH,
        "/v1/event-types/order.placed",
        Some(json!({"schema": null})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = send_message(&second, &token, numeric).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// The check at enqueue compiles a schema once per version and process, not per message,
/// and reads a type's current version with every check.
#[sqlx::test]
async fn a_schema_is_compiled_once_per_version_not_per_message(pool: PgPool) {
    use hookd::catalog::{SchemaCache, ToCheck, check};
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    declare(
        &api,
        &token,
        json!({"name": "a.b", "schema": {"type": "object", "required": ["id"]}}),
    )
    .await;
    declare(&api, &token, json!({"name": "a.c"})).await;
    let cache = SchemaCache::default();
    let ok = |t: &'static str| ToCheck {
        index: 0,
        tenant: TENANT,
        event_type: t,
        payload: r#"{"id": 1}"#,
    };
    for _ in 0..50 {
        check(&pool, &cache, &[ok("a.b"), ok("a.c")]).await.unwrap();
    }
    assert_eq!((cache.compiles(), cache.len()), (1, 1));
    let (s, _) = call(
        &api,
        &token,
        Method::PATCH,
        "/v1/event-types/a.b",
        Some(json!({"schema": {"type": "object", "required": ["name"]}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let refused = check(&pool, &cache, &[ok("a.b")]).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains(r#""name" is a required property"#),
        "{refused}"
    );
    check(&pool, &cache, &[ok("a.c")]).await.unwrap();
    assert_eq!(
        (cache.compiles(), cache.len()),
        (2, 1),
        "the new version replaced the old"
    );
    // an operator's own UPDATE moves the version too (the trigger of migration 0033): the
    // kept schema is not served stale
    sqlx::query(
        r#"UPDATE hookd.event_types SET schema = '{"type": "object", "required": ["id"]}'
           WHERE name = 'a.b'"#,
    )
    .execute(&pool)
    .await
    .unwrap();
    check(&pool, &cache, &[ok("a.b")]).await.unwrap();
    assert_eq!(cache.compiles(), 3);
}

struct YamlFile(std::path::PathBuf);

impl YamlFile {
    fn new(text: &str) -> YamlFile {
        let path = std::env::temp_dir().join(format!("hookd-et-{}.yaml", Uuid::now_v7().simple()));
        std::fs::write(&path, text).unwrap();
        YamlFile(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for YamlFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn hookd(pool: &PgPool, verb: &str, file: &YamlFile) -> (bool, String) {
    let out = HookdCommand::new([verb, "-f", file.path()])
        .database(pool)
        .test_key()
        .env("HOOKD_LOG", "warn")
        .run()
        .await;
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

const DECLARED: &str = r#"apiVersion: hookd.dev/v1alpha1
kind: WebhookEventType
metadata:
  name: invoice-paid
  namespace: team-a
spec:
  name: invoice.paid
  description: An invoice was paid in full.
  schema:
    type: object
    required: [invoice, amount]
    properties:
      invoice: {type: string}
      amount: {type: integer, minimum: 0}
  example:
    invoice: in_1
    amount: 4200
"#;

#[sqlx::test]
async fn a_webhook_event_type_applied_with_hookd_apply_is_in_the_catalog_and_read_only(
    pool: PgPool,
) {
    let file = YamlFile::new(DECLARED);
    let (ok, out) = hookd(&pool, "apply", &file).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("webhookeventtype/team-a/invoice-paid created (event type invoice.paid)"),
        "{out}"
    );
    let (ok, out) = hookd(&pool, "apply", &file).await;
    assert!(ok && out.contains("unchanged"), "{out}");

    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, t) = call(
        &api,
        &token,
        Method::GET,
        "/v1/event-types/invoice.paid",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{t}");
    assert_eq!(t["managedBy"], "kubernetes");
    assert_eq!(t["example"], json!({"invoice": "in_1", "amount": 4200}));
    let (s, e) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "validate": true, "payload": {"invoice": "in_1", "amount": -1}}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("payload/amount: "),
        "{e}"
    );
    for (method, body) in [
        (Method::PATCH, Some(json!({"deprecated": true}))),
        (Method::DELETE, None),
    ] {
        let (s, e) = call(&api, &token, method, "/v1/event-types/invoice.paid", body).await;
        assert_eq!(s, StatusCode::CONFLICT, "{e}");
        assert_eq!(e["error"]["code"], "managed_by_kubernetes");
    }
    // the API's own name is not the object's to take
    declare(&api, &token, json!({"name": "invoice.sent"})).await;
    let taken = YamlFile::new(
        &DECLARED
            .replace("name: invoice.paid", "name: invoice.sent")
            .replace("name: invoice-paid", "name: invoice-sent"),
    );
    let (ok, out) = hookd(&pool, "apply", &taken).await;
    assert!(!ok && out.contains("invoice.sent"), "{out}");

    // a file the rules refuse is refused whole, before anything is written
    let bad = YamlFile::new(&DECLARED.replace("amount: 4200", "amount: \"lots\""));
    let (ok, out) = hookd(&pool, "apply", &bad).await;
    assert!(!ok, "{out}");
    assert!(out.contains("example") && out.contains("/amount"), "{out}");
    let reserved =
        YamlFile::new(&DECLARED.replace("name: invoice.paid", "name: hookd.endpoint.disabled"));
    let (ok, out) = hookd(&pool, "apply", &reserved).await;
    assert!(!ok && out.contains("reserved"), "{out}");

    let (ok, out) = hookd(&pool, "delete", &file).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("event type invoice.paid left tenant team-a's catalog"),
        "{out}"
    );
    let (s, _) = call(
        &api,
        &token,
        Method::GET,
        "/v1/event-types/invoice.paid",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// The README's YAML, examples/event-type.yaml, applies as it says, and checks what it says.
#[sqlx::test]
async fn the_example_event_type_applies_and_checks_payloads(pool: PgPool) {
    let example = YamlFile::new(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/event-type.yaml"
        ))
        .unwrap(),
    );
    let (ok, out) = hookd(&pool, "apply", &example).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("webhookeventtype/default/invoice-paid created (event type invoice.paid)"),
        "{out}"
    );
    let api = TestApi::start(&pool).await;
    let token = api.token_for("default").await;
    let (s, e) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "validate": true, "payload": {"invoice": "INV-1", "amount": 4200}}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(
        e["error"]["message"],
        r#"payload/invoice: "INV-1" does not match "^in_[A-Za-z0-9]+$"; nothing was written"#
    );
    let (s, v) = send_message(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "validate": true, "payload": {"invoice": "in_1", "amount": 4200}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// A customer picks event types from the catalog in the portal (a real `hookd dev` and a
/// real headless Chromium): the catalog's types are offered beside the free-text input with
/// their descriptions, a deprecated one is marked, an example and schema open on demand,
/// a pick goes into the text (typed patterns stay), and the edit form shows what is picked.
#[sqlx::test]
async fn a_customer_picks_event_types_from_the_catalog_in_the_portal(pool: PgPool) {
    use common::browser::{Browser, Hookd};
    let Some(b) = Browser::start().await else {
        return;
    };
    let hookd = Hookd::start(&pool, &[]).await;
    let admin = mint_token(&pool, TENANT, &[Scope::Read, Scope::Manage]).await;
    for body in [
        json!({"name": "invoice.paid", "description": "An invoice was paid in full.", "schema": invoice_schema(), "example": {"invoice": "in_1", "amount": 4200}}),
        json!({"name": "invoice.void", "description": "An invoice was voided.", "deprecated": true, "deprecationNote": "Use invoice.cancelled."}),
    ] {
        let (s, v) = hookd
            .call(&admin, Method::POST, "/v1/event-types", Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
    }
    let (s, portal) = hookd
        .call(
            &admin,
            Method::POST,
            "/v1/consumers/cust_42/portal",
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 201, "{portal}");
    let link = portal["url"].as_str().unwrap();
    let link = if link.starts_with('/') {
        format!("{}{link}", hookd.base)
    } else {
        link.to_string()
    };
    b.goto(&link).await;
    b.wait_for_text("#whoami", "cust_42").await;
    let paid = b
        .wait_for_text(
            "#catalog-new .catalog-type[data-type='invoice.paid']",
            "An invoice was paid in full.",
        )
        .await;
    assert!(!paid.contains("hookd.endpoint"), "{paid}");
    let void = b
        .wait_for_text(
            "#catalog-new .catalog-type[data-type='invoice.void']",
            "deprecated",
        )
        .await;
    assert!(void.contains("Use invoice.cancelled."), "{void}");
    let offered = b
        .js("return [...document.querySelectorAll('#catalog-new .catalog-type')].map(e => e.dataset.type)")
        .await;
    assert_eq!(
        offered,
        json!(["invoice.paid", "invoice.void"]),
        "a customer is not offered hookd's own types"
    );

    // the example and schema, behind a disclosure
    b.click("#catalog-new .catalog-type[data-type='invoice.paid'] summary")
        .await;
    let example = b
        .wait_for_text(
            "#catalog-new .catalog-type[data-type='invoice.paid'] pre.example",
            "in_1",
        )
        .await;
    assert!(example.contains("4200"), "{example}");
    let schema = b
        .text("#catalog-new .catalog-type[data-type='invoice.paid'] pre.schema")
        .await
        .unwrap();
    assert!(schema.contains("\"required\""), "{schema}");

    b.type_into("#new-url", "http://127.0.0.1:9/hooks").await;
    b.type_into("#new-types", "order.*").await;
    b.click("#catalog-new input[value='invoice.paid']").await;
    assert_eq!(
        b.js("return document.getElementById('new-types').value")
            .await,
        "order.*, invoice.paid"
    );
    b.screenshot("portal-catalog").await;
    b.click("#add-endpoint button[type=submit]").await;
    b.wait_for_text("#secret-value", "whsec_").await;
    b.wait_for_text("#endpoints .types", "order.*, invoice.paid")
        .await;

    // the edit form: what is subscribed is checked; unchecking takes it out
    b.click("#endpoints .endpoint button.edit-types").await;
    b.wait_for(".edit .catalog-type input[value='invoice.paid']")
        .await;
    assert!(wait_until(std::time::Duration::from_secs(5), || async {
        b.js("return document.querySelector(\".edit .catalog-type input[value='invoice.paid']\").checked").await == json!(true)
    })
    .await);
    b.click(".edit .catalog-type input[value='invoice.paid']")
        .await;
    b.click(".edit button[type=submit]").await;
    b.wait_for_text("#endpoints .types", "order.*").await;
    assert!(
        wait_until(std::time::Duration::from_secs(5), || async {
            b.text("#endpoints .types").await.as_deref() == Some("order.*")
        })
        .await
    );
    b.quit().await;
}

/// `spec.name` of a WebhookEventType: the CRD's CEL rule (what `kubectl apply` refuses) and
/// the catalog's rule (what the API and the controller refuse) give one verdict.
#[test]
fn the_crd_and_the_catalog_judge_event_type_names_alike() {
    for name in [
        "invoice.paid",
        "a",
        "user.created_v2",
        "Order-Shipped.x",
        "hookdx",
        "hookd-events.a",
        "hookd",
        "HOOKD",
        "hookd.endpoint.disabled",
        "Hookd.Mine",
        "a..b",
        ".a",
        "a.",
        "a b",
        "a.*",
    ] {
        let et: hookd::k8s::WebhookEventType = serde_json::from_value(json!({
            "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookEventType",
            "metadata": {"name": "x", "namespace": "team-a"},
            "spec": {"name": name},
        }))
        .unwrap();
        assert_eq!(
            et.validate_as_api_server().is_ok(),
            hookd::catalog::validate_name(name).is_ok(),
            "{name}"
        );
    }
}

/// An operator reads the catalog in the console (read-only): the tenant's types with their
/// descriptions, a deprecated one marked, hookd's own types among them, an example on demand.
#[sqlx::test]
async fn an_operator_reads_the_catalog_in_the_console(pool: PgPool) {
    use common::browser::{Browser, Hookd};
    let Some(b) = Browser::start().await else {
        return;
    };
    let hookd = Hookd::start(&pool, &[]).await;
    let admin = mint_token(&pool, TENANT, &[Scope::Read, Scope::Manage]).await;
    for body in [
        json!({"name": "invoice.paid", "description": "An invoice was paid in full.", "schema": invoice_schema(), "example": {"invoice": "in_1", "amount": 4200}}),
        json!({"name": "invoice.void", "deprecated": true, "deprecationNote": "Use invoice.cancelled."}),
    ] {
        let (s, v) = hookd
            .call(&admin, Method::POST, "/v1/event-types", Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
    }
    let reader = mint_token(&pool, TENANT, &[Scope::Read]).await;
    b.goto(&format!("{}/ui#token={reader}", hookd.base)).await;
    b.wait_for_text("#whoami", TENANT).await;
    b.click("#nav a[href='/ui/event-types']").await;
    let paid = b
        .wait_for_text(
            "tr.event-type[data-type='invoice.paid']",
            "An invoice was paid in full.",
        )
        .await;
    assert!(paid.contains("yes"), "has a schema: {paid}");
    let void = b
        .wait_for_text("tr.event-type[data-type='invoice.void']", "deprecated")
        .await;
    assert!(void.contains("Use invoice.cancelled."), "{void}");
    b.wait_for_text(
        "tr.event-type[data-type='hookd.endpoint.disabled']",
        "hookd",
    )
    .await;
    b.click("tr.event-type[data-type='invoice.paid'] summary")
        .await;
    b.wait_for_text(
        "tr.event-type[data-type='invoice.paid'] pre.example",
        "in_1",
    )
    .await;
    b.screenshot("console-event-types").await;
    b.quit().await;
}

/// The README's catalog block, run as written with `API` and `TOKEN` set as the guide sets
/// them: the type is declared, the two refusals and the taken message answer as shown, and
/// the catalog lists it.
#[sqlx::test]
async fn the_readmes_catalog_block_works_as_written(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for("default").await;
    let stdout = run_readme_block("tests/event_types.rs", &api, &token, None).await;
    for shown in [
        r#""name":"invoice.paid""#,
        r#"{"error":{"code":"schema_violation","message":"payload/amount: \"42.00\" is not of type \"integer\"; nothing was written"}}"#,
        r#""code":"unknown_event_type""#,
        r#""eventId":"#,
        r#""managedBy":"hookd""#,
    ] {
        assert!(stdout.contains(shown), "{shown} not in:\n{stdout}");
    }
    assert_eq!(
        events(&pool).await,
        1,
        "only the matching message was written"
    );
}

/// An example may be any JSON value, and the OpenAPI document says so (schemathesis found
/// `"example": [null, null]` taken and answered while the document promised an object).
#[sqlx::test]
async fn an_example_is_any_json_value_as_the_openapi_document_says(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let created = declare(
        &api,
        &token,
        json!({"name": "list.made", "example": [1, "two"]}),
    )
    .await;
    assert_eq!(created["example"], json!([1, "two"]));
    let openapi: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    for schema in ["EventTypeOut", "EventTypeIn", "EventTypePatchIn"] {
        let types = &openapi["components"]["schemas"][schema]["properties"]["example"]["type"];
        assert!(
            types
                .as_array()
                .is_some_and(|t| t.contains(&json!("array"))),
            "{schema}.example: {types}"
        );
    }
}
