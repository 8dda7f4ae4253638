//! Request-body handling with JSON errors for every failure: wrong content type (415),
//! too large (413), not JSON (400), JSON of the wrong shape (422).

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use super::error::ApiError;
use crate::domain::ErrorCode;

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
            ErrorCode::UnsupportedMediaType,
            format!(
                "content-type must be application/json, got {:?}",
                if ct.is_empty() { "(none)" } else { ct }
            ),
        ))
    }
}

/// Reads at most `limit` bytes; a larger body is refused without reading it all.
///
/// Each frame is copied into one buffer and let go at once. A frame is a slice of the
/// connection's read buffer and keeps that whole allocation (about 8 KiB) alive while it is
/// held, so collecting the frames, as `axum::body::to_bytes` does, made a body sent a byte
/// at a time cost 8 KiB per write until the request ended: from outside, one connection
/// writing a byte a millisecond held 150 MB within 22 s (the in-flight budgets count
/// Content-Length, not this). Now a body costs at most twice its length.
pub async fn read_limited(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    use futures::StreamExt;
    // Any failure to read reads as too large, as it always has: the client that broke off
    // a body does not see the answer.
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BodyTooLarge,
            format!("request body exceeds {limit} bytes"),
        )
    };
    let mut frames = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(|_| too_large())?;
        if frame.len() > limit - buf.len() {
            return Err(too_large());
        }
        buf.extend_from_slice(&frame);
    }
    Ok(buf.freeze())
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
            ErrorCode::MalformedJson,
            format!("request body must be a JSON object ({{...}}), got {what}"),
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        Category::Data => ApiError::unprocessable(ErrorCode::InvalidField, e.to_string()),
        Category::Syntax | Category::Eof | Category::Io => ApiError::bad_request(
            ErrorCode::MalformedJson,
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

/// A PATCH field that may be absent but not `null` (422 `invalid_field` naming it).
pub fn not_null<T>(field: &str, v: Option<Option<T>>) -> Result<Option<T>, ApiError> {
    match v {
        Some(None) => Err(ApiError::unprocessable(
            ErrorCode::InvalidField,
            format!("{field} cannot be null; leave it out to keep it"),
        )),
        Some(Some(x)) => Ok(Some(x)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use futures::SinkExt;

    use super::*;

    /// A stand-in for hyper's read buffer: an 8 KiB allocation whose slices keep it alive,
    /// counting how many are alive.
    struct ReadBuffer(Arc<AtomicUsize>, Vec<u8>);

    impl ReadBuffer {
        fn one_byte_frame(live: &Arc<AtomicUsize>) -> Bytes {
            live.fetch_add(1, Ordering::SeqCst);
            Bytes::from_owner(ReadBuffer(live.clone(), vec![b'a'; 8192])).slice(0..1)
        }
    }

    impl AsRef<[u8]> for ReadBuffer {
        fn as_ref(&self) -> &[u8] {
            &self.1
        }
    }

    impl Drop for ReadBuffer {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A body written a byte at a time holds none of the read buffers its bytes came in
    /// while it is being read (it held every one before: 8 KiB per write).
    #[tokio::test]
    async fn a_body_read_a_byte_at_a_time_keeps_no_read_buffer() {
        let live = Arc::new(AtomicUsize::new(0));
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(0);
        let read = tokio::spawn(read_limited(Body::from_stream(rx), 1 << 20));
        for _ in 0..200 {
            tx.send(Ok(ReadBuffer::one_byte_frame(&live)))
                .await
                .unwrap();
        }
        // the channel holds at most one frame and the reader at most one more
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let held = live.load(Ordering::SeqCst);
        assert!(
            held <= 2,
            "{held} read buffers of 8 KiB held after 200 one-byte writes"
        );
        drop(tx);
        let body = read.await.unwrap().unwrap();
        assert_eq!(body.len(), 200);
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_413() {
        let err = read_limited(Body::from(vec![b'x'; 11]), 10)
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(err.code.as_str(), "body_too_large");
        let ok = read_limited(Body::from(vec![b'x'; 10]), 10).await.unwrap();
        assert_eq!(ok.len(), 10);
    }
}
