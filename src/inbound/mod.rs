//! Inbound webhooks: requests from third-party providers (Stripe, GitHub, …), verified by
//! their signatures (`providers`) and taken into the same outbox as produced events, for
//! the tenant of the source they were sent to (`sources`). An API process keeps the
//! sources it verifies with while it hears their changes (`cache`) and counts what each
//! source was sent (`tally`).

pub mod cache;
pub mod providers;
pub mod sources;
pub mod tally;
