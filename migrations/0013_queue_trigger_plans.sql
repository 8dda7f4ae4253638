-- The queue-maintenance functions run once per claim, outcome batch and enqueue
-- statement, on arrays whose size changes every call. With the default plan cache mode
-- PL/pgSQL kept building a custom plan for their statements on every call (a generic
-- plan estimates 10 array elements, so it looked dearer than the custom plans of
-- one-element calls): planning was about a fifth of Postgres's CPU in a drain
-- (hookd-bench, perf). Their statements are primary-key and index probes whatever the
-- array holds, so the generic plan is the right one.
ALTER FUNCTION hookd.endpoint_queue_wake(uuid[], timestamptz[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION hookd.endpoint_queue_refresh(uuid[], uuid[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION hookd.deliveries_queue_insert() SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION hookd.deliveries_queue_update() SET plan_cache_mode = force_generic_plan;
