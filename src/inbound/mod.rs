//! Inbound webhooks: requests from third-party providers (Stripe, GitHub, …), verified by
//! their signatures (`providers`) and taken into the same outbox as produced events, for
//! the tenant of the source they were sent to (`sources`).

pub mod providers;
pub mod sources;
