//! Inbound webhooks: requests from third-party providers (Stripe, GitHub, …) verified by
//! their signatures and taken into the same outbox as produced events.

pub mod providers;
