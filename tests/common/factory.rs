//! Queue rows in a chosen state, written straight to the tables: states a test would
//! otherwise wait for (an old terminal row, a live lease of a dead worker, a retry not yet
//! due) are built directly, as River's rescuer and underway's lease tests do. Endpoints
//! still come from the real sync core ([`super::endpoint`]).

use chrono::{DateTime, TimeDelta, Utc};
use hookd::domain::DeliveryStatus;
use sqlx::PgPool;
use uuid::Uuid;

use super::{DEFAULT_TENANT, EndpointOpts, endpoint};

/// A UUIDv7 of `t`, as production stamps a row created at `t` (the keyset listings and
/// the pruner order by it).
pub fn v7_at(t: DateTime<Utc>) -> Uuid {
    let ms = u64::try_from(t.timestamp_millis()).unwrap();
    Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        ms / 1000,
        u32::try_from(ms % 1000).unwrap() * 1_000_000,
    ))
}

/// An event of `tenant` created at `created_at`, with no delivery.
pub async fn event_at(pool: &PgPool, tenant: &str, created_at: DateTime<Utc>) -> Uuid {
    let id = v7_at(created_at);
    sqlx::query(
        "INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, created_at)
         VALUES ($1, $2, 'test.event', '{}', '\\x00'::bytea, $3)",
    )
    .bind(id)
    .bind(tenant)
    .bind(created_at)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// `n` events of `tenant` (type `bulk.event`, no deliveries) in one statement: the bulk
/// of a table for plan tests.
pub async fn bulk_events(pool: &PgPool, tenant: &str, n: i64) {
    sqlx::query(
        "INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
         SELECT gen_random_uuid(), $1, 'bulk.event', '{}', '\\x00'::bytea
         FROM generate_series(1, $2)",
    )
    .bind(tenant)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// What [`delivery`] writes; every field has a default.
#[derive(Debug, Clone)]
pub struct DeliveryOpts {
    pub tenant: String,
    /// None: a new endpoint of `tenant`
    pub endpoint: Option<Uuid>,
    /// None: a new event of `tenant`, created with the delivery
    pub event: Option<Uuid>,
    pub status: DeliveryStatus,
    pub attempts: i32,
    /// the id is a UUIDv7 of this time
    pub created_at: DateTime<Utc>,
    /// None: `created_at`; a terminal delivery completed then
    pub updated_at: Option<DateTime<Utc>>,
    /// None: by status — in_progress: a live lease (now + 60 s); failed: a retry due in
    /// an hour; otherwise `updated_at` (due now, for pending)
    pub visible_at: Option<DateTime<Utc>>,
    /// None: a new worker id for in_progress, no holder otherwise
    pub locked_by: Option<Uuid>,
}

impl Default for DeliveryOpts {
    fn default() -> Self {
        DeliveryOpts {
            tenant: DEFAULT_TENANT.into(),
            endpoint: None,
            event: None,
            status: DeliveryStatus::Pending,
            attempts: 0,
            created_at: Utc::now(),
            updated_at: None,
            visible_at: None,
            locked_by: None,
        }
    }
}

/// The rows [`delivery`] wrote or used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    /// the lease holder, for in_progress
    pub locked_by: Option<Uuid>,
}

/// One delivery in the state `o` describes (with its endpoint and event unless given).
pub async fn delivery(pool: &PgPool, o: DeliveryOpts) -> DeliveryRow {
    let endpoint_id = match o.endpoint {
        Some(id) => id,
        None => {
            endpoint(
                pool,
                EndpointOpts {
                    tenant: Some(o.tenant.clone()),
                    ..Default::default()
                },
            )
            .await
        }
    };
    let event_id = match o.event {
        Some(id) => id,
        None => event_at(pool, &o.tenant, o.created_at).await,
    };
    let updated_at = o.updated_at.unwrap_or(o.created_at);
    let in_progress = o.status == DeliveryStatus::InProgress;
    let visible_at = o.visible_at.unwrap_or(match o.status {
        DeliveryStatus::InProgress => Utc::now() + TimeDelta::seconds(60),
        DeliveryStatus::Failed => Utc::now() + TimeDelta::hours(1),
        _ => updated_at,
    });
    let locked_by = o.locked_by.or(in_progress.then(Uuid::now_v7));
    let terminal = matches!(
        o.status,
        DeliveryStatus::Succeeded | DeliveryStatus::Dead | DeliveryStatus::Cancelled
    );
    let id = v7_at(o.created_at);
    sqlx::query(
        "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts,
             attempt_seq, visible_at, locked_by, created_at, updated_at, completed_at)
         VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9, $10, $11)",
    )
    .bind(id)
    .bind(event_id)
    .bind(endpoint_id)
    .bind(&o.tenant)
    .bind(o.status)
    .bind(o.attempts)
    .bind(visible_at)
    .bind(locked_by)
    .bind(o.created_at)
    .bind(updated_at)
    .bind(terminal.then_some(updated_at))
    .execute(pool)
    .await
    .unwrap();
    DeliveryRow {
        id,
        event_id,
        endpoint_id,
        locked_by,
    }
}

/// `n` attempt rows numbered 1 to `n`, each answered 500.
pub async fn failed_attempts(pool: &PgPool, delivery_id: Uuid, n: i32) {
    sqlx::query(
        "INSERT INTO hookd.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code)
         SELECT $1, g, now(), 5, 500 FROM generate_series(1, $2) g",
    )
    .bind(delivery_id)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}
