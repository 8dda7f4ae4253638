//! What a finished attempt means for its delivery: the retry policy's [`Decision`], the
//! outcome written to the row, the attempt log's error fields, the metric label and the
//! circuit breaker's inputs. Pure: no I/O, no clock.

use std::time::Duration;

use rand::Rng;

use super::completer::Finished;
use super::deliver::AttemptReport;
use super::policy::{AttemptResult, Decision, RetryPolicy};
use crate::db::deliveries::{ClaimedDelivery, Completion, DeliveryOutcome};
use crate::domain::ErrorClass;
use crate::metrics::AttemptOutcome;

/// How long a delivery whose signing secret cannot be decrypted waits before it is tried
/// again (by whichever dispatcher claims it: one configured with the key sends it).
const HELD_FOR: Duration = Duration::from_secs(60);

/// The outcome to hand to the completer, and the attempt's metric label.
pub fn classify(
    retry: &RetryPolicy,
    row: &ClaimedDelivery,
    report: AttemptReport,
    rng: &mut impl Rng,
) -> (Finished, AttemptOutcome) {
    let attempt = u32::try_from(row.attempts).unwrap_or(1);
    let policy = retry.for_endpoint(row.retry_schedule_secs.as_deref(), row.max_attempts);
    let decision = policy.decide(attempt, &report.result, rng);
    let (status_code, error_class, error) = error_fields(&report.result);
    // A secret this dispatcher cannot open is its own configuration, not the receiver's
    // answer: nothing was sent, so the attempt is given back and the delivery held.
    let unreadable = matches!(report.result, AttemptResult::Retryable { class, .. } if class == ErrorClass::SecretUnreadable);
    let decision = if unreadable {
        Decision::Retry { delay: HELD_FOR }
    } else {
        decision
    };
    let (status, retry_delay, dead_reason, outcome) = settle(decision, &report.result, unreadable);
    let finished = Finished {
        endpoint_id: row.endpoint_id,
        config_version: row.config_version,
        success: matches!(report.result, AttemptResult::Success { .. }),
        // an unreadable secret is this side's configuration, not the receiver's health
        failure: matches!(report.result, AttemptResult::Retryable { class, .. } if class != ErrorClass::SecretUnreadable),
        gone: matches!(report.result, AttemptResult::Gone),
        ordered: row.ordered,
        completion: Completion {
            delivery_id: row.id,
            claim_token: row.claim_token,
            attempt: row.attempt_seq,
            status,
            retry_delay_ms: retry_delay,
            started_at: report.started_at,
            duration_ms: i32::try_from(report.duration.as_millis()).unwrap_or(i32::MAX),
            status_code,
            error_class,
            error,
            response_snippet: report.snippet,
            dead_reason,
        },
    };
    (finished, outcome)
}

/// The attempt log's status code, error class and error text.
fn error_fields(result: &AttemptResult) -> (Option<i32>, Option<ErrorClass>, Option<String>) {
    match result {
        AttemptResult::Success { status } => (Some(i32::from(*status)), None, None),
        AttemptResult::Gone => (
            Some(410),
            Some(ErrorClass::Gone),
            Some("HTTP 410 Gone".to_string()),
        ),
        AttemptResult::Retryable {
            status,
            class,
            error,
            ..
        } => (status.map(i32::from), Some(*class), Some(error.clone())),
        AttemptResult::Permanent { class, error } => (None, Some(*class), Some(error.clone())),
    }
}

/// The row's outcome, its retry delay in ms, its dead-letter reason and the metric label.
fn settle(
    decision: Decision,
    result: &AttemptResult,
    unreadable: bool,
) -> (DeliveryOutcome, Option<i64>, Option<String>, AttemptOutcome) {
    match decision {
        Decision::Retry { delay } if unreadable => (
            DeliveryOutcome::Held,
            Some(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            None,
            AttemptOutcome::Held,
        ),
        Decision::Succeeded => (
            DeliveryOutcome::Succeeded,
            None,
            None,
            AttemptOutcome::Succeeded,
        ),
        Decision::Retry { delay } => (
            DeliveryOutcome::Retry,
            Some(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            None,
            if matches!(result, AttemptResult::Gone) {
                AttemptOutcome::Gone
            } else {
                AttemptOutcome::Retry
            },
        ),
        Decision::Dead { reason } => (
            DeliveryOutcome::Dead,
            None,
            Some(reason),
            AttemptOutcome::Dead,
        ),
    }
}
