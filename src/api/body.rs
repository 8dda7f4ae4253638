//! Request-body handling with JSON errors for every failure: wrong content type (415),
//! too large (413), not JSON (400), JSON of the wrong shape (422).

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
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

pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        Category::Data => ApiError::unprocessable("invalid_field", e.to_string()),
        Category::Syntax | Category::Eof | Category::Io => ApiError::bad_request(
            "malformed_json",
            format!("request body is not valid JSON: {e}"),
        ),
    })
}
