//! The query parameters every listing of the API shares: page size, keyset cursor, and
//! the `consumer` and `status` filters, each refused with its own 422 code.

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use uuid::Uuid;

use super::error::ApiError;
use crate::domain::ErrorCode;
use crate::domain::{self, DeliveryStatus};

/// The query string of a listing, or 422 `invalid_query`.
pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(t)| t)
        .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidQuery, e.body_text()))
}

/// `limit`: 1 to 1000, 100 when absent.
pub(super) fn page_limit(limit: Option<i64>) -> Result<i64, ApiError> {
    let limit = limit.unwrap_or(100);
    if (1..=1000).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::unprocessable(
            ErrorCode::InvalidLimit,
            "limit must be between 1 and 1000",
        ))
    }
}

/// A `consumer` filter of a listing: 422 unless it is a valid uid.
pub(super) fn check_consumer_filter(c: Option<&str>) -> Result<(), ApiError> {
    match c {
        Some(c) => domain::validate_consumer(c)
            .map_err(|e| ApiError::unprocessable(ErrorCode::InvalidConsumer, e)),
        None => Ok(()),
    }
}

/// `cursor`: the id a keyset page continues from, as the previous page returned it.
pub(super) fn uuid_cursor(cursor: Option<&str>) -> Result<Option<Uuid>, ApiError> {
    cursor
        .map(|c| {
            c.parse::<Uuid>().map_err(|_| {
                ApiError::unprocessable(ErrorCode::InvalidCursor, "cursor is not valid")
            })
        })
        .transpose()
}

/// A `?status=` filter: absent, or one of the delivery statuses (else 422).
pub(super) fn parse_status(s: Option<&str>) -> Result<Option<DeliveryStatus>, ApiError> {
    s.map(|s| {
        DeliveryStatus::parse(s).ok_or_else(|| {
            ApiError::unprocessable(
                ErrorCode::InvalidStatus,
                format!(
                    "status {s:?} is not one of {:?}",
                    DeliveryStatus::ALL.map(DeliveryStatus::as_str)
                ),
            )
        })
    })
    .transpose()
}

/// The cursor of the page after `rows`, from its last row, when the page is full; `None`
/// after a shorter page, which is the last.
pub fn next_cursor<T>(rows: &[T], limit: i64, cursor_of: impl Fn(&T) -> String) -> Option<String> {
    if rows.len() as i64 == limit {
        rows.last().map(cursor_of)
    } else {
        None
    }
}
