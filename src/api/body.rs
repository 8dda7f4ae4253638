//! Request-body handling with JSON errors for every failure: wrong content type (415),
//! too large (413), not JSON (400), JSON of the wrong shape (422).

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use super::error::ApiError;

pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "content-type must be application/json, got {:?}",
                if ct.is_empty() { "(none)" } else { ct }
            ),
        ))
    }
}

/// Reads at most `limit` bytes; a larger body is refused without reading it all.
pub async fn read_limited(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body exceeds {limit} bytes"),
        )
    })
}

/// Parses a request body that must be a JSON object. serde's derived structs also accept
/// a JSON array of the field values in order, which would make `[null,"invoice.paid",{}]`
/// a message; a non-object body is refused with 400 before serde sees it.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if let Some(b) = first.filter(|b| **b != b'{') {
        let what = match b {
            b'[' => "an array",
            b'"' => "a string",
            b'n' => "null",
            b't' | b'f' => "a boolean",
            b'-' | b'0'..=b'9' => "a number",
            _ => "not JSON",
        };
        return Err(ApiError::bad_request(
            "malformed_json",
            format!("request body must be a JSON object ({{...}}), got {what}"),
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        Category::Data => ApiError::unprocessable("invalid_field", e.to_string()),
        Category::Syntax | Category::Eof | Category::Io => ApiError::bad_request(
            "malformed_json",
            format!("request body is not valid JSON: {e}"),
        ),
    })
}

/// A struct field that must be a JSON object, not the array form serde's derive also
/// accepts (each message of a batch). Deserializes `T` from the map only.
pub struct ObjectOnly<T>(pub T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = ObjectOnly<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ObjectOnly)
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// For a field where `null` means "clear it" and absence means "leave it":
/// `#[serde(default, deserialize_with = "nullable")]` on an `Option<Option<T>>`.
pub fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}
