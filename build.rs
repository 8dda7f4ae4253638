// sqlx::migrate!() embeds migrations/ at compile time; without this, a new migration file
// would not rebuild the crate (or its tests) and an incremental build would run stale SQL.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
