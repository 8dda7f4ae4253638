//! Status conditions the Kubernetes way, written so that a reconcile of an unchanged world
//! produces a byte-identical status. Every status write is a watch event; a status that
//! differs on each pass (a fresh `lastTransitionTime`, sub-second timestamps the API
//! server rounds away) would make the controller patch forever.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// `Time` serializes to whole seconds, so anything finer would never compare equal to
/// what the API server hands back.
pub fn to_time(t: DateTime<Utc>) -> Time {
    Time(Timestamp::from_second(t.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// "True" / "False".
pub fn status_str(ok: bool) -> &'static str {
    if ok { "True" } else { "False" }
}

/// Builds a condition, keeping the previous `lastTransitionTime` when the condition's
/// status did not change (the convention: the time records transitions, not observations).
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: truncate(message.into(), 32 * 1024),
        last_transition_time,
        observed_generation: generation,
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Conditions' messages are capped by the API server at 32 KiB.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let first = condition(&[], "Ready", "True", "Active", "ok", Some(1), &t(100));
        assert_eq!(first.last_transition_time, t(100));
        // same status, new reason and generation: still the old transition time
        let again = condition(
            std::slice::from_ref(&first),
            "Ready",
            "True",
            "Active",
            "ok again",
            Some(2),
            &t(200),
        );
        assert_eq!(again.last_transition_time, t(100));
        assert_eq!(again.observed_generation, Some(2));
        // status flips: a new transition time
        let flipped = condition(&[again], "Ready", "False", "Paused", "p", Some(2), &t(300));
        assert_eq!(flipped.last_transition_time, t(300));
    }

    #[test]
    fn times_are_whole_seconds() {
        let dt = DateTime::parse_from_rfc3339("2026-12-03T10:00:00.987654Z")
            .unwrap()
            .with_timezone(&Utc);
        let time = to_time(dt);
        let json = serde_json::to_string(&time).unwrap();
        assert_eq!(json, "\"2026-12-03T10:00:00Z\"");
        let back: Time = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back, time,
            "a round trip through the API server compares equal"
        );
    }
}

/// Why a declared object's row is not (or no longer) what it declares: the `Ready=False`
/// condition's reason and message (the source and event-type controllers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}
