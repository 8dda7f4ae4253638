//! The HTTP contract: every answer the server gives is one the OpenAPI document lists for
//! that operation. Schemathesis checks this from outside with generated input in CI; this
//! test does it in the suite, for every operation of the served document, with the hostile
//! shapes every route must answer (no or a bad credential, the wrong scope, ids that do not
//! exist or do not parse, bodies that are malformed, mistyped, of the wrong media type or
//! too large, nonsense query parameters, an oversized URL or header).

use std::collections::BTreeSet;

use crate::common::*;
use hookd::auth::Scope;
use reqwest::Method;
use serde_json::Value;
use sqlx::PgPool;

/// One request shape: what it changes from a well-formed call.
#[derive(Debug, Clone, Copy)]
enum Shape {
    NoToken,
    BadToken,
    WrongScope,
    Plain,
    UnknownIds,
    UnparsableIds,
    MalformedBody,
    ArrayBody,
    UnknownField,
    TextPlain,
    HugeBody,
    JunkQuery,
    LongUrl,
    HugeHeader,
}

const SHAPES: [Shape; 14] = [
    Shape::NoToken,
    Shape::BadToken,
    Shape::WrongScope,
    Shape::Plain,
    Shape::UnknownIds,
    Shape::UnparsableIds,
    Shape::MalformedBody,
    Shape::ArrayBody,
    Shape::UnknownField,
    Shape::TextPlain,
    Shape::HugeBody,
    Shape::JunkQuery,
    Shape::LongUrl,
    Shape::HugeHeader,
];

fn fill(path: &str, shape: Shape) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').unwrap() + open;
        let name = &rest[open + 1..close];
        out.push_str(match (name, shape) {
            (_, Shape::UnparsableIds) => "not%20an%20id",
            ("uid", _) => "contract-nobody",
            _ => "01890a5d-ac96-774b-b9aa-1e2f3a4b5c6d",
        });
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

#[sqlx::test]
async fn every_operation_answers_only_statuses_its_document_lists(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(DEFAULT_TENANT).await;
    // each route needs one scope; a token with only `produce` lacks it everywhere but the
    // ingest routes, which `read` lacks
    let produce_only = mint_token(&pool, DEFAULT_TENANT, &[Scope::Produce]).await;
    let read_only = mint_token(&pool, DEFAULT_TENANT, &[Scope::Read]).await;
    let doc: Value = api
        .client
        .get(format!("{}/openapi.json", api.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    let mut answered = 0;
    let mut problems = Vec::new();
    let mut seen_statuses = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let Ok(method) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            let documented: BTreeSet<u16> = op["responses"]
                .as_object()
                .unwrap()
                .keys()
                .filter_map(|k| k.parse().ok())
                .collect();
            let has_body = op.get("requestBody").is_some();
            for shape in SHAPES {
                let body_shape = matches!(
                    shape,
                    Shape::MalformedBody
                        | Shape::ArrayBody
                        | Shape::UnknownField
                        | Shape::TextPlain
                        | Shape::HugeBody
                );
                if body_shape && !has_body {
                    continue;
                }
                let mut url = format!("{}{}", api.base, fill(path, shape));
                match shape {
                    Shape::JunkQuery => url.push_str("?limit=abc&after=%00&status=nope&x=1"),
                    Shape::LongUrl => {
                        url.push_str("?pad=");
                        url.push_str(&"a".repeat(8 * 1024));
                    }
                    _ => {}
                }
                let mut req = api.client.request(method.clone(), &url);
                req = match shape {
                    Shape::NoToken => req,
                    Shape::BadToken => req.bearer_auth("hookd_not-a-real-token"),
                    Shape::WrongScope
                        if path.starts_with("/v1/messages") && method == Method::POST =>
                    {
                        req.bearer_auth(&read_only)
                    }
                    Shape::WrongScope => req.bearer_auth(&produce_only),
                    _ => req.bearer_auth(&token),
                };
                req = match shape {
                    Shape::MalformedBody => req
                        .header("content-type", "application/json")
                        .body("{\"a\":"),
                    Shape::ArrayBody => req.header("content-type", "application/json").body("[]"),
                    Shape::UnknownField => req
                        .header("content-type", "application/json")
                        .body(r#"{"contractUnknownField": 1}"#),
                    Shape::TextPlain => req.header("content-type", "text/plain").body("{}"),
                    Shape::HugeBody => req
                        .header("content-type", "application/json")
                        .body(format!(r#"{{"pad":"{}"}}"#, "a".repeat(12 << 20))),
                    Shape::HugeHeader => req.header("x-pad", "a".repeat(24 * 1024)),
                    _ if has_body => req.header("content-type", "application/json").body("{}"),
                    _ => req,
                };
                let status = match req.send().await {
                    Ok(r) => r.status().as_u16(),
                    // a server may close the connection on a body it will not read
                    Err(e) if matches!(shape, Shape::HugeBody) && !e.is_timeout() => continue,
                    Err(e) => panic!("{method} {path} {shape:?}: {}", e.without_url()),
                };
                answered += 1;
                seen_statuses.insert(status);
                if status >= 500 {
                    problems.push(format!("{method} {path} {shape:?}: answered {status}"));
                } else if !documented.contains(&status) {
                    problems.push(format!(
                        "{method} {path} {shape:?}: answered {status}, the document lists {documented:?}"
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {answered} answers disagree with the document:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // the shapes reached what they aim at
    for s in [400, 401, 403, 404, 413, 414, 415, 431] {
        assert!(
            seen_statuses.contains(&s),
            "no operation answered {s}: {seen_statuses:?}"
        );
    }
    assert!(answered > 300, "{answered} answers");
}
